"""The FastAPI application: `create_app(settings)` wires settings, ruleset, workers, routes.

The ruleset is loaded once, here, and kept: a request never pays the load. Diagnoses run in
worker threads (`workers`); warehouse reads run in Starlette's thread pool (sync endpoints).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from contextlib import asynccontextmanager
from datetime import datetime, timezone

import anyio
import anyio.to_thread
from fastapi import FastAPI, Query, Request

from faultline import __version__, taxonomy
from faultline.rules.model import Ruleset
from faultline.service import docs, errors, v2
from faultline.service.auth import Authenticator, load_tokens
from faultline.service.errors import ApiError, JSONBody
from faultline.service.inputs import FORM_FIELDS, BadRequest, InlineJob, RefJob, parse_form, parse_json
from faultline.service.jobs import diagnose_by_reference, diagnose_inline, in_order
from faultline.service.middleware import ServiceMiddleware
from faultline.service.models import (DiagnosesOut, DiagnosisOut, HealthOut, RulesOut, drop_phantom_422,
                                      errors as error_responses)
from faultline.service.queries import SINCE_RANGE, Filters, latest_diagnosis, parse_since, recent_diagnoses
from faultline.service.settings import Settings, load_fleet, load_service_ruleset
from faultline.service.workers import Busy, WorkerPool
from faultline.warehouse.store import WarehouseError

log = logging.getLogger("faultline.service")
JSON_IN_THREAD = 1 << 20  # bodies larger than this are decoded off the event loop, one of `json_slots` at a time
MAX_JSON_DEPTH = 32       # nesting of a JSON body; deeper gives 400
MAX_FORM_FIELD = 1 << 16
LIST_LIMIT_MAX = 1000

_DIAGNOSE_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "job_id": {"type": "string"}, "cluster": {"type": "string"},
                "state": {"type": "string", "enum": list(taxonomy.JOB_STATES)}, "exit_code": {"type": "integer"},
                "files": {"type": "array", "items": {
                    "type": "object", "required": ["name"], "additionalProperties": False,
                    "properties": {"name": {"type": "string"}, "text": {"type": "string"},
                                   "base64": {"type": "string"}}}}}}},
        "multipart/form-data": {"schema": {
            "type": "object",
            "properties": {"files": {"type": "array", "items": {"type": "string", "format": "binary"}},
                           **{k: {"type": "string"} for k in FORM_FIELDS}}}},
    },
}


def rules_summary(ruleset: Ruleset) -> dict:
    """Ruleset version and, per pack, its number of rules (and of lookup rows, e.g. the Xid table)."""
    rules = Counter(r.pack for r in ruleset.rules)
    rows = Counter()
    for r in ruleset.rules:
        if r.lookup:
            rows[r.pack] += len(r.lookup.rows)
    return {"ruleset": {"version": ruleset.version, "packs": list(ruleset.packs)}, "rules": len(ruleset.rules),
            "packs": [{"pack": p, "rules": rules.get(p, 0), "lookup_rows": rows.get(p, 0)} for p in ruleset.packs]}


def create_app(settings: Settings, ruleset: Ruleset | None = None) -> FastAPI:
    """The service. Loads the fleet config (if any) and the ruleset now, once; `ruleset` skips the load
    (tests share one). Raises ConfigError / RulesetError when either is invalid."""
    data_dir, fleet = load_fleet(settings)
    ruleset = ruleset if ruleset is not None else load_service_ruleset(settings, fleet)
    warehouse_dir = fleet.warehouse_dir if fleet is not None else data_dir / "warehouse"
    started = time.monotonic()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.pool = WorkerPool(settings.workers_max, settings.queue_timeout_s)
        log.info("faultline service: ruleset %s (%d rules), %d worker(s), fleet config %s, warehouse %s",
                 ruleset.version, len(ruleset.rules), settings.workers_max,
                 "none (inline diagnosis only)" if fleet is None else fleet.data_dir / "faultline.yaml", warehouse_dir)
        sweeper = anyio.create_task_group()
        async with sweeper:
            sweeper.start_soon(_sweep_forever, app)
            yield
            sweeper.cancel_scope.cancel()
        if getattr(app.state, "sessions", None) is not None:
            app.state.sessions.close()
            app.state.sessions = None

    app = FastAPI(title="faultline", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Attribution service: diagnoses failed distributed AI jobs (docs/service.md).")
    docs.install(app)
    app.state.settings, app.state.ruleset, app.state.fleet = settings, ruleset, fleet
    errors.install(app)

    @app.exception_handler(Busy)
    async def _busy(_: Request, exc: Busy):
        return errors.error_response(503, "busy", f"{exc}; retry later",
                                     {"Retry-After": str(max(1, round(exc.waited_s)))})
    auth = Authenticator(load_tokens(settings.tokens_file))
    app.state.auth = auth
    app.add_middleware(ServiceMiddleware, max_body=settings.max_body_bytes, ruleset_version=ruleset.version,
                       settings=settings, auth=auth)

    def openapi():
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi
            app.openapi_schema = drop_phantom_422(get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes))
        return app.openapi_schema
    app.openapi = openapi

    def pool(request: Request) -> WorkerPool:
        app_state = request.app.state
        if getattr(app_state, "pool", None) is None:  # served without lifespan events
            app_state.pool = WorkerPool(settings.workers_max, settings.queue_timeout_s)
        return app_state.pool

    def json_gate(request: Request) -> JsonGate:
        app_state = request.app.state
        if getattr(app_state, "json_gate", None) is None:
            app_state.json_gate = JsonGate(settings.json_slots, settings.queue_timeout_s)
        return app_state.json_gate

    @app.post("/v1/diagnose", openapi_extra={"requestBody": _DIAGNOSE_BODY}, response_model=DiagnosisOut,
              responses=error_responses(400, 403, 404, 408, 409, 413, 415, 500, 501, 502, 503),
              summary="Diagnose one job: its logs inline, or by reference to a configured cluster")
    async def diagnose(request: Request):
        async with json_gate(request).hold() as gate:
            return await _diagnose(request, gate)

    async def _diagnose(request: Request, gate: JsonGate.Held):
        try:
            job = await read_job(request, settings, gate)
        except BadRequest as exc:
            raise ApiError(400, exc.error, exc.detail) from None
        if isinstance(job, RefJob):
            if fleet is None:
                raise ApiError(501, "fleet_not_configured",
                               "diagnosis by reference needs a fleet config (faultline serve --config); "
                               "send the job's logs in `files` instead")
            fn, args = diagnose_by_reference, (fleet, job, ruleset)
        else:
            fn, args = diagnose_inline, (job, ruleset, settings.tmp_dir, settings.read_limits)
        d, queued, ran = await pool(request).run(fn, *args)
        return JSONBody(d, headers={"Server-Timing": f"queue;dur={queued * 1000:.1f}, diagnose;dur={ran * 1000:.1f}"})

    @app.get("/v1/diagnoses/{cluster}/{job_id:path}", summary="The latest stored diagnosis of one job",
             response_model=DiagnosisOut, responses=error_responses(400, 404, 500))
    def get_diagnosis(cluster: str, job_id: str, attempt: int | None = Query(None, ge=0),
                      ruleset_version: str | None = Query(None, alias="ruleset")):
        try:
            d = latest_diagnosis(warehouse_dir, cluster, job_id, ruleset.version, attempt, ruleset_version)
        except WarehouseError as exc:
            raise ApiError(500, "warehouse_error", str(exc)) from None
        if d is None:
            what = f"job {job_id}" + (f" attempt {attempt}" if attempt is not None else "")
            raise ApiError(404, "diagnosis_not_found", f"no stored diagnosis of {what} on cluster {cluster}"
                           + (f" by ruleset {ruleset_version}" if ruleset_version else ""))
        return JSONBody(in_order(d))

    @app.get("/v1/diagnoses", summary="Recent stored diagnoses, newest job end first",
             response_model=DiagnosesOut, responses=error_responses(400, 500))
    def list_diagnoses(cluster: str | None = None, outcome: str | None = None, since: str | None = None,
                       limit: int = Query(100, ge=1, le=LIST_LIMIT_MAX),
                       ruleset_version: str | None = Query(None, alias="ruleset")):
        if outcome is not None and outcome not in taxonomy.OUTCOMES:
            raise ApiError(400, "invalid_request", f"unknown outcome {outcome!r}; one of {', '.join(taxonomy.OUTCOMES)}")
        try:
            since_t = parse_since(since, datetime.now(timezone.utc)) if since else None
        except (ValueError, OverflowError):
            raise ApiError(400, "invalid_request", f"since={since[:100]!r}: give an ISO date/time between "
                                                   f"{SINCE_RANGE[0]} and {SINCE_RANGE[1]} "
                                                   "(2025-03-03, 2025-03-03T10:00Z) or an age (90s, 30m, 24h, 7d)") from None
        filters = Filters(cluster=cluster, outcome=outcome, since=since_t, ruleset=ruleset_version)
        try:
            rows = recent_diagnoses(warehouse_dir, filters, ruleset.version, limit)
        except WarehouseError as exc:
            raise ApiError(500, "warehouse_error", str(exc)) from None
        return JSONBody({"ruleset": {"version": ruleset.version}, "count": len(rows), "limit": limit,
                         "diagnoses": rows})

    v2.install(app, settings, data_dir, ruleset, pool, json_gate, read_json_body)

    @app.post("/v2/admin/sweep", tags=["admin"], responses=error_responses(401, 403, 503),
              summary="Delete expired sessions now (admin scope)")
    async def sweep(request: Request):
        store = await v2.open_store(request)
        return JSONBody({"deleted": await anyio.to_thread.run_sync(store.sweep)})

    @app.get("/v1/rules", summary="Ruleset version and rules per pack", response_model=RulesOut)
    async def rules():
        return JSONBody(rules_summary(ruleset))

    @app.get("/healthz", summary="Liveness: ok, ruleset version, uptime, workers", response_model=HealthOut)
    async def healthz(request: Request):
        p = pool(request)
        return JSONBody({"status": "ok", "version": __version__, "ruleset": {"version": ruleset.version},
                         "uptime_s": round(time.monotonic() - started, 3),
                         "workers": {"max": p.size, "running": p.running, "waiting": p.waiting},
                         "json_slots": {"max": json_gate(request).size, "held": json_gate(request).held},
                         "fleet_configured": fleet is not None})

    return app


async def _sweep_forever(app: FastAPI) -> None:
    """Expired sessions are deleted every SWEEP_EVERY_S (and on every create)."""
    while True:
        await anyio.sleep(v2.SWEEP_EVERY_S)
        store = getattr(app.state, "sessions", None)
        if store is not None:
            try:
                n = await anyio.to_thread.run_sync(store.sweep)
                if n:
                    log.info("swept %d expired session(s)", n)
            except Exception:
                log.exception("sweeping expired sessions failed")


class JsonGate:
    """At most `size` large JSON bodies are read and decoded at once (memory: size x --max-json-mb x a few);
    a request waits for its turn at most `timeout_s`, then gets 503. Small bodies never wait."""

    def __init__(self, size: int, timeout_s: float):
        self.size, self.timeout_s = size, timeout_s
        self._slots = anyio.Semaphore(size)
        self.held = 0

    class Held:
        def __init__(self, gate: JsonGate):
            self.gate, self.held = gate, False

        async def take(self) -> None:
            if self.held:
                return
            t0 = time.perf_counter()
            try:
                with anyio.fail_after(self.gate.timeout_s):
                    await self.gate._slots.acquire()
            except TimeoutError:
                raise Busy(time.perf_counter() - t0, self.gate.size, "slots for large JSON bodies") from None
            self.held = True
            self.gate.held += 1

    @asynccontextmanager
    async def hold(self):
        held = JsonGate.Held(self)
        try:
            yield held
        finally:
            if held.held:
                self.held -= 1
                self._slots.release()


def json_depth_ok(obj, limit: int = MAX_JSON_DEPTH) -> bool:
    """Nesting of a decoded JSON value is at most `limit` (iterative: never recurses itself)."""
    stack = [(obj, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        if d > limit:
            return False
        stack.extend((x, d + 1) for x in v if isinstance(x, (dict, list)))
    return True


def decode_json(body: bytes):
    try:
        obj = json.loads(body)
    except RecursionError:
        raise BadRequest("invalid_json", f"the JSON body is nested too deeply (at most {MAX_JSON_DEPTH} levels)") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise BadRequest("invalid_json", f"the body is not valid JSON: {str(exc)[:200]}") from None
    if not json_depth_ok(obj):
        raise BadRequest("invalid_json", f"the JSON body is nested too deeply (at most {MAX_JSON_DEPTH} levels)")
    return obj


async def read_json_body(request: Request, settings: Settings, gate: JsonGate.Held | None = None):
    """The body, streamed with a bound (413 past --max-json-mb), then decoded (off the event loop when large).
    A body over JSON_IN_THREAD bytes (declared, or as it arrives) first takes a JSON slot (503 when none frees)."""
    limit = settings.max_json_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "payload_too_large", f"a JSON body may have at most {limit} bytes (--max-json-mb); "
                                                 "send large jobs as multipart/form-data uploads")
    if gate is not None and declared and declared.isdigit() and int(declared) > JSON_IN_THREAD:
        await gate.take()
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, "payload_too_large", f"a JSON body may have at most {limit} bytes (--max-json-mb); "
                                                     "send large jobs as multipart/form-data uploads")
        if gate is not None and len(body) > JSON_IN_THREAD:
            await gate.take()
    if not bytes(body).strip():
        raise BadRequest("invalid_json", "empty body: send a JSON object")
    if len(body) > JSON_IN_THREAD:
        return await anyio.to_thread.run_sync(decode_json, bytes(body))
    return decode_json(bytes(body))


async def read_job(request: Request, settings: Settings, gate: JsonGate.Held | None = None) -> InlineJob | RefJob:
    """The request body (JSON or multipart/form-data) -> the job to run; BadRequest / ApiError on a bad one."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media in ("multipart/form-data", "application/x-www-form-urlencoded"):  # uploads; or form fields only
        form = await request.form(max_files=settings.max_files, max_fields=len(FORM_FIELDS) * 2,
                                  max_part_size=MAX_FORM_FIELD)
        fields: dict[str, str] = {}
        files = []
        for key, value in form.multi_items():
            if isinstance(value, str):
                if key == "files":
                    raise BadRequest("invalid_request", "`files` must be file uploads (curl -F files=@slurm.out)")
                if key in fields:
                    raise BadRequest("invalid_request", f"form field {key!r} is given twice")
                fields[key] = value
            elif key == "files":
                files.append((value.filename, value.file))
            else:
                raise BadRequest("invalid_request", f"a file was sent in field {key!r}; files go in `files`")
        return parse_form(fields, files, settings.max_files)
    if media and media != "application/json" and not media.endswith("+json"):
        raise ApiError(415, "unsupported_media_type",
                       f"{media!r}: send application/json or multipart/form-data (or form fields for by reference)")
    return parse_json(await read_json_body(request, settings, gate), settings.max_files)
