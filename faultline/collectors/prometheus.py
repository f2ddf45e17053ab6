"""Collector: Prometheus, `POST /api/v1/query_range`, over each failed job's nodes and window.

For every job the configured queries (selectors of DCGM exporter and node-exporter series by
default) are asked for the job's nodes over `[start - margin, end + tail]`, the window cut into
chunks of at most `max_points` steps (Prometheus refuses more than 11,000 points per series), the
nodes into groups of `max_nodes_per_query`. Samples land in the `metrics` table shape; a job whose
queries fail gets a `metrics` coverage error with the reason, and the other jobs are still asked.

Retries (tenacity): refused/reset connections, timeouts, 429 and 5xx, with jittered exponential
backoff; a 4xx (a bad query, refused credentials) is reported at once with Prometheus's message.
The HTTP client is injected (`httpx.Client` with `base_url`), so tests and callers choose transport.
"""

from __future__ import annotations

import json
import math
import os
import re
import ssl
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import urlsplit

import httpx
import polars as pl
import tenacity

from faultline.collectors.http import json_answer
from faultline.warehouse.schema import JOB_KEY, TABLES

QUERY_RANGE = "/api/v1/query_range"
MAX_POINTS = 11_000  # Prometheus: "exceeded maximum resolution of 11,000 points per timeseries"

# What a job's nodes are asked for by default: the DCGM exporter's health fields, node-exporter's
# InfiniBand port counters, and whether the node's exporters were up at all.
DEFAULT_QUERIES = (
    "DCGM_FI_DEV_XID_ERRORS",                       # gauge: the last Xid code the GPU raised
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "node_infiniband_link_downed_total", "node_infiniband_symbol_error_total",
    "node_infiniband_port_errors_received_total", "node_infiniband_link_error_recovery_total",
    "up",
)
NODE_MATCHER = "$node_matcher"  # where a query expression wants the job's nodes matched
# Labels that say which GPU a series is about (DCGM exporter: gpu; some relabelings: gpu_index).
GPU_LABELS = ("gpu", "gpu_index")
# Labels that identify a target, not the thing measured: not kept in `labels`.
_DROP_LABELS = {"__name__", "instance", "Hostname", "UUID", "modelName", "DCGM_FI_DRIVER_VERSION",
                "container", "namespace", "pod", "endpoint", "service"}

COVERAGE_SCHEMA = {"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "source": pl.String,
                   "status": pl.String, "rows": pl.Int64, "reason": pl.String}
_NAME = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*$")
_SELECTOR = re.compile(r"^\s*(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{(?P<body>.*)\})?\s*$", re.S)


class PrometheusError(RuntimeError):
    """A query that failed for good (after retries); the message is what coverage records."""


class _Retryable(PrometheusError):
    pass


@dataclass(frozen=True)
class Query:
    name: str        # the metric name samples are stored under
    expr: str        # PromQL with NODE_MATCHER where the job's nodes go
    node_label: str  # the label holding the node's name (a `host:port` instance is cut at the colon)


@dataclass(frozen=True)
class PrometheusSettings:
    """`metrics: {kind: prometheus, ...}` of one cluster, checked."""
    url: str
    queries: tuple[Query, ...] = ()
    node_label: str = "instance"
    headers: dict = field(default_factory=dict)
    bearer_token_env: str | None = None
    ca_file: str | None = None
    step_s: float = 30.0
    max_points: int = MAX_POINTS
    max_nodes_per_query: int = 100
    timeout_s: float = 30.0
    retries: int = 3
    backoff_s: float = 0.5
    max_parallel: int = 4
    tail_minutes: float = 5.0

    @classmethod
    def from_config(cls, section: dict) -> "PrometheusSettings":
        known = set(cls.__dataclass_fields__) | {"kind"}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f"unknown key(s) {unknown}")
        url = section.get("url")
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"url must be an http:// or https:// address of Prometheus, got {url!r}")
        node_label = section.get("node_label", "instance")
        if not isinstance(node_label, str) or not _NAME.match(node_label):
            raise ValueError(f"node_label must be a label name, got {node_label!r}")
        raw_q = section.get("queries", list(DEFAULT_QUERIES))
        if not isinstance(raw_q, list) or not raw_q:
            raise ValueError("queries must be a list of selectors or {name, query, node_label} mappings")
        queries = tuple(_query(q, node_label) for q in raw_q)
        headers = section.get("headers") or {}
        if not isinstance(headers, dict) or any(k.lower() == "authorization" for k in headers):
            raise ValueError("headers must map names to values, and no Authorization header: use bearer_token_env")
        values: dict = {"url": url.rstrip("/"), "queries": queries, "node_label": node_label,
                        "headers": {str(k): str(v) for k, v in headers.items()}}
        for key in ("bearer_token_env", "ca_file"):
            v = section.get(key)
            if v is not None and (not isinstance(v, str) or not v):
                raise ValueError(f"{key} must be a non-empty string")
            values[key] = v
        numbers = {"step_s": (float, 0, True), "max_points": (int, 2, False), "max_nodes_per_query": (int, 1, False),
                   "timeout_s": (float, 0, True), "retries": (int, 0, False), "backoff_s": (float, 0, False),
                   "max_parallel": (int, 1, False), "tail_minutes": (float, 0, False)}
        for key, (kind, low, strict) in numbers.items():
            v = section.get(key, cls.__dataclass_fields__[key].default)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or (kind is int and not float(v).is_integer()) or v < low or (strict and v == low):
                raise ValueError(f"{key} must be {'an integer' if kind is int else 'a number'} "
                                 f"{'>' if strict else '>='} {low}, got {v!r}")
            values[key] = kind(v)
        if values["max_points"] > MAX_POINTS:
            raise ValueError(f"max_points must be at most {MAX_POINTS} (Prometheus refuses more per series)")
        return cls(**values)


def _query(raw, default_label: str) -> Query:
    """A selector (`name` or `name{a="b"}`: the node matcher is added), or a mapping with `name`,
    `query` (any PromQL holding `$node_matcher`) and optionally `node_label`."""
    if isinstance(raw, str):
        m = _SELECTOR.match(raw)
        if not m:
            raise ValueError(f"query {raw!r} is not a selector such as 'DCGM_FI_DEV_XID_ERRORS{{gpu=\"0\"}}'; "
                             f"give {{name, query}} with {NODE_MATCHER} for other PromQL")
        body = (m.group("body") or "").strip().rstrip(",")
        expr = f"{m.group('name')}{{{body + ', ' if body else ''}{NODE_MATCHER}}}"
        return Query(m.group("name"), expr, default_label)
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not isinstance(raw.get("query"), str):
        raise ValueError(f"query {raw!r}: a mapping needs 'name' and 'query'")
    if set(raw) - {"name", "query", "node_label"}:
        raise ValueError(f"query {raw['name']!r}: unknown key(s) {sorted(set(raw) - {'name', 'query', 'node_label'})}")
    if NODE_MATCHER not in raw["query"]:
        raise ValueError(f"query {raw['name']!r} must hold {NODE_MATCHER} where the job's nodes are matched")
    label = raw.get("node_label", default_label)
    if not isinstance(label, str) or not _NAME.match(label):
        raise ValueError(f"query {raw['name']!r}: node_label must be a label name")
    return Query(raw["name"], raw["query"], label)


def node_matcher(label: str, nodes: list[str]) -> str:
    """`instance=~"(?:gpu001|gpu002)(?:[.:].*)?"`: the node itself, its FQDN, or `host:port`."""
    alternation = "|".join(re.escape(n).replace("\\", "\\\\").replace('"', '\\"') for n in sorted(nodes))
    return f'{label}=~"(?:{alternation})(?:[.:].*)?"'


def chunks(start_s: float, end_s: float, step_s: float, max_points: int) -> list[tuple[float, float]]:
    """[start, end] cut into query_range pieces of at most `max_points` evaluation steps each; the pieces
    do not overlap (query_range includes both ends) and together hold every step of the range."""
    out, t = [], start_s
    span = step_s * (max_points - 1)
    while t <= end_s:
        hi = min(end_s, t + span)
        out.append((t, hi))
        t = hi + step_s
    return out


def _reason(r: httpx.Response) -> str:
    try:
        doc = r.json()
        if isinstance(doc, dict) and doc.get("error"):
            return f"{doc.get('errorType', 'error')}: {doc['error']}"[:300]
    except ValueError:
        pass
    return " ".join(r.text.split())[:300] or r.reason_phrase


class PrometheusClient:
    """query_range with retries over an injected httpx.Client (thread-safe: shared by a job pool)."""

    def __init__(self, settings: PrometheusSettings, http: httpx.Client | None = None, env: dict | None = None,
                 sleep=None):
        self.s = settings
        self._own = http is None
        if http is None:
            env = os.environ if env is None else env
            headers = {"Accept": "application/json", **settings.headers}
            if settings.bearer_token_env:
                token = env.get(settings.bearer_token_env)
                if not token:
                    raise PrometheusError(f"environment variable {settings.bearer_token_env} is not set "
                                          f"(named in the cluster's metrics config)")
                headers["Authorization"] = f"Bearer {token}"
            verify = ssl.create_default_context(cafile=settings.ca_file) if settings.ca_file else True
            http = httpx.Client(base_url=settings.url, headers=headers, verify=verify, timeout=settings.timeout_s)
        self.http = http
        self._retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Retryable),
            stop=tenacity.stop_after_attempt(settings.retries + 1),
            wait=tenacity.wait_random_exponential(multiplier=settings.backoff_s, max=30),  # full jitter
            sleep=sleep or tenacity.nap.sleep, reraise=True)

    def close(self) -> None:
        if self._own:
            self.http.close()

    def _once(self, params: dict) -> list[dict]:
        doc = json_answer(lambda: self.http.post(QUERY_RANGE, data=params), self.s.url, self.s.timeout_s,
                          PrometheusError, _Retryable, _reason)
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or doc.get("status") != "success" or not isinstance(data, dict):
            raise PrometheusError(f"response is not a success: {str(doc)[:120]}")
        if data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
            raise PrometheusError(f"response is not a range matrix (resultType {data.get('resultType')!r})")
        return data["result"]

    def query_range(self, expr: str, start_s: float, end_s: float, step_s: float) -> list[dict]:
        params = {"query": expr, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}", "step": f"{step_s:g}"}
        attempts = self.s.retries + 1
        try:
            return self._retrying(self._once, params)
        except _Retryable as exc:
            raise PrometheusError(f"{exc} (gave up after {attempts} attempt{'s' if attempts > 1 else ''})") from None


def _short(host: str) -> str:
    return host.split(":")[0].split(".")[0].lower()


def samples_frame(result: list[dict], query: Query, cluster: str, nodes: list[str]) -> pl.DataFrame:
    """A matrix result -> metrics rows, the node label mapped back onto the job's node names."""
    by_short = {}
    for n in nodes:
        by_short.setdefault(_short(n), []).append(n)
    cols: dict[str, list] = {"node": [], "gpu": [], "ts": [], "value": [], "labels": []}
    for series in result:
        metric, values = series.get("metric"), series.get("values")
        if not isinstance(metric, dict) or not isinstance(values, list):
            raise PrometheusError("malformed series in the matrix (no metric/values)")
        raw_node = str(metric.get(query.node_label, ""))
        node = raw_node if raw_node in nodes else (by_short.get(_short(raw_node)) or [None])[0]
        if node is None:
            continue  # the regex let through a host that is not this job's (gpu1 vs gpu10.x)
        gpu = next((metric[g] for g in GPU_LABELS if g in metric), None)
        labels = json.dumps({k: v for k, v in sorted(metric.items()) if k not in _DROP_LABELS
                             and k not in GPU_LABELS and k != query.node_label}, separators=(",", ":"))
        for pair in values:
            if not isinstance(pair, list) or len(pair) != 2:
                raise PrometheusError("malformed sample in the matrix (not [time, value])")
            cols["node"].append(node)
            cols["gpu"].append(gpu)
            cols["ts"].append(float(pair[0]))
            cols["value"].append(str(pair[1]))
            cols["labels"].append(labels)
    frame = pl.DataFrame(cols, schema={"node": pl.String, "gpu": pl.String, "ts": pl.Float64, "value": pl.String,
                                       "labels": pl.String})
    return frame.select(
        cluster=pl.lit(cluster), node="node", gpu=pl.col("gpu").cast(pl.Int32, strict=False), name=pl.lit(query.name),
        ts=(pl.col("ts") * 1e6).round().cast(pl.Int64).cast(pl.Datetime("us")).dt.replace_time_zone("UTC"),
        value=pl.col("value").cast(pl.Float64, strict=False), labels="labels",
    ).cast(TABLES["metrics"])


@dataclass(frozen=True)
class JobWindow:
    key: dict
    nodes: tuple[str, ...]
    start_s: float
    end_s: float


def plan(failed: pl.DataFrame, s: PrometheusSettings, margin_minutes: float,
         now: datetime | None = None) -> tuple[list[JobWindow], list[dict]]:
    """(jobs to ask for, jobs that cannot be asked: no nodes or no time) for the failed jobs."""
    now = now or datetime.now(timezone.utc)
    rows = failed.select(*JOB_KEY, "nodes",
                         start=pl.coalesce("start_time", "submit_time", "end_time").dt.epoch("ms") / 1000,
                         end=pl.col("end_time").dt.epoch("ms") / 1000).iter_rows(named=True)
    ask, skip = [], []
    for r in rows:
        key = {k: r[k] for k in JOB_KEY}
        if not r["nodes"] or r["start"] is None:
            skip.append({**key, "reason": "the job has no nodes or no start time: nothing to ask for"})
            continue
        step = s.step_s
        start = math.floor((r["start"] - margin_minutes * 60) / step) * step  # aligned: re-runs ask the same
        end = (r["end"] if r["end"] is not None else now.timestamp()) + s.tail_minutes * 60
        ask.append(JobWindow(key, tuple(r["nodes"]), start, end))
    return ask, skip


def fetch_job(client: PrometheusClient, job: JobWindow, cluster: str) -> tuple[pl.DataFrame, str | None, int]:
    """(samples, error, requests) of one job: every query x node group x time chunk. Samples fetched
    before an error are kept; the error says how many requests had succeeded."""
    s, parts, done = client.s, [], 0
    nodes = list(job.nodes)
    groups = [nodes[i:i + s.max_nodes_per_query] for i in range(0, len(nodes), s.max_nodes_per_query)]
    pieces = chunks(job.start_s, job.end_s, s.step_s, s.max_points)
    for q in s.queries:
        for group in groups:
            expr = q.expr.replace(NODE_MATCHER, node_matcher(q.node_label, group))
            for lo, hi in pieces:
                try:
                    result = client.query_range(expr, lo, hi, s.step_s)
                    parts.append(samples_frame(result, q, cluster, group))
                except PrometheusError as exc:
                    frame = pl.concat(parts) if parts else pl.DataFrame(schema=TABLES["metrics"])
                    return frame, f"prometheus: {q.name}: {exc}"[:400], done
                done += 1
    frame = pl.concat(parts) if parts else pl.DataFrame(schema=TABLES["metrics"])
    return frame, None, done


def fetch(metrics_config: dict, cluster: str, failed: pl.DataFrame, margin_minutes: float = 15,
          http: httpx.Client | None = None, env: dict | None = None, sleep=None,
          now: datetime | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(samples in the metrics table's shape, one `metrics` coverage row per failed job)."""
    s = PrometheusSettings.from_config(metrics_config)
    ask, skip = plan(failed, s, margin_minutes, now)
    cov = [{**r, "source": "metrics", "status": "empty", "rows": 0} for r in skip]
    if not ask:
        return pl.DataFrame(schema=TABLES["metrics"]), pl.DataFrame(cov, schema=COVERAGE_SCHEMA)
    try:
        client = PrometheusClient(s, http=http, env=env, sleep=sleep)
    except (PrometheusError, OSError) as exc:  # unset secret, unreadable CA file: every job alike, nothing sent
        cov += [{**j.key, "source": "metrics", "status": "error", "rows": 0, "reason": f"prometheus: {exc}"[:400]}
                for j in ask]
        return pl.DataFrame(schema=TABLES["metrics"]), pl.DataFrame(cov, schema=COVERAGE_SCHEMA)

    def guarded(job: JobWindow):
        try:
            return fetch_job(client, job, cluster)
        except Exception as exc:  # noqa: BLE001 - one job's surprise must not lose the other jobs
            return pl.DataFrame(schema=TABLES["metrics"]), f"prometheus: {type(exc).__name__}: {exc}"[:400], 0

    try:
        with ThreadPoolExecutor(max_workers=min(s.max_parallel, len(ask)), thread_name_prefix="prom") as pool:
            results = list(pool.map(guarded, ask))
    finally:
        client.close()
    frames = []
    for job, (frame, error, done) in zip(ask, results):
        frames.append(frame)
        n = frame.height
        if error:
            cov.append({**job.key, "source": "metrics", "status": "error", "rows": n,
                        "reason": error + (f" ({n} samples from {done} earlier requests kept)" if n else "")})
        else:
            cov.append({**job.key, "source": "metrics", "status": "ok" if n else "empty", "rows": n,
                        "reason": "" if n else f"no samples for the job's nodes from {done} requests"})
    samples = pl.concat(frames).unique(subset=list(KEY_COLS), keep="first", maintain_order=True)
    return samples, pl.DataFrame(cov, schema=COVERAGE_SCHEMA)


KEY_COLS = ("cluster", "node", "gpu", "name", "labels", "ts")
