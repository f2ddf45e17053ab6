"""The flows of DESIGN.md, thin: collect -> load -> evaluate -> write back.

collect       per cluster, from its cursor to now: new job attempts, their logs and coverage (one commit)
diagnose      per cluster, every committed failed job without a diagnosis of the current ruleset
backfill      history: collect from a date day by day, then diagnose
report        trend tables, one self-contained HTML report, a Prefect markdown artifact
diagnose_job  one job, on a `faultline.job.failed` event, the API or the CLI
backtest      a candidate ruleset over a past window: which verdicts would change
record_placements  per Kubernetes cluster: pod -> node of the admitted Kueue workloads, kept after the pods go
"""

from __future__ import annotations

import os
import re
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import polars as pl
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from faultline.flows import runner, tasks
from faultline.flows.env import data_dir_of
from faultline.fleet.config import load_config


def _partition_runner():
    """Threads by default (FAULTLINE_WORKERS, 2), Dask when FAULTLINE_DASK_ADDRESS or FAULTLINE_DASK_WORKERS
    is set (faultline.flows.runner); `flow.with_options(task_runner=runner.dask(...))` chooses per call."""
    return runner.partition_runner()


def _utc(t: datetime | str | None, default: datetime) -> datetime:
    if t is None:
        return default
    t = datetime.fromisoformat(t) if isinstance(t, str) else t
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _window(start, end, minutes: int = 24 * 60) -> tuple[datetime, datetime]:
    now = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    end_t = _utc(end, now)
    return _utc(start, end_t - timedelta(minutes=minutes)), end_t


@flow(name="collect", log_prints=True, task_runner=_partition_runner())
def collect(data_dir: str | None = None, start: datetime | None = None, end: datetime | None = None,
            now: datetime | None = None) -> list[dict]:
    """Each cluster from its cursor (less the scheduler's lag allowance) to now: a missed or failed run is
    caught up by the next, a re-run writes nothing. With `start` (and `end`, default now): that window."""
    data_dir = data_dir_of(data_dir)
    cfg = load_config(Path(data_dir))
    names = [c.name for c in cfg.clusters]
    if start is None:
        futures = tasks.collect_cluster.map([data_dir] * len(names), names, [now] * len(names))
    else:
        s, e = _utc(start, None), _utc(end, now or datetime.now(timezone.utc))
        futures = tasks.collect_partition.map([data_dir] * len(names), names, [s] * len(names), [e] * len(names),
                                              [now] * len(names))
    out = [f.result() for f in futures]
    for r in out:
        print(f"collect {r['cluster']}: {r['jobs']} new job attempt(s), {r['failed']} failed, {r['held']} held back "
              f"(logs failed), read {r['start']} .. {r['end']}, cursor {r['cursor']}")
    return out


@flow(name="diagnose", log_prints=True, task_runner=_partition_runner())
def diagnose(data_dir: str | None = None, rules: list[str] | None = None, now: datetime | None = None) -> list[dict]:
    """Every collected failed job, fleet-wide, without a diagnosis of the current ruleset (or whose inputs
    changed): no window, so a late, missed or killed run loses nothing."""
    data_dir = data_dir_of(data_dir)
    cfg = load_config(Path(data_dir))
    plans = [tasks.diagnose_plan(data_dir, c.name, rules, now) for c in cfg.clusters]
    # one partition task per cluster x end day, on the flow's task runner (threads or Dask)
    parts = [(p, day) for p in plans for day in p["days"]]
    futures = tasks.diagnose_day.map([data_dir] * len(parts), [p["cluster"] for p, _ in parts],
                                     [d for _, d in parts], [p["covers"] for p, _ in parts],
                                     [rules] * len(parts), [p["now"] for p, _ in parts])
    counts = [f.result() for f in futures]  # raises if a partition failed: nothing is covered then
    out = []
    for p in plans:
        if p["covers"]:
            tasks.diagnose_cover(data_dir, p["cluster"], p["covers"], rules, p["now"])
        n = sum(c for (q, _), c in zip(parts, counts) if q is p)
        out.append({"cluster": p["cluster"], "diagnosed": n, "ruleset": p["ruleset"], "batches": len(p["covers"]),
                    "partitions": sum(1 for q, _ in parts if q is p)})
        print(f"diagnose {p['cluster']}: {n} job(s) in {out[-1]['partitions']} partition(s) with ruleset "
              f"{p['ruleset']}")
    return out


@flow(name="backfill", log_prints=True)
def backfill(since: datetime, data_dir: str | None = None, until: datetime | None = None) -> list[dict]:
    """History from `since`: collect day by day (each day committed, the cursor moved along when contiguous),
    then diagnose what is pending. Re-running it is a no-op."""
    data_dir = data_dir_of(data_dir)
    from faultline.fleet.watermark import backfill as run

    cfg = load_config(Path(data_dir))
    out = run(cfg, _utc(since, None), tasks.ruleset_for(data_dir), until=_utc(until, None) if until else None)
    for r in out:
        print(f"backfill {r['cluster']}: {r['jobs']} job attempt(s), {r['failed']} failed, "
              f"{r['diagnosed']} diagnosed, cursor {r['cursor']}")
    return out


@flow(name="report", log_prints=True)
def report(data_dir: str | None = None, day: date | None = None, days: int = 7, lemon_k: int = 3) -> str:
    """Trend tables and the HTML report over the `days` up to `day` (default: yesterday and before)."""
    data_dir = data_dir_of(data_dir)
    from faultline.report.build import build_report

    end_day = day or (datetime.now(timezone.utc).date() - timedelta(days=1))
    cfg = load_config(Path(data_dir))
    ruleset = tasks.ruleset_for(data_dir)
    out = build_report(cfg, end_day - timedelta(days=days - 1), end_day, ruleset.version, lemon_k)
    create_markdown_artifact(key="faultline-report", markdown=out.markdown,
                             description=f"faultline fleet report {out.start} .. {out.end}")
    rows = [{"node": r["node"], "cluster": r["cluster"], "action": r["action"], "why": (r["why"] or "")[:160],
             "jobs": r["jobs"], "first_seen": str(r["first_seen"]), "last_seen": str(r["last_seen"]),
             "state": r["state"], "evidence": (r["evidence"] or "")[:200]}
            for r in (out.actions.head(100).iter_rows(named=True) if out.actions is not None else [])]
    create_table_artifact(key="faultline-actions", table=rows or [{"node": "none to drain or reset"}],
                          description=f"drain/reset list {out.start} .. {out.end}")
    get_run_logger().info("report written to %s", out.html_path)
    return str(out.html_path)


@flow(name="diagnose_job", log_prints=True)
def diagnose_job(cluster: str, job_id: str, data_dir: str | None = None) -> dict:
    """One job (triggered by a `faultline.job.failed` event): collect it and diagnose it."""
    data_dir = data_dir_of(data_dir)
    from faultline.fleet.single import diagnose_one

    cfg = load_config(Path(data_dir))
    d = diagnose_one(cfg, cluster, job_id, tasks.ruleset_for(data_dir))
    # artifact keys: lowercase letters, digits and dashes (a Kubernetes job id holds a slash)
    create_markdown_artifact(key=re.sub(r"[^a-z0-9-]", "-", f"diagnosis-{cluster}-{job_id}".lower())[:60],
                             markdown=f"**{d['outcome']}** ({d['confidence']}): {d['root_cause']}")
    return d


@flow(name="backtest", log_prints=True, task_runner=_partition_runner())
def backtest(candidate_rules: list[str], data_dir: str | None = None, start: datetime | None = None,
             end: datetime | None = None, builtin: bool = True) -> list[dict]:
    """Re-run a candidate ruleset over [start, end) and list the jobs whose verdict would change."""
    data_dir = data_dir_of(data_dir)
    s, e = _window(start, end)
    baseline = tasks.ruleset_for(data_dir)
    candidate = tasks.ruleset_for(data_dir, candidate_rules, builtin)
    cfg = load_config(Path(data_dir))
    parts = [(c.name, a, b) for c in cfg.clusters for a, b in tasks.partitions(s, e)]
    # The candidate's verdicts land beside the baseline's (diagnoses are keyed by ruleset version).
    futures = tasks.diagnose_partition.map([data_dir] * len(parts), [p[0] for p in parts], [p[1] for p in parts],
                                           [p[2] for p in parts], [list(candidate_rules)] * len(parts),
                                           [builtin] * len(parts))
    [f.result() for f in futures]
    old = tasks.load_diagnoses.fn(data_dir, s.date(), e.date(), baseline.version)
    new = tasks.load_diagnoses.fn(data_dir, s.date(), e.date(), candidate.version)
    window = lambda f: f.filter((pl.col("end_time") >= s) & (pl.col("end_time") < e))  # noqa: E731
    changes = tasks.compare(window(old), window(new))
    rows = changes.select("cluster", "job_id", "attempt", "outcome", "outcome_new",
                          pl.col("culprit_nodes").list.join(","), pl.col("culprit_nodes_new").list.join(","),
                          "ambiguous", "ambiguous_new").to_dicts()
    create_table_artifact(key="faultline-backtest", table=rows or [{"changes": 0}],
                          description=f"{baseline.version} -> {candidate.version}: {len(rows)} verdict(s) change")
    return changes.to_dicts()


@flow(name="record_placements", log_prints=True, task_runner=_partition_runner())
def record_placements(data_dir: str | None = None, clusters: list[str] | None = None) -> list[dict]:
    """Every Kubernetes cluster (or `clusters`): the pods of its admitted Kueue workloads and the nodes they
    run on, recorded once each, so a job is attributed to its nodes after its pods are deleted."""
    data_dir = data_dir_of(data_dir)
    cfg = load_config(Path(data_dir))
    names = [c.name for c in cfg.clusters if c.kind == "kubernetes" and (not clusters or c.name in clusters)]
    futures = tasks.record_placements.map([data_dir] * len(names), names)
    out = [f.result() for f in futures]
    for r in out:
        print(f"placements {r['cluster']}: {r['pods']} pod(s) of {r['workloads']} admitted workload(s), "
              f"{r['written']} new" + (f", {len(r['errors'])} error(s): {r['errors'][:3]}" if r["errors"] else ""))
    return out
