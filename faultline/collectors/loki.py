"""Collector: Loki `query_range` streams -> raw log lines.

The parser reads Loki's documented response (`data.resultType == "streams"`, each stream a
label set and `[["<unix ns>", "<line>"], ...]`). The simulator writes the same JSON, one
response per line, so one parser serves both a live Loki and saved exports.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from faultline.logparse import TS_DTYPE

RAW_SCHEMA = {"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "node": pl.String,
              "source": pl.String, "file": pl.String, "ts": TS_DTYPE, "line": pl.String}


class LokiFormatError(ValueError):
    pass


def streams_to_frame(result: list[dict], cluster: str) -> pl.DataFrame:
    """Loki streams -> one row per line (labels: job_id, attempt, node, source). Per stream, not per line."""
    parts = []
    for stream in result:
        labels = stream.get("stream") or {}
        values = stream.get("values") or []
        if not isinstance(values, list) or not values:
            continue
        frame = pl.DataFrame(values, schema={"ns": pl.String, "line": pl.String}, orient="row")
        node = labels.get("node") or labels.get("host") or labels.get("hostname") or labels.get("instance")
        source = labels.get("source") or ("syslog" if labels.get("job") in ("syslog", "journal", "kernel") else "applog")
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
