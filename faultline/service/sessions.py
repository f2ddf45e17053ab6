"""Attribution sessions (`/v2/sessions`): evidence about one workload arrives in pieces, in any order,
and is attributed as often as the client asks, through the same engine as `/v1/diagnose`.

A session is created for a workload (cluster, job id, attempt, nodes, ranks, window, scheduler state
if known). Observation batches then arrive any number of times, in any order: log lines (plain lines
with node/rank/source, or Loki `streams`), Prometheus vector/matrix results, scheduler state, node
events. Every batch carries a `batch_id`: a batch that arrives again with the same content is
acknowledged and not stored twice (a retried POST); the same id with other content is a conflict (409).

Order never depends on arrival. Within a log file (stream) lines are ordered by their position: the
batch's `offset` plus the line's index (plain lines), or the Loki timestamp; lines without a position
follow, by `batch_id` then index. So the same batches, sent in any order, give the same verdict.

Everything is kept in one DuckDB file under the data dir (`<data>/service/sessions.duckdb`): sessions
survive a restart, expire `ttl` after their last change (swept on every create and every minute), and
are bounded in count (open sessions), lines, bytes and batches each. Metric samples and node events are
stored even though no rule reads them yet; the coverage of every attribution says what they hold.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import threading
import warnings
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import duckdb
import polars as pl
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from faultline.collectors import files as filecol
from faultline import limits as L
from faultline.collectors.loki import stream_identity
from faultline.logparse import TS_DTYPE
from faultline.rules.model import Ruleset
from faultline.service.engine import YEAR_SAMPLE_BYTES, JobMeta, LineCollector, attribute, file_order, year_of
from faultline.service.inputs import CLUSTER_NAME, JOB_ID, BadRequest
from faultline.service.uploads import BadUpload, safe_name
from faultline.taxonomy import JOB_STATES, SOURCES

MAX_NODES = 20_000
MAX_RANKS = 200_000
MAX_ID = 200
SESSION_ID_PREFIX = "s-"

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (id VARCHAR PRIMARY KEY, owner VARCHAR, cluster VARCHAR, job_id VARCHAR,
  attempt INTEGER, workload VARCHAR, created_at TIMESTAMPTZ, updated_at TIMESTAMPTZ, expires_at TIMESTAMPTZ,
  lines BIGINT, bytes BIGINT, batches INTEGER, final BOOLEAN, samples BIGINT DEFAULT 0);
CREATE TABLE IF NOT EXISTS batches (session_id VARCHAR, batch_id VARCHAR, digest VARCHAR, kinds VARCHAR,
  lines BIGINT, bytes BIGINT, received_at TIMESTAMPTZ, PRIMARY KEY (session_id, batch_id));
CREATE TABLE IF NOT EXISTS lines (session_id VARCHAR, batch_id VARCHAR, file VARCHAR, pos BIGINT, idx INTEGER,
  ts TIMESTAMPTZ, node VARCHAR, rank INTEGER, source VARCHAR, line VARCHAR);
CREATE TABLE IF NOT EXISTS metrics (session_id VARCHAR, batch_id VARCHAR, name VARCHAR, labels VARCHAR,
  node VARCHAR, gpu VARCHAR, ts TIMESTAMPTZ, value DOUBLE);
CREATE TABLE IF NOT EXISTS node_events (session_id VARCHAR, batch_id VARCHAR, node VARCHAR, ts TIMESTAMPTZ,
  kind VARCHAR, reason VARCHAR);
CREATE TABLE IF NOT EXISTS scheduler_obs (session_id VARCHAR, batch_id VARCHAR, observed_at TIMESTAMPTZ,
  state VARCHAR, exit_code INTEGER, start_time TIMESTAMPTZ, end_time TIMESTAMPTZ, nodes VARCHAR);
CREATE TABLE IF NOT EXISTS drains (cluster VARCHAR, job_id VARCHAR, node VARCHAR, session_id VARCHAR,
  action VARCHAR, approved_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS deliveries (session_id VARCHAR, attribution INTEGER, url VARCHAR, attempt INTEGER,
  status INTEGER, error VARCHAR, delivered BOOLEAN, attempted_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS verdicts (session_id VARCHAR, n INTEGER, attributed_at TIMESTAMPTZ, batches INTEGER,
  final BOOLEAN, result VARCHAR, PRIMARY KEY (session_id, n));
"""
TABLES = ("sessions", "batches", "lines", "metrics", "node_events", "scheduler_obs", "verdicts", "deliveries")
LINES_SCHEMA = {"session_id": pl.String, "batch_id": pl.String, "file": pl.String, "pos": pl.Int64, "idx": pl.Int32,
                "ts": TS_DTYPE, "node": pl.String, "rank": pl.Int32, "source": pl.String, "line": pl.String}


class SessionError(Exception):
    def __init__(self, status: int, error: str, detail: str, headers: dict | None = None):
        super().__init__(detail)
        self.status, self.error, self.detail, self.headers = status, error, detail, headers or {}


# ---------------------------------------------------------------- request bodies

def _ts(v: Any) -> datetime | None:
    """An ISO time (UTC when no zone) or epoch seconds -> aware datetime; ValueError when out of range."""
    if v is None:
        return None
    if isinstance(v, bool):
        raise ValueError("a time: ISO 8601 text or epoch seconds")
    if isinstance(v, (int, float)):
        if not math.isfinite(v) or not 0 <= v < 253402300800:
            raise ValueError("epoch seconds between 1970 and 9999")
        return datetime.fromtimestamp(v, timezone.utc)
    if not isinstance(v, str):
        raise ValueError("a time: ISO 8601 text or epoch seconds")
    t = datetime.fromisoformat(v.strip().replace("Z", "+00:00") if v.strip().endswith("Z") else v.strip())
    t = t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t
    try:
        t = t.astimezone(timezone.utc)
    except OverflowError:
        raise ValueError("time out of range") from None
    if not 1970 <= t.year <= 9000:
        raise ValueError("a time between 1970 and 9000")
    return t


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SchedulerIn(_Strict):
    state: str | None = None
    exit_code: int | None = Field(None, ge=-(2**31), le=2**31 - 1)
    start_time: str | float | None = None
    end_time: str | float | None = None
    nodes: list[str] | None = Field(None, max_length=MAX_NODES)
    observed_at: str | float | None = None

    @field_validator("state")
    @classmethod
    def _state(cls, v):
        if v is not None and v.upper() not in JOB_STATES:
            raise ValueError(f"one of {', '.join(JOB_STATES)}")
        return v.upper() if v else v

    @field_validator("start_time", "end_time", "observed_at")
    @classmethod
    def _time(cls, v):
        _ts(v)
        return v


class WindowIn(_Strict):
    start: str | float | None = None
    end: str | float | None = None

    @field_validator("start", "end")
    @classmethod
    def _time(cls, v):
        _ts(v)
        return v


class SessionIn(_Strict):
    cluster: str = "local"
    job_id: str
    attempt: int = Field(0, ge=0, le=1_000_000)
    nodes: list[str] = Field(default_factory=list, max_length=MAX_NODES)
    ranks: list[int] = Field(default_factory=list, max_length=MAX_RANKS)
    window: WindowIn | None = None
    scheduler: SchedulerIn | None = None

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, v):
        if not CLUSTER_NAME.match(v):
            raise ValueError("letters, digits, '.', '_' and '-' (at most 128), starting with a letter or digit")
        return v

    @field_validator("job_id")
    @classmethod
    def _job_id(cls, v):
        if not JOB_ID.match(v) or any(0xD800 <= ord(c) <= 0xDFFF for c in v):
            raise ValueError("1-200 characters, no '/', '\\' or control characters")
        return v

    @field_validator("ranks")
    @classmethod
    def _ranks(cls, v):
        if any(not 0 <= r < 2**31 for r in v):
            raise ValueError("ranks are 0 .. 2^31-1")
        return v


class LogsIn(_Strict):
    file: str | None = Field(None, description="the stream's name, as a file name (node-a/syslog); default <node>/<source>")
    node: str | None = Field(None, max_length=256)
    rank: int | None = Field(None, ge=0, le=2**31 - 1)
    source: Literal["applog", "syslog", "scheduler", "k8s_event"] | None = None
    offset: int | None = Field(None, ge=0, le=2**53, description="index of the first line in its file")
    lines: list[str]


class NodeEventIn(_Strict):
    node: str = Field(max_length=256)
    ts: str | float | None = None
    kind: str = Field(max_length=64)
    reason: str | None = Field(None, max_length=4096)

    @field_validator("ts")
    @classmethod
    def _time(cls, v):
        _ts(v)
        return v


class ObservationsIn(_Strict):
    batch_id: str = Field(min_length=1, max_length=MAX_ID)
    logs: list[LogsIn] = Field(default_factory=list)
    loki: Any = Field(None, description="a Loki query_range response, its `data`, or a list of streams")
    metrics: Any = Field(None, description="a Prometheus query/query_range response or its `data` "
                                           "(vector or matrix), or a list of them")
    scheduler: SchedulerIn | None = None
    node_events: list[NodeEventIn] = Field(default_factory=list)

    @field_validator("batch_id")
    @classmethod
    def _batch(cls, v):
        if any(ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF for c in v):
            raise ValueError("no control characters")
        return v


class AttributeIn(_Strict):
    final: bool = Field(False, description="the last attribution: the session takes no more observations")


def validate(model: type[BaseModel], body: Any) -> BaseModel:
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise BadRequest("invalid_request", "the body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise BadRequest("invalid_request", [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
                                             for e in exc.errors(include_input=False)]) from None


# ---------------------------------------------------------------- observations -> rows

def _streams(loki: Any) -> list[dict]:
    if loki is None:
        return []
    if isinstance(loki, dict) and "data" in loki:
        if loki.get("status") not in (None, "success"):
            raise BadRequest("invalid_request", f"loki: response status {str(loki.get('status'))[:50]!r}")
        loki = loki["data"]
    if isinstance(loki, dict):
        if loki.get("resultType", "streams") != "streams":
            raise BadRequest("invalid_request", f"loki: resultType {str(loki.get('resultType'))[:50]!r}, not 'streams'")
        loki = loki.get("result", loki.get("streams"))
    if not isinstance(loki, list) or not all(isinstance(s, dict) for s in loki):
        raise BadRequest("invalid_request", "loki: give a query_range response, its data, or a list of streams")
    return loki


def _check_name(name: str) -> str:
    try:
        return str(safe_name(name))
    except BadUpload as exc:
        raise BadRequest("invalid_file", str(exc)) from None


def log_rows(obs: ObservationsIn, session_id: str) -> pl.DataFrame:
    rows: dict[str, list] = {k: [] for k in LINES_SCHEMA}

    def put(file, pos, idx, ts, node, rank, source, line):
        for k, v in zip(LINES_SCHEMA, (session_id, obs.batch_id, file, pos, idx, ts, node, rank, source, line)):
            rows[k].append(v)

    for item in obs.logs:
        file = _check_name(item.file or f"{item.node or 'unknown'}/{item.source or 'applog'}")
        for i, line in enumerate(item.lines):
            put(file, None if item.offset is None else item.offset + i, i, None, item.node, item.rank, item.source,
                line.encode("utf-8", "surrogatepass").decode("utf-8", "replace"))
    for s in _streams(obs.loki):
        labels = s.get("stream") or {}
        values = s.get("values") or []
        if not isinstance(labels, dict) or not isinstance(values, list):
            raise BadRequest("invalid_request", "loki: a stream has `stream` labels and `values`")
        node, source = stream_identity({k: str(v) for k, v in labels.items()})
        file = f"loki:{node or '?'}:{source}"
        for i, v in enumerate(values):
            if not (isinstance(v, list) and len(v) >= 2 and isinstance(v[1], str)):
                raise BadRequest("invalid_request", "loki: each value is [\"<unix ns>\", \"<line>\"]")
            try:
                ns = int(v[0])
            except (TypeError, ValueError):
                raise BadRequest("invalid_request", f"loki: timestamp {str(v[0])[:40]!r} is not unix nanoseconds") from None
            if not 0 <= ns < 253402300800 * 10**9:
                raise BadRequest("invalid_request", "loki: timestamp out of range")
            put(file, ns, i, datetime.fromtimestamp(ns // 1000 / 1e6, timezone.utc), node, None, source,
                v[1].encode("utf-8", "surrogatepass").decode("utf-8", "replace"))
    return pl.DataFrame(rows, schema=LINES_SCHEMA)


_NODE_LABELS = ("node", "host", "hostname", "Hostname", "instance")


def metric_rows(obs: ObservationsIn, session_id: str) -> list[tuple]:
    if obs.metrics is None:
        return []
    results = obs.metrics if isinstance(obs.metrics, list) else [obs.metrics]
    out = []
    for r in results:
        if isinstance(r, dict) and "data" in r:
            r = r["data"]
        if not isinstance(r, dict) or r.get("resultType") not in ("vector", "matrix") or not isinstance(r.get("result"), list):
            raise BadRequest("invalid_request", "metrics: give Prometheus `data` with resultType vector or matrix")
        for series in r["result"]:
            labels = series.get("metric") if isinstance(series, dict) else None
            if not isinstance(labels, dict):
                raise BadRequest("invalid_request", "metrics: each result has `metric` labels")
            samples = [series["value"]] if r["resultType"] == "vector" else series.get("values")
            if not isinstance(samples, list):
                raise BadRequest("invalid_request", "metrics: a vector result has `value`, a matrix result `values`")
            labels = {str(k): str(v) for k, v in labels.items()}
            node = next((labels[k] for k in _NODE_LABELS if k in labels), None)
            for smp in samples:
                try:
                    t, val = float(smp[0]), float(smp[1])
                    ts = _ts(t)
                except (TypeError, ValueError, IndexError, KeyError):
                    raise BadRequest("invalid_request", "metrics: each sample is [<unix seconds>, \"<value>\"]") from None
                out.append((session_id, obs.batch_id, labels.get("__name__"), json.dumps(labels, sort_keys=True),
                            node, labels.get("gpu"), ts, val))
    return out


def digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                          .encode("utf-8", "surrogatepass")).hexdigest()


# ---------------------------------------------------------------- the store

@dataclass(frozen=True)
class Limits:
    ttl_s: float = 24 * 3600
    max_sessions: int = 1000
    max_lines: int = L.SESSION_LINES
    max_bytes: int = L.SESSION_MB * L.MIB
    max_batches: int = 10_000


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _iso(t: datetime | None) -> str | None:
    return t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z") if t else None


class SessionStore:
    """One DuckDB file; every write under one lock (DuckDB allows one writer), reads on their own cursor."""

    def __init__(self, path: Path, limits: Limits = Limits()):
        self.path, self.limits = Path(path), limits
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._con = duckdb.connect(str(self.path))
        self._con.execute("SET TimeZone = 'UTC'")
        self._con.execute(SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._con.close()

    def _cur(self):
        cur = self._con.cursor()
        cur.execute("SET TimeZone = 'UTC'").fetchall()
        return cur

    # -- lifecycle

    def sweep(self, now: datetime | None = None) -> int:
        """Delete every expired session and all it holds; the number deleted."""
        now = now or _now()
        with self._lock, self._cur() as cur:
            ids = [r[0] for r in cur.execute("SELECT id FROM sessions WHERE expires_at <= ?", [now]).fetchall()]
            if ids:
                cur.execute("BEGIN")
                for t in TABLES:
                    col = "id" if t == "sessions" else "session_id"
                    cur.execute(f"DELETE FROM {t} WHERE {col} IN (SELECT unnest(?::VARCHAR[]))", [ids])
                cur.execute("COMMIT")
            return len(ids)

    def create(self, req: SessionIn, owner: str | None, max_for_owner: int | None = None) -> dict:
        self.sweep()
        now = _now()
        sid = SESSION_ID_PREFIX + secrets.token_hex(12)
        workload = req.model_dump(mode="json")
        with self._lock, self._cur() as cur:
            open_n = cur.execute("SELECT count(*) FROM sessions").fetchone()[0]
            if open_n >= self.limits.max_sessions:
                raise SessionError(429, "too_many_sessions", f"{open_n} sessions are open, the most this service "
                                   f"keeps (--max-sessions); finish or delete some, or wait for them to expire",
                                   {"Retry-After": "60"})
            if max_for_owner is not None:
                mine = cur.execute("SELECT count(*) FROM sessions WHERE owner IS NOT DISTINCT FROM ? AND NOT final",
                                   [owner]).fetchone()[0]
                if mine >= max_for_owner:
                    raise SessionError(429, "too_many_sessions", f"this token has {mine} open sessions, its limit; "
                                       "attribute one with final=true or delete it", {"Retry-After": "30"})
            cur.execute("INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, 0, false, 0)",
                        [sid, owner, req.cluster, req.job_id, req.attempt, json.dumps(workload), now, now,
                         now + timedelta(seconds=self.limits.ttl_s)])
        return self.info(sid, owner)

    def _row(self, cur, sid: str, owner: str | None, now: datetime | None = None) -> dict:
        r = cur.execute("SELECT id, owner, cluster, job_id, attempt, workload, created_at, updated_at, expires_at, "
                        "lines, bytes, batches, final, samples FROM sessions WHERE id = ?", [sid]).fetchone()
        if r is None or (owner is not None and r[1] is not None and r[1] != owner):
            raise SessionError(404, "session_not_found", f"no session {sid[:100]!r} (never created, deleted, or expired)")
        if r[8] <= (now or _now()):
            raise SessionError(404, "session_not_found", f"session {sid} expired at {_iso(r[8])}")
        keys = ("id", "owner", "cluster", "job_id", "attempt", "workload", "created_at", "updated_at", "expires_at",
                "lines", "bytes", "batches", "final", "samples")
        return dict(zip(keys, r))

    def info(self, sid: str, owner: str | None = None) -> dict:
        with self._cur() as cur:
            r = self._row(cur, sid, owner)
            verdicts = cur.execute("SELECT count(*) FROM verdicts WHERE session_id = ?", [sid]).fetchone()[0]
            batches = [b[0] for b in cur.execute("SELECT batch_id FROM batches WHERE session_id = ? ORDER BY batch_id",
                                                 [sid]).fetchall()]
        return {"session_id": sid, "cluster": r["cluster"], "job_id": r["job_id"], "attempt": r["attempt"],
                "workload": json.loads(r["workload"]), "created_at": _iso(r["created_at"]),
                "updated_at": _iso(r["updated_at"]), "expires_at": _iso(r["expires_at"]), "final": r["final"],
                "evidence": {"batches": r["batches"], "lines": r["lines"], "bytes": r["bytes"]},
                "batch_ids": batches, "attributions": verdicts}

    def delete(self, sid: str, owner: str | None = None) -> None:
        with self._lock, self._cur() as cur:
            self._row(cur, sid, owner)
            cur.execute("BEGIN")
            for t in TABLES:
                cur.execute(f"DELETE FROM {t} WHERE {'id' if t == 'sessions' else 'session_id'} = ?", [sid])
            cur.execute("COMMIT")

    # -- observations

    def add(self, sid: str, body: dict, owner: str | None = None) -> dict:
        obs = validate(ObservationsIn, body)
        lines = log_rows(obs, sid)
        metrics = metric_rows(obs, sid)
        events = [(sid, obs.batch_id, e.node, _ts(e.ts), e.kind, e.reason) for e in obs.node_events]
        sched = obs.scheduler
        n_bytes = int(lines["line"].str.len_bytes().sum() or 0) if lines.height else 0
        kinds = [k for k, present in (("logs", bool(obs.logs)), ("loki", obs.loki is not None),
                                      ("metrics", bool(metrics)), ("scheduler", sched is not None),
                                      ("node_events", bool(events))) if present]
        dig = digest(body)
        now = _now()
        with self._lock, self._cur() as cur:
            s = self._row(cur, sid, owner, now)
            seen = cur.execute("SELECT digest FROM batches WHERE session_id = ? AND batch_id = ?",
                               [sid, obs.batch_id]).fetchone()
            if seen is not None:
                if seen[0] != dig:
                    raise SessionError(409, "batch_conflict", f"batch {obs.batch_id!r} was already received with "
                                       "other content; a retry must repeat the same batch, new evidence needs a new id")
                return {"session_id": sid, "batch_id": obs.batch_id, "stored": False, "duplicate": True,
                        "evidence": {"batches": s["batches"], "lines": s["lines"], "bytes": s["bytes"]}}
            if s["final"]:
                raise SessionError(409, "session_final", f"session {sid} was attributed with final=true; "
                                   "it takes no more observations")
            lim = self.limits
            if s["batches"] + 1 > lim.max_batches:
                raise SessionError(413, "session_too_large", f"a session holds at most {lim.max_batches} batches")
            n_samples = len(metrics) + len(events)
            if s["lines"] + lines.height > lim.max_lines or s["bytes"] + n_bytes > lim.max_bytes:
                raise SessionError(413, "session_too_large", f"a session holds at most {lim.max_lines} lines and "
                                   f"{lim.max_bytes} bytes of log text; it has {s['lines']} lines, {s['bytes']} bytes "
                                   f"and this batch adds {lines.height} lines, {n_bytes} bytes")
            if s["samples"] + n_samples > lim.max_lines:
                raise SessionError(413, "session_too_large", f"a session holds at most {lim.max_lines} metric samples "
                                   f"and node events; it has {s['samples']} and this batch adds {n_samples}")
            cur.execute("BEGIN")
            try:
                if lines.height:
                    cur.register("_batch_lines", lines.to_arrow())
                    cur.execute("INSERT INTO lines SELECT * FROM _batch_lines")
                    cur.unregister("_batch_lines")
                if metrics:
                    cur.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?, ?, ?)", metrics)
                if events:
                    cur.executemany("INSERT INTO node_events VALUES (?, ?, ?, ?, ?, ?)", events)
                if sched is not None:
                    cur.execute("INSERT INTO scheduler_obs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                [sid, obs.batch_id, _ts(sched.observed_at), sched.state, sched.exit_code,
                                 _ts(sched.start_time), _ts(sched.end_time),
                                 None if sched.nodes is None else json.dumps(sched.nodes)])
                cur.execute("INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?)",
                            [sid, obs.batch_id, dig, ",".join(kinds), lines.height, n_bytes, now])
                cur.execute("UPDATE sessions SET lines = lines + ?, bytes = bytes + ?, batches = batches + 1, "
                            "samples = samples + ?, updated_at = ?, expires_at = ? WHERE id = ?",
                            [lines.height, n_bytes, n_samples, now, now + timedelta(seconds=lim.ttl_s), sid])
                cur.execute("COMMIT")
            except Exception:
                cur.execute("ROLLBACK")
                raise
        return {"session_id": sid, "batch_id": obs.batch_id, "stored": True, "duplicate": False,
                "kinds": kinds, "lines": lines.height, "metric_samples": len(metrics), "node_events": len(events),
                "evidence": {"batches": s["batches"] + 1, "lines": s["lines"] + lines.height,
                             "bytes": s["bytes"] + n_bytes}}

    # -- attribution

    def snapshot(self, sid: str, owner: str | None = None) -> Snapshot:
        with self._cur() as cur:
            s = self._row(cur, sid, owner)
            with warnings.catch_warnings():  # "an extra copy of the rows": the price of bound parameters
                warnings.simplefilter("ignore", UserWarning)
                lines = pl.from_arrow(cur.execute(
                    "SELECT file, pos, batch_id, idx, ts, node, rank, source, line FROM lines "
                    "WHERE session_id = ? ORDER BY file, pos NULLS LAST, batch_id, idx", [sid]).to_arrow_table())
            sched = cur.execute("SELECT state, exit_code, start_time, end_time, nodes FROM scheduler_obs "
                                "WHERE session_id = ? ORDER BY observed_at NULLS FIRST, batch_id", [sid]).fetchall()
            metrics = cur.execute("SELECT count(*), count(DISTINCT name), list(DISTINCT node ORDER BY node) "
                                  "FILTER (WHERE node IS NOT NULL) FROM metrics WHERE session_id = ?", [sid]).fetchone()
            events = cur.execute("SELECT count(*), list(DISTINCT kind ORDER BY kind) FROM node_events "
                                 "WHERE session_id = ?", [sid]).fetchone()
            n = cur.execute("SELECT coalesce(max(n), 0) FROM verdicts WHERE session_id = ?", [sid]).fetchone()[0]
        return Snapshot(s, lines, sched, metrics, events, n)

    def record(self, sid: str, n: int, batches: int, final: bool, result: dict) -> None:
        with self._lock, self._cur() as cur:
            cur.execute("BEGIN")
            cur.execute("INSERT INTO verdicts VALUES (?, ?, ?, ?, ?, ?)",
                        [sid, n, _now(), batches, final, json.dumps(result, default=str)])
            if final:
                cur.execute("UPDATE sessions SET final = true WHERE id = ?", [sid])
            cur.execute("COMMIT")

    def spend_drains(self, cluster: str, job_id: str, sid: str, nodes: list[str], action: str, per_hour: int,
                     window: timedelta) -> tuple[bool, int]:
        """Record node actions against the cluster's budget if it allows them all: (allowed, used before).
        Nodes this session was already approved for are free (re-attribution spends nothing)."""
        now = _now()
        with self._lock, self._cur() as cur:
            mine = {r[0] for r in cur.execute("SELECT node FROM drains WHERE session_id = ?", [sid]).fetchall()}
            used = cur.execute("SELECT count(DISTINCT node) FROM drains WHERE cluster = ? AND approved_at > ? "
                               "AND session_id <> ?", [cluster, now - window, sid]).fetchone()[0]
            new = [n for n in nodes if n not in mine]
            if used + len(set(nodes)) > per_hour:
                return False, used
            if new:
                cur.executemany("INSERT INTO drains VALUES (?, ?, ?, ?, ?, ?)",
                                [(cluster, job_id, n, sid, action, now) for n in new])
            return True, used

    def record_delivery(self, sid: str, n: int, url: str, attempt: int, status: int | None, error: str | None,
                        delivered: bool) -> None:
        with self._lock, self._cur() as cur:
            cur.execute("INSERT INTO deliveries VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [sid, n, url, attempt, status, error, delivered, _now()])

    def deliveries(self, sid: str, owner: str | None = None) -> list[dict]:
        with self._cur() as cur:
            self._row(cur, sid, owner)
            rows = cur.execute("SELECT attribution, url, attempt, status, error, delivered, attempted_at FROM deliveries "
                               "WHERE session_id = ? ORDER BY attempted_at, attempt", [sid]).fetchall()
        keys = ("attribution", "url", "attempt", "status", "error", "delivered", "at")
        return [{**dict(zip(keys, r)), "at": _iso(r[6])} for r in rows]

    def verdicts(self, sid: str, owner: str | None = None) -> list[dict]:
        with self._cur() as cur:
            self._row(cur, sid, owner)
            rows = cur.execute("SELECT result FROM verdicts WHERE session_id = ? ORDER BY n", [sid]).fetchall()
        return [json.loads(r[0]) for r in rows]


@dataclass
class Snapshot:
    session: dict
    lines: pl.DataFrame
    scheduler: list[tuple]
    metrics: tuple
    events: tuple
    attributions: int


def job_meta(snap: Snapshot) -> tuple[JobMeta, list[str], bool]:
    """The workload as created, updated by scheduler observations (later observed_at wins, field by field)."""
    w = json.loads(snap.session["workload"])
    sched = w.get("scheduler") or {}
    state, exit_code = sched.get("state"), sched.get("exit_code")
    start, end = _ts(sched.get("start_time")), _ts(sched.get("end_time"))
    nodes = list(w.get("nodes") or sched.get("nodes") or [])
    for st, ec, t0, t1, ns in snap.scheduler:
        state, exit_code = st or state, ec if ec is not None else exit_code
        start, end = t0 or start, t1 or end
        if ns:
            nodes = sorted(set(nodes) | set(json.loads(ns)))
    observed = bool(state)
    meta = JobMeta(cluster=w["cluster"], job_id=w["job_id"], attempt=w.get("attempt", 0), state=state or "UNKNOWN",
                   exit_code=exit_code, start_time=start, end_time=end)
    return meta, nodes, observed


def evidence_of(snap: Snapshot, ruleset: Ruleset):
    """The session's lines -> the engine's Evidence, file by file in `faultline diagnose` order."""
    meta, nodes, _ = job_meta(snap)
    lines = snap.lines
    files = sorted(lines["file"].unique().to_list(), key=file_order) if lines.height else []
    parts = lines.partition_by("file", as_dict=True, maintain_order=True) if lines.height else {}
    samples = []
    for f in files:
        part = parts[(f,)]
        cum = part["line"].str.len_bytes().cum_sum()
        samples.append(part.filter(cum <= YEAR_SAMPLE_BYTES)["line"] if part.height else part["line"])
    w = json.loads(snap.session["workload"])
    fallback = meta.end_time or meta.start_time or _ts((w.get("window") or {}).get("start")) or snap.session["created_at"]
    col = LineCollector(ruleset, meta, year_of(samples, fallback))
    for f in files:
        part = parts[(f,)]
        source, node, rank = filecol.hints(PurePosixPath(f))
        given = part.select(pl.col("source").drop_nulls().first(), pl.col("node").drop_nulls().first(),
                            pl.col("rank").drop_nulls().first()).row(0)
        rep = col.report(f, given[0] or source, given[1] or node, given[2] if given[2] is not None else rank)
        block = part.select("line", _fsource=pl.col("source"), _fnode=pl.coalesce(pl.col("node"), pl.lit(rep.node)),
                            _frank=pl.coalesce(pl.col("rank"), pl.lit(rep.rank, pl.Int32)), _rts=pl.col("ts"))
        col.add(block, rep, 0)
    return col.evidence(), meta, nodes


def coverage_of(snap: Snapshot, d: dict, nodes: list[str], scheduler_known: bool) -> dict:
    """What the attribution saw, and what is still missing, in words a recovery system can log."""
    w = json.loads(snap.session["workload"])
    spoke = set(snap.lines["node"].drop_nulls().unique().to_list()) if snap.lines.height else set()
    seen_nodes = set(d.get("culprit", {}).get("nodes") or []) | set(d.get("affected", {}).get("nodes") or []) | spoke
    seen_ranks = set(d.get("culprit", {}).get("ranks") or []) | set(d.get("affected", {}).get("ranks") or [])
    quiet_nodes = sorted(n for n in nodes if n not in seen_nodes)
    declared_ranks = w.get("ranks") or []
    quiet_ranks = sorted(r for r in declared_ranks if r not in seen_ranks)
    sources = {c["source"]: c["status"] for c in d.get("coverage") or []}
    missing = []
    if not scheduler_known:
        missing.append("scheduler state: unknown (send a `scheduler` observation)")
    for src in SOURCES:
        if src != "scheduler" and sources.get(src) != "ok":
            missing.append(f"{src}: no lines")
    if quiet_nodes:
        missing.append(f"{len(quiet_nodes)} of {len(nodes)} node(s) without log lines: {', '.join(quiet_nodes[:20])}"
                       + (" ..." if len(quiet_nodes) > 20 else ""))
    if quiet_ranks:
        missing.append(f"{len(quiet_ranks)} of {len(declared_ranks)} rank(s) without log lines"
                       + (f": {', '.join(map(str, quiet_ranks[:20]))}" if len(quiet_ranks) <= 20 else ""))
    n_samples, n_names, metric_nodes = snap.metrics
    n_events, kinds = snap.events
    return {"batches": snap.session["batches"], "lines": snap.session["lines"],
            "scheduler": "observed" if scheduler_known else "unknown",
            "sources": sources,
            "nodes_without_logs": quiet_nodes[:1000], "ranks_without_logs": quiet_ranks[:1000],
            "metrics": {"samples": n_samples, "names": n_names, "nodes": (metric_nodes or [])[:1000],
                        "used": False, "note": "stored; no rule reads metrics yet"},
            "node_events": {"events": n_events, "kinds": kinds or [], "used": False,
                            "note": "stored; no rule reads node events yet"},
            "missing": missing}


def attribute_session(store: SessionStore, sid: str, ruleset: Ruleset, final: bool, owner: str | None = None,
                      max_drain: int = 2, guard=None) -> dict:
    """Attribute the evidence so far (runs in a diagnosis worker); the result is kept in the history."""
    snap = store.snapshot(sid, owner)
    if snap.session["final"]:
        raise SessionError(409, "session_final", f"session {sid} already had its final attribution; "
                           "read it from /verdicts")
    ev, meta, nodes = evidence_of(snap, ruleset)
    d = attribute(ev, ruleset, max_drain)
    _, _, known = job_meta(snap)
    n = snap.attributions + 1
    result = {"session_id": sid, "attribution": n, "final": final,
              "coverage": coverage_of(snap, d, nodes, known), "diagnosis": d}
    if guard is not None:
        result["diagnosis"] = {**d, "recommended_action": guard(d, nodes, sid, n, final)}
    store.record(sid, n, snap.session["batches"], final, result)
    return result
