"""Collect one cluster x window: finished jobs from the scheduler, logs of the failed ones,
parsed and written to the warehouse with a coverage record per job and source."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl

from faultline.collectors import loki, metric_files, prometheus, slurm, slurmrestd
from faultline.fleet import loki_jobs
from faultline.fleet.config import ClusterConfig
from faultline.limits import SACCT_WINDOW_TIMEOUT_S
from faultline.logparse import who_spoke
from faultline.taxonomy import FAILED_STATES, SOURCES
from faultline.warehouse.schema import JOB_KEY, TABLES

LOG_SOURCES = ("applog", "syslog")
REQUEUE_DAYS = 1  # how far back a requeued job's earlier attempts are looked for


@dataclass
class Collected:
    jobs: pl.DataFrame
    allocations: pl.DataFrame
    logs: pl.DataFrame
    coverage: pl.DataFrame
    errors: list[str]
    metrics: pl.DataFrame | None = None  # samples of the failed jobs' nodes (metrics: {kind: prometheus})
    node_events: pl.DataFrame | None = None  # drains, downs, fails (sinfo -R, or saved node_events files)
    placements: pl.DataFrame | None = None  # pod -> node of Kubernetes jobs, seen live (kind kubernetes)


def days_between(start: datetime, end: datetime) -> list[str]:
    d, out = start.date(), []
    while d <= end.date():
        out.append(d.isoformat())
        d += timedelta(days=1)
    return out


def scheduler_jobs(cluster: ClusterConfig, start: datetime, end: datetime) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Job attempts that ended in [start, end), with their allocations. The scheduler is asked from a day
    earlier: a requeued job's attempts are numbered by the rows sacct prints for its id, so its earlier
    attempt must be among them (else attempt 1 would read as attempt 0, a second row for one key)."""
    kind = cluster.scheduler["kind"]
    since = start - timedelta(days=REQUEUE_DAYS)
    if kind == "slurmrestd":
        jobs, allocs = slurmrestd.fetch_jobs(cluster.scheduler, cluster.name, since, end)
    else:
        if kind == "sacct_files":
            text = slurm.read_sacct_files(Path(cluster.scheduler["path"]), cluster.name, days_between(since, end))
        else:
            text = slurm.run_sacct(since, end, cluster.scheduler.get("command", "sacct"),
                                   slurm.sacct_timeout(cluster.scheduler, SACCT_WINDOW_TIMEOUT_S))
        jobs, allocs = slurm.parse_sacct(text, cluster.name)
    jobs = jobs.filter((pl.col("end_time") >= start) & (pl.col("end_time") < end))
    allocs = allocs.join(jobs.select(JOB_KEY), on=JOB_KEY, how="semi")
    return jobs, allocs


def fetch_logs(cluster: ClusterConfig, failed: pl.DataFrame,
               margin_minutes: float = 15) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Raw lines of the failed jobs, and per-job notes (`loki_jobs.NOTES_SCHEMA`: a job whose logs failed, or
    were cut short). Saved exports are filed by the day the job ended; a live Loki is asked job by job over
    [start - margin_minutes, end + tail_minutes)."""
    no_notes = pl.DataFrame(schema=loki_jobs.NOTES_SCHEMA)
    if cluster.logs is None or failed.height == 0:
        return pl.DataFrame(schema=loki.RAW_SCHEMA), no_notes
    if cluster.logs["kind"] == "loki":
        raw, notes = loki_jobs.fetch(cluster.logs, failed, margin_minutes)
        return raw.join(failed.select(JOB_KEY), on=JOB_KEY, how="semi"), notes
    root = Path(cluster.logs["path"]) / cluster.name / "loki"
    days = sorted(failed.select(pl.col("end_time").dt.date().cast(pl.String)).unique().to_series().to_list())
    wanted = set(failed["job_id"].to_list())
    parts = [loki.read_export(root / f"{d}.jsonl", cluster.name, wanted) for d in days
             if (root / f"{d}.jsonl").is_file()]
    raw = pl.concat(parts) if parts else pl.DataFrame(schema=loki.RAW_SCHEMA)
    return raw.join(failed.select(JOB_KEY), on=JOB_KEY, how="semi"), no_notes


def parse_logs(raw: pl.DataFrame) -> pl.DataFrame:
    """Raw lines -> the logs table: who spoke (node from the line, else the stream's labels; rank) and
    the source's receive time. The line's own time, GPU and local rank are read at diagnose time, for
    the few lines a rule can match (`fleet.diagnose.with_line_details`)."""
    if raw.height == 0:
        return pl.DataFrame(schema=TABLES["logs"])
    raw = loki.with_sequence(raw)
    who = who_spoke(raw)
    out = raw.with_columns(
        node=pl.coalesce(who["node"], pl.col("node")), rank=who["rank"],
        local_rank=pl.lit(None, pl.Int32), gpu=pl.lit(None, pl.Int32))
    return out.select(list(TABLES["logs"]))


def coverage_rows(cluster: ClusterConfig, failed: pl.DataFrame, logs: pl.DataFrame,
                  errors: dict[str, str], notes: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per failed job and source: ok / empty / error (why) / not_configured. `errors["logs"]` fails
    every job's log sources; `notes` (JOB_KEY, error, note) fails one job's, or adds a remark to them."""
    counts = logs.group_by([*JOB_KEY, "source"]).agg(rows=pl.len().cast(pl.Int64))
    grid = failed.select(JOB_KEY).join(pl.DataFrame({"source": list(SOURCES)}), how="cross")
    grid = grid.join(counts, on=[*JOB_KEY, "source"], how="left").with_columns(pl.col("rows").fill_null(0))
    notes = pl.DataFrame(schema=loki_jobs.NOTES_SCHEMA) if notes is None else notes
    grid = grid.join(notes.select(*JOB_KEY, "error", "note"), on=JOB_KEY, how="left", maintain_order="left")
    configured = {"scheduler"} | (set(LOG_SOURCES) if cluster.logs else set())
    log_error = pl.lit(errors.get("logs"), pl.String) if errors.get("logs") else pl.col("error")
    status = (pl.when(pl.col("source") == "scheduler").then(pl.lit("ok"))
              .when(~pl.col("source").is_in(list(configured))).then(pl.lit("not_configured"))
              .when(log_error.is_not_null()).then(pl.lit("error"))
              .when(pl.col("rows") > 0).then(pl.lit("ok")).otherwise(pl.lit("empty")))
    note = pl.col("note").fill_null("")
    reason = (pl.when(pl.col("source") == "scheduler").then(pl.lit("sacct"))
              .when(~pl.col("source").is_in(list(configured))).then(pl.lit("no source configured"))
              .when(log_error.is_not_null()).then(log_error)
              .when(pl.col("rows") == 0).then(pl.concat_str(pl.lit("no lines for this job"),
                                                            pl.when(note != "").then(pl.lit("; ") + note)
                                                            .otherwise(pl.lit(""))))
              .otherwise(note))
    return grid.select(*JOB_KEY, "source", status=status, rows=pl.col("rows").cast(pl.Int64), reason=reason)


# What the scheduler says of a job that, changed, makes it a new input (re-collected, re-diagnosed).
RECHECK = ("state", "raw_state", "exit_code", "signal", "start_time", "end_time", "nodes")


def new_or_changed(jobs: pl.DataFrame, known: pl.DataFrame | None) -> pl.DataFrame:
    """The attempts of `jobs` that `known` (committed jobs rows) lacks, or holds with another
    scheduler row (state, exit code, times, nodes): one join, no loop."""
    if known is None or known.height == 0 or jobs.height == 0:
        return jobs
    old = known.select(*JOB_KEY, *[pl.col(c).alias(f"{c}__old") for c in RECHECK], _known=pl.lit(True))
    both = jobs.join(old.unique(JOB_KEY, keep="last"), on=JOB_KEY, how="left", maintain_order="left")
    same = pl.all_horizontal([pl.col(c).eq_missing(pl.col(f"{c}__old")) for c in RECHECK])
    return both.filter(~(pl.col("_known").fill_null(False) & same)).select(jobs.columns)


def collect_cluster(cluster: ClusterConfig, start: datetime, end: datetime, margin_minutes: float = 15,
                    known: pl.DataFrame | None = None, placements: pl.DataFrame | None = None) -> Collected:
    """Everything one cluster says about the jobs that ended in [start, end) (and, given `known`, the
    committed jobs rows, only the new or changed ones). A source that fails is recorded (coverage
    error) and the others still land; so does a job whose logs failed alone. `placements` (recorded
    pod -> node rows) attributes a Kubernetes job whose pods are gone."""
    if cluster.kind == "kubernetes":
        return collect_kubernetes(cluster, start, end, margin_minutes, known, placements)
    errors: dict[str, str] = {}
    jobs, allocs = scheduler_jobs(cluster, start, end)
    if known is not None:
        jobs = new_or_changed(jobs, known)
        allocs = allocs.join(jobs.select(JOB_KEY), on=JOB_KEY, how="semi")
    failed = jobs.filter(pl.col("state").is_in(list(FAILED_STATES)))
    try:
        raw, notes = fetch_logs(cluster, failed, margin_minutes)
    except (OSError, ValueError) as exc:  # unreadable export, Loki garbage
        errors["logs"] = f"{type(exc).__name__}: {exc}"[:300]
        raw, notes = fetch_logs(cluster, failed.clear())
    logs = parse_logs(raw)
    coverage = coverage_rows(cluster, failed, logs, errors, notes)
    samples, metric_cov = fetch_metrics(cluster, failed, margin_minutes)
    coverage = pl.concat([coverage, metric_cov.cast(coverage.schema)]) if metric_cov.height else coverage
    try:
        events = node_events(cluster, start, end)
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError, pl.exceptions.PolarsError) as exc:
        errors["node_events"] = f"{type(exc).__name__}: {exc}"[:300]
        events = pl.DataFrame(schema=slurm.NODE_EVENTS_SCHEMA)
    return Collected(jobs, allocs, logs, coverage, [f"{k}: {v}" for k, v in errors.items()] + job_errors(notes)
                     + metric_errors(metric_cov), samples, events)


def collect_kubernetes(cluster: ClusterConfig, start: datetime | None, end: datetime | None, margin_minutes: float = 15,
                       known: pl.DataFrame | None = None, placements: pl.DataFrame | None = None,
                       job_id: str | None = None) -> Collected:
    """A Kubernetes + Kueue cluster: workloads, their pods' states, logs and events (fleet.k8s_jobs), metrics."""
    from faultline.fleet import k8s_jobs

    got = k8s_jobs.collect(cluster, start, end, margin_minutes, known, placements, job_id=job_id)
    failed = got.jobs.filter(pl.col("state").is_in(list(FAILED_STATES)))
    samples, metric_cov = fetch_metrics(cluster, failed, margin_minutes)
    coverage = pl.concat([got.coverage, metric_cov.cast(got.coverage.schema)]) if metric_cov.height else got.coverage
    return Collected(got.jobs, got.allocations, parse_logs(got.raw), coverage, got.errors + metric_errors(metric_cov),
                     samples, pl.DataFrame(schema=slurm.NODE_EVENTS_SCHEMA), got.placements)


def node_events(cluster: ClusterConfig, start: datetime, end: datetime) -> pl.DataFrame:
    """Node drains, downs and fails: from `sinfo -R` (the reasons standing now, with the time each was set:
    kept if set before the window's end) for a live Slurm, or from saved files. `node_events: false` in the
    scheduler section turns it off; a `node_events: {kind: jsonl_files, path}` entry of the cluster names the
    saved files instead."""
    sched = cluster.scheduler
    if cluster.node_events is not None:  # saved exports named in the cluster's own `node_events:` entry
        events = slurm.read_node_event_files(Path(cluster.node_events["path"]), cluster.name, days_between(start, end))
        return events.filter((pl.col("ts") >= start) & (pl.col("ts") < end))
    if sched.get("node_events") is False:
        return pl.DataFrame(schema=slurm.NODE_EVENTS_SCHEMA)
    if sched["kind"] == "slurmrestd":
        events = slurmrestd.fetch_node_events(sched, cluster.name)
        return events.filter(pl.col("ts").is_null() | (pl.col("ts") < end))
    if sched["kind"] == "sacct_files":
        events = slurm.read_node_event_files(Path(sched["path"]), cluster.name, days_between(start, end))
        return events.filter((pl.col("ts") >= start) & (pl.col("ts") < end))
    command = sched.get("command", "sacct")
    sinfo = sched.get("sinfo") or (str(Path(command).with_name("sinfo")) if "/" in command else "sinfo")
    events = slurm.parse_sinfo_reasons(slurm.run_sinfo_reasons(sinfo), cluster.name)
    return events.filter(pl.col("ts").is_null() | (pl.col("ts") < end))


def fetch_metrics(cluster: ClusterConfig, failed: pl.DataFrame,
                  margin_minutes: float = 15) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Samples of the failed jobs' nodes over their windows and a `metrics` coverage row per job (none when
    no live metrics source is configured). Failures stay per job: a coverage error with the reason."""
    if cluster.metrics is None or failed.height == 0:
        return pl.DataFrame(schema=TABLES["metrics"]), pl.DataFrame(schema=prometheus.COVERAGE_SCHEMA)
    if cluster.metrics.get("kind") == "parquet_files":
        return metric_files.fetch(cluster.metrics, cluster.name, failed, margin_minutes)
    return prometheus.fetch(cluster.metrics, cluster.name, failed, margin_minutes)


def metric_errors(coverage: pl.DataFrame, show: int = 5) -> list[str]:
    bad = coverage.filter(pl.col("status") == "error")
    out = [f"metrics of job {r['job_id']}.{r['attempt']}: {r['reason']}" for r in bad.head(show).iter_rows(named=True)]
    return out + ([f"... and {bad.height - show} more job(s) whose metrics failed"] if bad.height > show else [])


def job_errors(notes: pl.DataFrame, show: int = 5) -> list[str]:
    """A short account of the jobs whose logs failed, for the flow's result and log."""
    failed = notes.filter(pl.col("error").is_not_null())
    out = [f"logs of job {r['job_id']}.{r['attempt']}: {r['error']}" for r in failed.head(show).iter_rows(named=True)]
    return out + ([f"... and {failed.height - show} more job(s) whose logs failed"] if failed.height > show else [])


def with_job_date(frame: pl.DataFrame, jobs: pl.DataFrame) -> pl.DataFrame:
    """Partition column for job-keyed tables: the UTC day the job ended."""
    dates = jobs.select(*JOB_KEY, date=pl.col("end_time").dt.date())
    return frame.join(dates, on=JOB_KEY, how="left", maintain_order="left")
