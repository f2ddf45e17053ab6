"""One job on demand (event trigger, API, CLI): find it at its scheduler, collect, diagnose, store."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import polars as pl

from faultline.collectors import slurm, slurmrestd
from faultline.fleet.collect import (collect_kubernetes, coverage_rows, fetch_logs, fetch_metrics, parse_logs,
                                    with_job_date)
from faultline.fleet.config import ClusterConfig, FleetConfig
from faultline.fleet.diagnose import diagnose_tables
from faultline.fleet.watermark import SOURCE, unique_batch
from faultline.limits import SACCT_JOB_TIMEOUT_S
from faultline.rules.model import Ruleset
from faultline.taxonomy import FAILED_STATES
from faultline.warehouse.schema import JOB_KEY
from faultline.warehouse.store import Warehouse


class JobNotFound(LookupError):
    pass


class JobNotFinished(LookupError):
    """The scheduler knows the job but it has not ended (RUNNING, PENDING, no end time): nothing to diagnose yet."""


class SourceError(RuntimeError):
    """The job's scheduler could not be asked (sacct failed or timed out, unreadable or malformed output)."""


# What asking a scheduler can raise: a failed or missing command, a timeout, output that does not parse.
SCHEDULER_ERRORS = (OSError, RuntimeError, ValueError, subprocess.SubprocessError, pl.exceptions.PolarsError)


def find_job(cluster: ClusterConfig, job_id: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The job's attempts (latest last) and allocations, straight from the scheduler."""
    if cluster.scheduler["kind"] == "sacct_files":
        root = Path(cluster.scheduler["path"]) / cluster.name / "sacct"
        days = sorted(p.stem for p in root.glob("*.txt"))
        text = slurm.read_sacct_files(Path(cluster.scheduler["path"]), cluster.name, days)
    elif cluster.scheduler["kind"] == "slurmrestd":
        text = None
        jobs, allocs = slurmrestd.fetch_job(cluster.scheduler, cluster.name, job_id)
    else:
        text = slurm.run_sacct_job(job_id, cluster.scheduler.get("command", "sacct"),
                                   slurm.sacct_timeout(cluster.scheduler, SACCT_JOB_TIMEOUT_S))
    if text is not None:
        jobs, allocs = slurm.parse_sacct(text, cluster.name)
    exact = jobs.filter(pl.col("job_id") == job_id)
    if exact.height == 0:
        # An array or heterogeneous job is several jobs to Slurm (4711_1, 4711_2; 4711+0, 4711+1): name them.
        parts = sorted(set(jobs.filter(pl.col("job_id").str.starts_with(job_id + "_")
                                       | pl.col("job_id").str.starts_with(job_id + "+"))["job_id"].to_list()))
        hint = f"; it is an array or heterogeneous job: ask for one of {', '.join(parts[:20])}" if parts else ""
        raise JobNotFound(f"job {job_id} not found on cluster {cluster.name}{hint}")
    jobs = exact
    return jobs, allocs.join(jobs.select(JOB_KEY), on=JOB_KEY, how="semi")


def diagnose_one(cfg: FleetConfig, cluster_name: str, job_id: str, ruleset: Ruleset) -> dict:
    cluster = next((c for c in cfg.clusters if c.name == cluster_name), None)
    if cluster is None:
        raise JobNotFound(f"cluster {cluster_name!r} is not configured")
    if cluster.kind == "kubernetes":
        return _store_and_answer(cfg, cluster_name, job_id, ruleset, *_kubernetes_job(cfg, cluster, job_id))
    try:
        jobs, allocs = find_job(cluster, job_id)
    except SCHEDULER_ERRORS as exc:
        raise SourceError(f"scheduler of cluster {cluster_name} ({cluster.scheduler['kind']}): "
                          f"{type(exc).__name__}: {exc}"[:500]) from exc
    jobs = jobs.filter(pl.col("attempt") == pl.col("attempt").max())  # the latest attempt
    latest = jobs.row(0, named=True)
    if latest["state"] in ("RUNNING", "PENDING") or latest["end_time"] is None:
        raise JobNotFinished(f"job {job_id} on cluster {cluster_name} has not ended (state {latest['raw_state']}"
                             f"{'' if latest['end_time'] else ', no end time'}): diagnose it once it has")
    errors: dict[str, str] = {}
    try:
        raw, notes = fetch_logs(cluster, jobs, cfg.margin_minutes)
    except (OSError, ValueError) as exc:
        errors["logs"] = f"{type(exc).__name__}: {exc}"[:300]
        raw, notes = fetch_logs(cluster, jobs.clear())
    logs = parse_logs(raw)
    coverage = coverage_rows(cluster, jobs, logs, errors, notes)
    samples, metric_cov = fetch_metrics(cluster, jobs, cfg.margin_minutes)
    coverage = pl.concat([coverage, metric_cov.cast(coverage.schema)]) if metric_cov.height else coverage
    return _store_and_answer(cfg, cluster_name, job_id, ruleset, jobs, allocs, logs, coverage, samples)


def _kubernetes_job(cfg: FleetConfig, cluster: ClusterConfig, job_id: str):
    """A Kueue workload `<namespace>/<name>` and what its pods say (recorded placements for pods gone)."""
    from faultline.collectors.kubernetes import KubeError

    from faultline.fleet.watermark import new_placements, stamp, utcnow

    wh = Warehouse(cfg.warehouse_dir)
    placements = wh.read("placements", "cluster = ? AND job_id = ?", [cluster.name, job_id])
    try:
        got = collect_kubernetes(cluster, None, None, cfg.margin_minutes, placements=placements, job_id=job_id)
    except (KubeError, OSError) as exc:
        raise SourceError(f"scheduler of cluster {cluster.name} (kueue): {type(exc).__name__}: {exc}"[:500]) from exc
    except ValueError as exc:
        raise JobNotFound(str(exc)) from exc
    if got.jobs.height == 0:
        raise JobNotFound(f"job {job_id} not found on cluster {cluster.name} (or it has not ended)")
    seen = new_placements(got.placements, placements)
    if seen.height:
        wh.write("placements", seen.with_columns(date=pl.col("seen_at").dt.date()),
                 unique_batch("placements", cluster.name, stamp(utcnow())))
    return got.jobs, got.allocations, got.logs, got.coverage, got.metrics


def _store_and_answer(cfg: FleetConfig, cluster_name: str, job_id: str, ruleset: Ruleset, jobs: pl.DataFrame,
                      allocs: pl.DataFrame, logs: pl.DataFrame, coverage: pl.DataFrame,
                      samples: pl.DataFrame) -> dict:
    wh = Warehouse(cfg.warehouse_dir)
    batch = unique_batch("job", cluster_name, job_id)
    diagnoses, symptoms = diagnose_tables(jobs.with_columns(_batch=pl.lit(batch)), logs, coverage, ruleset,
                                          cfg.max_drain, metrics=samples)
    dated = lambda f: with_job_date(f, jobs)  # noqa: E731
    failed = int(jobs.filter(pl.col("state").is_in(list(FAILED_STATES))).height)
    # one transaction: the job's rows and its verdict appear together; the commit covers itself, so the
    # scheduled diagnose does not diagnose the job again (and collect finds it already known)
    with wh.transaction(batch, [cluster_name], "job", source=SOURCE, ruleset=ruleset.version, covers=[batch],
                        jobs=jobs.height, failed=failed,
                        dates=sorted(set(jobs["end_time"].dt.date().to_list()))) as tx:
        tx.write("jobs", jobs.with_columns(date=pl.col("end_time").dt.date()))
        tx.write("allocations", dated(allocs))
        tx.write("logs", dated(logs))
        tx.write("coverage", dated(coverage))
        if samples.height:
            tx.write("metrics", samples.with_columns(date=pl.col("ts").dt.date()))
        tx.write("diagnoses", dated(diagnoses))
        tx.write("symptoms", dated(symptoms))
    if diagnoses.height == 0:  # the job did not fail: say so rather than invent a verdict
        return {"cluster": cluster_name, "job_id": job_id, "outcome": "healthy", "confidence": "high",
                "root_cause": f"job state {jobs['state'][0]}: not a failure", "ruleset": {"version": ruleset.version}}
    return json.loads(diagnoses["diagnosis"][0])
