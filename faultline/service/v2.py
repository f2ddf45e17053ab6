"""`/v2/sessions`: the routes over `sessions.SessionStore` (docs/service.md, "Sessions").

Store calls run in threads (DuckDB I/O never on the event loop); attributions run in the diagnosis
workers, as `/v1/diagnose` does, and are bounded the same way (503 past --queue-timeout).
"""

from __future__ import annotations

import logging
from pathlib import Path

import anyio.to_thread
from fastapi import FastAPI, Request, Response
from starlette.background import BackgroundTask

from faultline.service.errors import ApiError, JSONBody
from faultline.service.guard import ActionGuard, Budgets
from faultline.service.webhooks import deliver, emit_prefect_event, secret_from_env
from faultline.service.inputs import BadRequest
from faultline.service.models import (AttributionOut, DeliveriesOut, ObservationAck, SessionOut, VerdictsOut,
                                      errors)
from faultline.service.sessions import (AttributeIn, Limits, SessionError, SessionIn, SessionStore, attribute_session,
                                        validate)
from faultline.service.settings import Settings

log = logging.getLogger("faultline.service")
SWEEP_EVERY_S = 60.0


def store_limits(settings: Settings) -> Limits:
    return Limits(ttl_s=settings.session_ttl_s, max_sessions=settings.max_sessions,
                  max_lines=settings.max_session_lines, max_bytes=int(settings.max_session_mb * (1 << 20)),
                  max_batches=settings.max_session_batches)


async def open_store(request: Request) -> SessionStore:
    """The app's session store, opened on first use (a service that never sees a session writes nothing)."""
    st = request.app.state
    if getattr(st, "sessions", None) is None:
        async with st.sessions_lock:
            if getattr(st, "sessions", None) is None:
                db = st.sessions_db
                try:
                    st.sessions = await anyio.to_thread.run_sync(SessionStore, db, store_limits(st.settings))
                except Exception as exc:  # duckdb.IOException: held by another process, unwritable
                    raise ApiError(503, "sessions_unavailable", f"the session store {db} cannot be opened: "
                                   f"{type(exc).__name__}: {str(exc)[:200]}") from None
    return st.sessions


def token_of(request: Request):
    return getattr(request.state, "token", None)


def owner_of(request: Request, creating: bool = False) -> str | None:
    """Whose sessions a request may see: its token's (an admin token: everyone's); None without auth."""
    token = token_of(request)
    if token is None or (not creating and "admin" in token.scopes):
        return None
    return token.name


def install(app: FastAPI, settings: Settings, data_dir: Path, ruleset, pool, json_gate, read_json_body) -> None:
    secret = secret_from_env(settings)  # ValueError at start-up when a webhook has no secret
    app.state.sessions_db = settings.sessions_db or Path(data_dir) / "service" / "sessions.duckdb"
    app.state.sessions_lock = anyio.Lock()
    store = open_store

    async def body(request: Request, model, required: bool = True):
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media and media != "application/json" and not media.endswith("+json"):
            raise ApiError(415, "unsupported_media_type", f"{media!r}: send application/json")
        async with json_gate(request).hold() as gate:
            if not required:
                raw = b""
                async for chunk in request.stream():
                    raw += chunk
                    if len(raw) > 1 << 16:
                        raise ApiError(413, "payload_too_large", "this body is at most 64 KiB")
                if not raw.strip():
                    return validate(model, {}), {}
                from faultline.service.app import decode_json
                obj = decode_json(raw)
            else:
                obj = await read_json_body(request, settings, gate)
        return (validate(model, obj) if model is not None else None), obj

    async def run(fn, *args):
        try:
            return await anyio.to_thread.run_sync(fn, *args)
        except SessionError as exc:
            raise ApiError(exc.status, exc.error, exc.detail, exc.headers) from None
        except BadRequest as exc:
            raise ApiError(400, exc.error, exc.detail) from None

    @app.post("/v2/sessions", status_code=201, response_model=SessionOut, tags=["sessions"],
              responses=errors(400, 401, 403, 408, 413, 415, 429, 503),
              summary="Create a session for one workload (cluster, job id, attempt, nodes, ranks, window, scheduler state)")
    async def create_session(request: Request):
        try:
            req, _ = await body(request, SessionIn)
        except BadRequest as exc:
            raise ApiError(400, exc.error, exc.detail) from None
        st = await store(request)
        token = token_of(request)
        info = await run(st.create, req, owner_of(request, creating=True), token.max_sessions if token else None)
        return JSONBody(info, status_code=201, headers={"Location": f"/v2/sessions/{info['session_id']}"})

    @app.get("/v2/sessions/{session_id}", response_model=SessionOut, tags=["sessions"],
             responses=errors(401, 403, 404), summary="A session: its workload, evidence so far, batch ids")
    async def get_session(session_id: str, request: Request):
        return JSONBody(await run((await store(request)).info, session_id, owner_of(request)))

    @app.delete("/v2/sessions/{session_id}", status_code=204, tags=["sessions"], responses=errors(401, 403, 404),
                summary="Delete a session and all its evidence")
    async def delete_session(session_id: str, request: Request):
        await run((await store(request)).delete, session_id, owner_of(request))
        return Response(status_code=204)

    @app.post("/v2/sessions/{session_id}/observations", response_model=ObservationAck, tags=["sessions"],
              responses=errors(400, 401, 403, 404, 408, 409, 413, 415, 503),
              summary="Add one batch of observations (log lines, Loki streams, metrics, scheduler state, node events)")
    async def observe(session_id: str, request: Request):
        try:
            _, obj = await body(request, None)
        except BadRequest as exc:
            raise ApiError(400, exc.error, exc.detail) from None
        return JSONBody(await run((await store(request)).add, session_id, obj, owner_of(request)))

    @app.post("/v2/sessions/{session_id}/attribute", response_model=AttributionOut, tags=["sessions"],
              responses=errors(400, 401, 403, 404, 409, 413, 415, 503),
              summary="The verdict for the evidence so far, with coverage saying what is missing")
    async def attribute(session_id: str, request: Request):
        try:
            req, _ = await body(request, AttributeIn, required=False)
        except BadRequest as exc:
            raise ApiError(400, exc.error, exc.detail) from None
        st = await store(request)
        try:
            guard = ActionGuard(st, Budgets(settings.drains_per_cluster_hour, settings.drains_per_job,
                                            settings.drain_max_fraction))
            result, queued, ran = await pool(request).run(attribute_session, st, session_id, ruleset, req.final,
                                                          owner_of(request), 2, guard)
        except SessionError as exc:
            raise ApiError(exc.status, exc.error, exc.detail, exc.headers) from None
        background = None
        if req.final:  # after the answer is sent: the client never waits for a slow webhook
            background = BackgroundTask(anyio.to_thread.run_sync, lambda: announce(st, result))
        return JSONBody(result, background=background,
                        headers={"Server-Timing": f"queue;dur={queued * 1000:.1f}, diagnose;dur={ran * 1000:.1f}"})

    def announce(st: SessionStore, result: dict) -> None:
        if secret is not None:
            deliver(st, settings.webhook_url, secret, result, settings.webhook_retries, settings.webhook_backoff_s)
        emit_prefect_event(result)

    @app.get("/v2/sessions/{session_id}/deliveries", tags=["sessions"], response_model=DeliveriesOut,
             responses=errors(401, 403, 404), summary="Webhook delivery attempts of a session's final verdict")
    async def deliveries(session_id: str, request: Request):
        rows = await run((await store(request)).deliveries, session_id, owner_of(request))
        return JSONBody({"session_id": session_id, "count": len(rows), "deliveries": rows})

    @app.get("/v2/sessions/{session_id}/verdicts", response_model=VerdictsOut, tags=["sessions"],
             responses=errors(401, 403, 404), summary="Every attribution of a session, oldest first")
    async def verdicts(session_id: str, request: Request):
        rows = await run((await store(request)).verdicts, session_id, owner_of(request))
        return JSONBody({"session_id": session_id, "count": len(rows), "verdicts": rows})
