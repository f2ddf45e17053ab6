"""Prefect tasks: each reads and writes the warehouse for one partition (cluster x window or day).

Tasks take and return small values (names, times, counts); the data stays in the warehouse.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import polars as pl
from prefect import task

from faultline.fleet.collect import collect_cluster, with_job_date
from faultline.fleet.config import load_config
from faultline.fleet.diagnose import diagnose_tables, verdict_changes
from faultline.rules.loader import load_ruleset
from faultline.taxonomy import FAILED_STATES
from faultline.warehouse.schema import JOB_KEY
from faultline.warehouse.store import Warehouse


def _stamp(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%S")


def ruleset_for(data_dir: str, rules: list[str] | None = None, builtin: bool = True):
    cfg = load_config(Path(data_dir))
    return load_ruleset([Path(p) for p in (rules if rules is not None else cfg.extra_rules)], builtin=builtin)


def partitions(start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
    """[start, end) cut at UTC midnights: one piece per day partition."""
    out, t = [], start
    while t < end:
        midnight = datetime.combine(t.date() + timedelta(days=1), datetime.min.time(), tzinfo=timezone.utc)
        out.append((t, min(end, midnight)))
        t = min(end, midnight)
    return out


@task(name="collect-partition", retries=2, retry_delay_seconds=5)
def collect_partition(data_dir: str, cluster: str, start: datetime, end: datetime) -> dict:
    cfg = load_config(Path(data_dir))
    ccfg = next(c for c in cfg.clusters if c.name == cluster)
    got = collect_cluster(ccfg, start, end, cfg.margin_minutes)
    wh = Warehouse(cfg.warehouse_dir)
    batch = f"collect-{cluster}-{_stamp(start)}-{_stamp(end)}"
    jobs = got.jobs.with_columns(date=pl.col("end_time").dt.date())
    counts = {
        "jobs": wh.write("jobs", jobs, batch),
        "allocations": wh.write("allocations", with_job_date(got.allocations, got.jobs), batch),
        "logs": wh.write("logs", with_job_date(got.logs, got.jobs), batch),
        "coverage": wh.write("coverage", with_job_date(got.coverage, got.jobs), batch),
    }
    if got.metrics is not None and got.metrics.height:  # partitioned by the sample's own day
        counts["metrics"] = wh.write("metrics", got.metrics.with_columns(date=pl.col("ts").dt.date()), batch)
    if got.node_events is not None and got.node_events.height:  # by the event's day
        events = got.node_events.filter(pl.col("ts").is_not_null())
        counts["node_events"] = wh.write("node_events", events.with_columns(date=pl.col("ts").dt.date()), batch)
    failed = int(got.jobs.filter(pl.col("state").is_in(list(FAILED_STATES))).height)
    return {"cluster": cluster, "start": start.isoformat(), "failed": failed, "errors": got.errors, **counts}


@task(name="diagnose-partition", retries=1, retry_delay_seconds=5)
def diagnose_partition(data_dir: str, cluster: str, start: datetime, end: datetime,
                       rules: list[str] | None = None, builtin: bool = True) -> dict:
    """Every failed job of one cluster that ended in [start, end) (inside one UTC day)."""
    cfg = load_config(Path(data_dir))
    ruleset = ruleset_for(data_dir, rules, builtin)
    wh = Warehouse(cfg.warehouse_dir)
    day = start.date()
    jobs = wh.read_window("jobs", day, day, [cluster], where="end_time >= ? AND end_time < ?", params=[start, end])
    failed = jobs.filter(pl.col("state").is_in(list(FAILED_STATES)))
    if failed.height == 0:
        return {"cluster": cluster, "day": day.isoformat(), "diagnosed": 0, "ruleset": ruleset.version}
    logs = wh.read_window("logs", day, day, [cluster]).join(failed.select(JOB_KEY), on=JOB_KEY, how="semi")
    coverage = wh.read_window("coverage", day, day, [cluster])
    # A job that ended today may have started days ago: its samples lie in those days' partitions.
    first = failed["start_time"].min() or start
    nodes = failed["nodes"].explode().drop_nulls().unique().to_list()
    metrics = (wh.read_window("metrics", first.date() - timedelta(days=1), day, [cluster])
               .filter(pl.col("node").is_in(nodes)))
    diagnoses, symptoms = diagnose_tables(failed, logs, coverage, ruleset, cfg.max_drain, metrics=metrics)
    batch = f"diagnose-{ruleset.version}-{cluster}-{_stamp(start)}-{_stamp(end)}"
    dated = lambda f: f.join(failed.select(*JOB_KEY, date=pl.col("end_time").dt.date()), on=JOB_KEY)  # noqa: E731
    wh.write("diagnoses", dated(diagnoses), batch)
    wh.write("symptoms", dated(symptoms), batch)
    return {"cluster": cluster, "day": day.isoformat(), "diagnosed": diagnoses.height, "ruleset": ruleset.version,
            "outcomes": dict(diagnoses.group_by("outcome").len().sort("outcome").iter_rows())}


@task(name="load-diagnoses")
def load_diagnoses(data_dir: str, start: date, end: date, ruleset: str | None = None) -> pl.DataFrame:
    wh = Warehouse(load_config(Path(data_dir)).warehouse_dir)
    where, params = ("ruleset = ?", [ruleset]) if ruleset else (None, None)
    return wh.read_window("diagnoses", start, end, where=where, params=params)


@task(name="backtest-compare")
def compare(old: pl.DataFrame, new: pl.DataFrame) -> pl.DataFrame:
    return verdict_changes(old, new)
