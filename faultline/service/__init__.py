"""The attribution service: faultline's HTTP API (`faultline serve`, docs/service.md).

settings    what the operator chose (command-line options), fleet config and ruleset loading
inputs      request bodies -> validated jobs to run (pure)
uploads     safe file names (pure) and writing an upload into a private folder (I/O)
jobs        one diagnosis: inline files through the same pipeline as `faultline diagnose`, or by reference
workers     bounded worker threads with a queue deadline (the event loop never runs a diagnosis)
queries     stored diagnoses from the warehouse (SQL built from constant text, values bound)
errors      the JSON error shape and the exception -> status mapping
middleware  body limit (413), one log line per request, the ruleset version on every response
app         create_app(settings): the FastAPI application wiring the above
"""
