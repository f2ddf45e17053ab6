"""Saved metric samples (`metrics: {kind: parquet_files, path}`): `<path>/<cluster>/metrics/<day>.parquet`
files of the metrics table's columns (what `faultline simulate` writes; an export of a DCGM/node exporter
scrape works alike). Per failed job: its nodes' samples from `margin_minutes` before its start to
`tail_minutes` after its end, and one `metrics` coverage row (ok with the row count, empty, or error)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import polars as pl

from faultline.collectors.prometheus import COVERAGE_SCHEMA
from faultline.warehouse.schema import JOB_KEY, TABLES

KEY = ["cluster", "node", "gpu", "name", "labels", "ts"]


def _files(root: Path, cluster: str, first, last) -> list[Path]:
    days = [first + timedelta(days=i) for i in range((last - first).days + 1)]
    return [p for d in days if (p := root / cluster / "metrics" / f"{d.isoformat()}.parquet").is_file()]


def fetch(config: dict, cluster: str, failed: pl.DataFrame, margin_minutes: float = 15,
          tail_minutes: float = 5) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(samples in the metrics table's shape, one `metrics` coverage row per failed job). One scan of the
    days the jobs span, joined to the jobs' (node, window): no loop over jobs."""
    empty = pl.DataFrame(schema=TABLES["metrics"])
    if failed.height == 0:
        return empty, pl.DataFrame(schema=COVERAGE_SCHEMA)
    win = failed.select(*JOB_KEY, node=pl.col("nodes"),
                        lo=pl.coalesce("start_time", "submit_time", "end_time") - timedelta(minutes=margin_minutes),
                        hi=pl.col("end_time") + timedelta(minutes=tail_minutes)).explode("node").drop_nulls("node")
    keys = failed.select(JOB_KEY)
    if win.height == 0 or win["lo"].drop_nulls().is_empty():
        return empty, keys.with_columns(source=pl.lit("metrics"), status=pl.lit("empty"), rows=pl.lit(0, pl.Int64),
                                        reason=pl.lit("the job has no nodes or no start time")).cast(COVERAGE_SCHEMA)
    files = _files(Path(config["path"]), cluster, win["lo"].min().date(), win["hi"].max().date())
    try:
        scan = (pl.scan_parquet([str(f) for f in files]) if files else empty.lazy())
        cols = list(TABLES["metrics"])
        samples = (scan.select(cols).filter(pl.col("node").is_in(win["node"].unique().implode()))
                   .collect().cast(TABLES["metrics"]))
    except (OSError, pl.exceptions.PolarsError) as exc:  # an unreadable export: every job says so
        reason = f"metric files: {type(exc).__name__}: {exc}"[:400]
        return empty, keys.with_columns(source=pl.lit("metrics"), status=pl.lit("error"), rows=pl.lit(0, pl.Int64),
                                        reason=pl.lit(reason)).cast(COVERAGE_SCHEMA)
    hits = (samples.join(win, on="node").filter((pl.col("ts") >= pl.col("lo")) & (pl.col("ts") <= pl.col("hi"))))
    counts = hits.group_by(JOB_KEY).agg(rows=pl.len().cast(pl.Int64))
    cov = (keys.join(counts, on=JOB_KEY, how="left").with_columns(pl.col("rows").fill_null(0))
           .with_columns(source=pl.lit("metrics"),
                         status=pl.when(pl.col("rows") > 0).then(pl.lit("ok")).otherwise(pl.lit("empty")),
                         reason=pl.when(pl.col("rows") > 0).then(pl.lit("metric files"))
                         .otherwise(pl.lit(f"no samples of the job's nodes in {len(files)} metric file(s)"))))
    kept = hits.select(list(TABLES["metrics"])).unique(KEY, keep="first").sort(KEY, nulls_last=True)
    return kept, cov.select(list(COVERAGE_SCHEMA)).cast(COVERAGE_SCHEMA)
