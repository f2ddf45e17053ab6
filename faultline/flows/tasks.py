"""Prefect tasks: each reads and writes the warehouse for one cluster (collect, diagnose) or one cluster x
day window (backtest). Tasks take and return small values (names, times, counts); the data stays in the
warehouse. The watermark logic lives in `faultline.fleet.watermark`.
"""

from __future__ import annotations

from datetime import date, datetime
from functools import lru_cache
from pathlib import Path

import polars as pl
from prefect import task

from faultline.fleet import watermark
from faultline.fleet.config import load_config
from faultline.fleet.diagnose import verdict_changes
from faultline.rules.loader import load_ruleset
from faultline.warehouse.store import Warehouse

partitions = watermark.day_pieces


def _mtime(paths: tuple[str, ...]) -> float:
    return max((p.stat().st_mtime for root in paths for p in Path(root).rglob("*") if p.is_file()), default=0.0)


@lru_cache(maxsize=8)
def _ruleset(paths: tuple[str, ...], builtin: bool, mtime: float):
    return load_ruleset([Path(p) for p in paths], builtin=builtin)


def ruleset_for(data_dir: str, rules: list[str] | None = None, builtin: bool = True):
    """The ruleset of the fleet config (or `rules`), loaded once per process while its files stay unchanged."""
    cfg = load_config(Path(data_dir))
    paths = tuple(str(p) for p in (rules if rules is not None else cfg.extra_rules))
    return _ruleset(paths, builtin, _mtime(paths))


@task(name="collect-cluster", retries=2, retry_delay_seconds=5)
def collect_cluster(data_dir: str, cluster: str, now: datetime | None = None) -> dict:
    """One cluster from its cursor (less the scheduler's lag) to now; nothing twice, nothing skipped."""
    return watermark.collect(load_config(Path(data_dir)), cluster, now=now)


@task(name="collect-partition", retries=2, retry_delay_seconds=5)
def collect_partition(data_dir: str, cluster: str, start: datetime, end: datetime,
                      now: datetime | None = None) -> dict:
    """An explicit window [start, end) of one cluster (history, the demo); moves the cursor when contiguous."""
    return watermark.collect(load_config(Path(data_dir)), cluster, now=now, start=start, end=end)


@task(name="diagnose-pending", retries=1, retry_delay_seconds=5)
def diagnose_pending(data_dir: str, cluster: str, rules: list[str] | None = None,
                     now: datetime | None = None) -> dict:
    """Every committed failed job of one cluster without a diagnosis of the current ruleset."""
    return watermark.diagnose(load_config(Path(data_dir)), cluster, ruleset_for(data_dir, rules), now=now)


@task(name="diagnose-plan")
def diagnose_plan(data_dir: str, cluster: str, rules: list[str] | None = None, now: datetime | None = None) -> dict:
    """What one cluster has pending: the input batches to cover and the end days of their undiagnosed
    failed jobs (small values: each day becomes a partition task)."""
    cfg = load_config(Path(data_dir))
    ruleset = ruleset_for(data_dir, rules)
    wh = Warehouse(cfg.warehouse_dir)
    now = watermark._utc(now) or watermark.utcnow()
    jobs, covers = watermark.pending(wh, cluster, ruleset.version, now, cfg.diagnose_horizon_days)
    days = sorted(jobs["date"].unique().to_list()) if jobs.height else []
    return {"cluster": cluster, "ruleset": ruleset.version, "covers": covers, "days": days, "now": now}


@task(name="diagnose-day", retries=1, retry_delay_seconds=5)
def diagnose_day(data_dir: str, cluster: str, day: date, batches: list[str], rules: list[str] | None = None,
                 now: datetime | None = None) -> int:
    """One cluster x end-day partition of a plan: its pending jobs, batch by batch, in one transaction."""
    cfg = load_config(Path(data_dir))
    ruleset = ruleset_for(data_dir, rules)
    wh = Warehouse(cfg.warehouse_dir)
    jobs = watermark.pending_day(wh, cluster, day, batches, ruleset.version)
    if jobs.height == 0:  # done by an earlier, interrupted run
        return 0
    return watermark.diagnose_day(cfg, wh, cluster, day, jobs, ruleset, [], watermark._utc(now) or watermark.utcnow())


@task(name="diagnose-cover", retries=1, retry_delay_seconds=5)
def diagnose_cover(data_dir: str, cluster: str, covers: list[str], rules: list[str] | None = None,
                   now: datetime | None = None) -> None:
    """After every day of a plan committed: record its input batches as covered (a run killed before this
    leaves them pending; the next run finds their jobs diagnosed and only covers them)."""
    cfg = load_config(Path(data_dir))
    watermark.diagnose_day(cfg, Warehouse(cfg.warehouse_dir), cluster, None, pl.DataFrame(),
                           ruleset_for(data_dir, rules), covers, watermark._utc(now) or watermark.utcnow())


@task(name="diagnose-partition", retries=1, retry_delay_seconds=5)
def diagnose_partition(data_dir: str, cluster: str, start: datetime, end: datetime,
                       rules: list[str] | None = None, builtin: bool = True) -> dict:
    """The committed failed jobs of one cluster that ended in [start, end) (a backtest), once per ruleset."""
    cfg = load_config(Path(data_dir))
    return watermark.diagnose_window(cfg, cluster, start, end, ruleset_for(data_dir, rules, builtin))


@task(name="load-diagnoses")
def load_diagnoses(data_dir: str, start: date, end: date, ruleset: str | None = None) -> pl.DataFrame:
    wh = Warehouse(load_config(Path(data_dir)).warehouse_dir)
    where, params = ("ruleset = ?", [ruleset]) if ruleset else (None, None)
    return wh.read_window("diagnoses", start, end, where=where, params=params)


@task(name="backtest-compare")
def compare(old: pl.DataFrame, new: pl.DataFrame) -> pl.DataFrame:
    return verdict_changes(old, new)


@task(name="record-placements", retries=2, retry_delay_seconds=5)
def record_placements(data_dir: str, cluster: str) -> dict:
    """One pass of the placement recorder over one Kubernetes cluster (fleet.placement)."""
    from faultline.fleet.placement import record

    return record(load_config(Path(data_dir)), cluster)
