"""Collector: Loki `query_range` streams -> raw log lines. The pure half: wire format, LogQL, paging.

The parser reads Loki's documented response (`data.resultType == "streams"`, each stream a
label set and `[["<unix ns>", "<line>"], ...]`). The simulator writes the same JSON, one
response per line, so one parser serves both a live Loki and saved exports. The HTTP client
(retries, auth, the paging loop) is `faultline.collectors.loki_http`; everything here is pure.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import polars as pl

from faultline.logparse import TS_DTYPE

RAW_SCHEMA = {"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "node": pl.String,
              "source": pl.String, "file": pl.String, "ts": TS_DTYPE, "line": pl.String}


class LokiFormatError(ValueError):
    pass


SYSLOG_JOBS = ("syslog", "journal", "kernel")


def stream_identity(labels: dict, node_label: str | None = None, source_label: str | None = None) -> tuple:
    """(node, source) of a stream from its labels. Without configured label names, the usual ones
    (node/host/hostname/instance; `source`, else a syslog-ish `job` label means syslog)."""
    if node_label:
        node = labels.get(node_label)
    else:
        node = labels.get("node") or labels.get("host") or labels.get("hostname") or labels.get("instance")
    if source_label:  # an operator's own label: its values are theirs, so only syslog-ish ones mean syslog
        value = str(labels.get(source_label) or "")
        source = "syslog" if value in ("syslog", "dmesg", *SYSLOG_JOBS) else "applog"
    else:
        source = labels.get("source") or ("syslog" if labels.get("job") in SYSLOG_JOBS else "applog")
    return node, source


def streams_to_frame(result: list[dict], cluster: str) -> pl.DataFrame:
    """Loki streams -> one row per line (labels: job_id, attempt, node, source). Per stream, not per line."""
    parts = []
    for stream in result:
        labels = stream.get("stream") or {}
        values = stream.get("values") or []
        if not isinstance(values, list) or not values:
            continue
        frame = pl.DataFrame(values, schema={"ns": pl.String, "line": pl.String}, orient="row")
        node, source = stream_identity(labels)
        parts.append(frame.select(
            cluster=pl.lit(labels.get("cluster") or cluster), job_id=pl.lit(labels.get("job_id")),
            attempt=pl.lit(int(labels.get("attempt") or 0), pl.Int32), node=pl.lit(node),
            source=pl.lit(source), file=pl.lit(f"loki:{node}:{source}"),
            ts=pl.from_epoch(pl.col("ns").cast(pl.Int64, strict=False) // 1000, time_unit="us")
            .dt.replace_time_zone("UTC"),
            line="line"))
    return pl.concat(parts) if parts else pl.DataFrame(schema=RAW_SCHEMA)


def parse_response(payload: dict, cluster: str) -> pl.DataFrame:
    if not isinstance(payload, dict) or payload.get("status") != "success":
        raise LokiFormatError(f"Loki answered status {payload.get('status') if isinstance(payload, dict) else '?'}")
    data = payload.get("data") or {}
    if data.get("resultType") != "streams":
        raise LokiFormatError(f"expected resultType 'streams', got {data.get('resultType')!r}")
    return streams_to_frame(data.get("result") or [], cluster)


# Labels read from saved responses; any other label is ignored. A real Loki's label set varies,
# so the live path (`parse_response`) reads whatever labels a stream has.
EXPORT_LABELS = ("cluster", "job_id", "attempt", "node", "host", "hostname", "instance", "source", "job")
_EXPORT_SCHEMA = {"status": pl.String, "data": pl.Struct({"resultType": pl.String, "result": pl.List(pl.Struct({
    "stream": pl.Struct({k: pl.String for k in EXPORT_LABELS}), "values": pl.List(pl.List(pl.String))}))})}


def read_export(path: Path, cluster: str, job_ids: set[str] | None = None) -> pl.DataFrame:
    """A file of query_range responses, one JSON object per line, read by Polars in one pass
    (no Python object per line); streams of other jobs are dropped before their lines unfold."""
    try:
        doc = pl.read_ndjson(path, schema=_EXPORT_SCHEMA)
    except pl.exceptions.ComputeError as exc:
        raise LokiFormatError(f"{path}: not Loki query_range JSON lines ({str(exc).splitlines()[0][:200]})") from None
    bad = doc.filter((pl.col("status") != "success")
                     | (pl.col("data").struct.field("resultType") != "streams")).height
    if bad:
        raise LokiFormatError(f"{path}: {bad} response(s) are not successful 'streams' results")
    streams = (doc.select(pl.col("data").struct.field("result")).explode("result").drop_nulls("result")
               .unnest("result").unnest("stream"))
    if job_ids is not None:
        streams = streams.filter(pl.col("job_id").is_in(sorted(job_ids)))
    node = pl.coalesce("node", "host", "hostname", "instance")
    source = pl.coalesce("source", pl.when(pl.col("job").is_in(["syslog", "journal", "kernel"])).then(pl.lit("syslog")),
                         pl.lit("applog"))
    lines = streams.with_columns(node=node, source=source).explode("values").drop_nulls("values")
    return lines.select(
        cluster=pl.coalesce("cluster", pl.lit(cluster)), job_id="job_id",
        attempt=pl.col("attempt").cast(pl.Int32, strict=False).fill_null(0), node="node", source="source",
        file=pl.format("loki:{}:{}", pl.col("node").fill_null("?"), pl.col("source")),
        ts=pl.from_epoch(pl.col("values").list.get(0).cast(pl.Int64, strict=False) // 1000, time_unit="us")
        .dt.replace_time_zone("UTC"),
        line=pl.col("values").list.get(1),
    ).cast(RAW_SCHEMA)


def with_sequence(raw: pl.DataFrame) -> pl.DataFrame:
    """Number lines within each (job, file) in time order, as a file's line numbers would be."""
    return (raw.with_row_index("_i").sort(["cluster", "job_id", "attempt", "file", "ts", "_i"])
            .with_columns(seq=pl.int_range(pl.len()).over(["cluster", "job_id", "attempt", "file"]).cast(pl.Int64))
            .drop("_i"))


# ------------------------------------------------------------------ live Loki: settings, LogQL, pages

DEFAULT_QUERY = '{cluster="{cluster}", job_id="{job_id}"}'
# What a query template may name: the job's own fields, and its nodes as an anchored regex alternation
# (for node-level streams such as syslog/journal that carry a host label but no job id).
QUERY_FIELDS = ("cluster", "job_id", "attempt", "name", "user", "queue", "nodes_regex")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# number settings: (type, lowest value, whether the lowest value itself is excluded)
_NUMBERS = {"timeout_s": (float, 0, True), "max_lines_per_job": (int, 1, False), "page_limit": (int, 1, False),
            "retries": (int, 0, False), "backoff_s": (float, 0, False), "max_parallel": (int, 1, False),
            "tail_minutes": (float, 0, False)}


@dataclass(frozen=True)
class LokiSettings:
    """`logs: {kind: loki, ...}` of one cluster, checked. Secrets are never here: only the names of the
    environment variables that hold them, read when a client is made."""
    url: str
    queries: tuple[str, ...] = (DEFAULT_QUERY,)
    headers: dict = field(default_factory=dict)
    bearer_token_env: str | None = None
    username: str | None = None
    username_env: str | None = None
    password_env: str | None = None
    ca_file: str | None = None
    timeout_s: float = 30.0
    max_lines_per_job: int = 2_000_000
    page_limit: int = 5000          # Loki's max_entries_limit_per_query default; a larger limit is a 400
    retries: int = 3
    backoff_s: float = 0.5
    max_parallel: int = 4
    tail_minutes: float = 5.0       # after the job's end: teardown lines, late kernel messages
    node_label: str | None = None
    source_label: str | None = None

    @classmethod
    def from_config(cls, section: dict) -> "LokiSettings":
        """Checked settings, or ValueError saying what is wrong (the caller adds where)."""
        known = {f for f in cls.__dataclass_fields__ if f != "queries"} | {"kind", "query"}
        unknown = sorted(set(section) - known)
        if unknown:
            hint = ("; secrets go in environment variables: use bearer_token_env / username_env / password_env"
                    if any(k in ("token", "bearer_token", "password", "api_key") for k in unknown) else "")
            raise ValueError(f"unknown key(s) {unknown}{hint}")
        url = section.get("url")
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"url must be an http:// or https:// address of Loki, got {url!r}")
        raw_q = section.get("query", DEFAULT_QUERY)
        queries = (raw_q,) if isinstance(raw_q, str) else tuple(raw_q) if isinstance(raw_q, list) else None
        if not queries or not all(isinstance(q, str) for q in queries):
            raise ValueError("query must be a LogQL template or a list of them")
        for q in queries:
            check_query_template(q)
        headers = section.get("headers") or {}
        if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, (str, int))
                                                    for k, v in headers.items()):
            raise ValueError("headers must map header names to string values")
        if any(k.lower() == "authorization" for k in headers):
            raise ValueError("no Authorization header in the config: use bearer_token_env or username/password_env")
        values = {"url": url.rstrip("/"), "queries": queries, "headers": {k: str(v) for k, v in headers.items()}}
        for key in ("bearer_token_env", "username", "username_env", "password_env", "ca_file", "node_label",
                    "source_label"):
            v = section.get(key)
            if key == "username" and isinstance(v, int) and not isinstance(v, bool):
                v = str(v)  # Grafana Cloud user names are numbers, and YAML reads them as such
            if v is not None and (not isinstance(v, str) or not v):
                raise ValueError(f"{key} must be a non-empty string")
            values[key] = v
        if bool(values["password_env"]) != bool(values["username"] or values["username_env"]):
            raise ValueError("basic auth needs both username (or username_env) and password_env")
        if values["bearer_token_env"] and values["password_env"]:
            raise ValueError("use either bearer_token_env or basic auth, not both")
        for key, (kind, low, strict) in _NUMBERS.items():
            v = section.get(key, cls.__dataclass_fields__[key].default)
            number = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not number or (kind is int and not float(v).is_integer()) or v < low or (strict and v == low):
                what = f"{'an integer' if kind is int else 'a number'} {'>' if strict else '>='} {low}"
                raise ValueError(f"{key} must be {what}, got {v!r}")
            values[key] = kind(v)
        return cls(**values)


def check_query_template(template: str) -> None:
    """A template must select streams (`{...}`) and name only fields a job has."""
    bad = sorted({m for m in _PLACEHOLDER.findall(template) if m not in QUERY_FIELDS})
    if bad:
        raise ValueError(f"query {template!r} names unknown field(s) {bad}; known: {list(QUERY_FIELDS)}")
    rendered = render_query(template, dict.fromkeys(QUERY_FIELDS, "x"))
    if not re.match(r'\s*\{\s*[A-Za-z_][A-Za-z0-9_]*\s*(=|!=|=~|!~)\s*["`]', rendered):
        raise ValueError(f"query {template!r} does not start with a stream selector such as "
                         f"{DEFAULT_QUERY!r}")


def logql_string(value: str) -> str:
    """`value` escaped for the inside of a double-quoted LogQL string (Go string syntax), so a job id with
    quotes or backslashes selects exactly itself instead of breaking or widening the selector."""
    out = value.replace("\\", "\\\\").replace('"', '\\"')
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\u{ord(m.group()):04x}", out)


def re2_literal(value: str) -> str:
    """`value` as an RE2 regex matching only itself (Loki's =~ is RE2, fully anchored)."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", value)


def render_query(template: str, fields: dict[str, str]) -> str:
    """The template with each {field} replaced by the job's value, escaped as LogQL string content."""
    return _PLACEHOLDER.sub(lambda m: logql_string(fields[m.group(1)]) if m.group(1) in fields else m.group(0),
                            template)


def query_fields(job: dict) -> dict[str, str]:
    nodes = [n for n in (job.get("nodes") or []) if n]
    return {"cluster": str(job["cluster"]), "job_id": str(job["job_id"]), "attempt": str(job["attempt"]),
            "name": str(job.get("name") or ""), "user": str(job.get("user") or ""),
            "queue": str(job.get("queue") or ""), "nodes_regex": "|".join(re2_literal(n) for n in nodes)}


def stream_key(labels: dict) -> str:
    return json.dumps(labels, sort_keys=True, separators=(",", ":"))


PAGE_SCHEMA = {"stream": pl.String, "ns": pl.Int64, "line": pl.String}


def page_frame(payload, labels_by_key: dict[str, dict]) -> pl.DataFrame:
    """One query_range response -> rows (stream key, ns, line), per stream not per line; each stream's
    labels are kept in `labels_by_key`. Raises LokiFormatError on anything but a successful streams result."""
    if not isinstance(payload, dict) or payload.get("status") != "success":
        status = payload.get("status") if isinstance(payload, dict) else type(payload).__name__
        raise LokiFormatError(f"response status is {status!r}, not 'success'")
    data = payload.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "streams":
        got = data.get("resultType") if isinstance(data, dict) else None
        raise LokiFormatError(f"expected resultType 'streams', got {got!r} (is the query a log query?)")
    result = data.get("result")
    if not isinstance(result, list):
        raise LokiFormatError("data.result is not a list")
    parts = []
    for stream in result:
        labels = stream.get("stream") if isinstance(stream, dict) else None
        values = stream.get("values") if isinstance(stream, dict) else None
        if not isinstance(labels, dict) or not isinstance(values, list):
            raise LokiFormatError("a stream without 'stream' labels or 'values'")
        if not values:
            continue
        key = stream_key(labels)
        labels_by_key.setdefault(key, labels)
        try:
            frame = pl.DataFrame(values, schema={"ns": pl.String, "line": pl.String}, orient="row")
            parts.append(frame.select(stream=pl.lit(key), ns=pl.col("ns").cast(pl.Int64), line="line"))
        except (pl.exceptions.PolarsError, TypeError, ValueError) as exc:
            raise LokiFormatError(f"stream values are not [\"<ns>\", \"<line>\"] pairs: {str(exc)[:120]}") from None
    return pl.concat(parts) if parts else pl.DataFrame(schema=PAGE_SCHEMA)


def new_entries(page: pl.DataFrame, boundary: pl.DataFrame | None) -> pl.DataFrame:
    """The page minus what the previous page already returned. A forward page starts AT the previous page's
    last timestamp (Loki allows many lines at one nanosecond, and a page may have ended among them), so it
    repeats the lines at that instant the previous page had: drop exactly those, matched by stream and line
    and counted (unlike logcli, which matches the line alone and so drops equal lines of other streams)."""
    if boundary is None or boundary.height == 0:
        return page
    nth = pl.int_range(pl.len()).over(["stream", "ns", "line"]).alias("_nth")
    return (page.with_columns(nth).join(boundary.with_columns(nth), on=["stream", "ns", "line", "_nth"], how="anti")
            .drop("_nth"))


def lines_to_raw(lines: pl.DataFrame, labels_by_key: dict[str, dict], job: dict,
                 node_label: str | None = None, source_label: str | None = None) -> pl.DataFrame:
    """Rows (stream, ns, line) fetched for one job -> RAW_SCHEMA, keyed by the job that was asked for (a live
    Loki's labels need not name the job the way the warehouse does). A stream whose `attempt` label names
    another attempt of the same job id is dropped: its lines belong to that attempt."""
    if lines.height == 0:
        return pl.DataFrame(schema=RAW_SCHEMA)
    rows = []
    for key, labels in labels_by_key.items():  # per stream
        node, source = stream_identity(labels, node_label, source_label)
        attempt = str(labels.get("attempt", "")).strip()
        other = attempt.isdigit() and int(attempt) != int(job["attempt"])
        rows.append({"stream": key, "node": node, "source": source, "other_attempt": other})
    ident = pl.DataFrame(rows, schema={"stream": pl.String, "node": pl.String, "source": pl.String,
                                       "other_attempt": pl.Boolean})
    out = lines.join(ident, on="stream", how="left", maintain_order="left").filter(~pl.col("other_attempt"))
    return out.select(
        cluster=pl.lit(job["cluster"], pl.String), job_id=pl.lit(job["job_id"], pl.String),
        attempt=pl.lit(job["attempt"], pl.Int32), node="node", source="source",
        file=pl.format("loki:{}:{}", pl.col("node").fill_null("?"), pl.col("source")),
        ts=pl.from_epoch(pl.col("ns") // 1000, time_unit="us").dt.replace_time_zone("UTC"),
        line="line").cast(RAW_SCHEMA)
