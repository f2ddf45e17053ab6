"""The attribution service: faultline's HTTP API (`faultline serve`, docs/service.md).

settings    what the operator chose (command-line options), fleet config and ruleset loading
inputs      request bodies -> validated jobs to run (pure)
uploads     safe file names (pure) and writing an upload into a private folder (I/O)
jobs        one diagnosis: inline files through the same pipeline as `faultline diagnose`, or by reference
workers     bounded worker threads with a queue deadline (the event loop never runs a diagnosis)
queries     stored diagnoses from the warehouse (SQL built from constant text, values bound)
errors      the JSON error shape and the exception -> status mapping
middleware  Host allow-list, cross-site refusal, auth, body limit (413) and timeouts (408), one log and one
            audit line per request, the ruleset version on every response
engine      the collect step over line frames (files or session lines) -> Evidence -> the engine's phases
sessions    /v2 sessions: observation batches in DuckDB, attribution, coverage of what is missing
v2          the /v2/sessions routes
guard       the action guard: human_review unless unambiguous, high confidence and within drain budgets
webhooks    signed verdict callbacks with retries, and the Prefect event
auth        bearer tokens (hashes, scopes, rates)
server      uvicorn with head timeouts, keep-alive, connection limit, TLS
docs        /docs and /redoc from local assets
models      response models of the OpenAPI schema
app         create_app(settings): the FastAPI application wiring the above
"""
