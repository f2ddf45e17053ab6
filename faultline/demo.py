"""`faultline demo`: a simulated fleet through the Prefect flows, end to end.

simulate -> collect -> diagnose -> report, then the verdicts are scored against the
simulator's ground truth. `faultline demo --scenarios` instead diagnoses the handful of
worked examples of DESIGN.md as log files, without Prefect.
"""

from __future__ import annotations

import json
from pathlib import Path

from faultline.pipeline import diagnose_files
from faultline.render import render
from faultline.rules.model import Ruleset
from faultline.scenarios import all_scenarios


def _culprit_text(d: dict) -> str:
    c = d["culprit"]
    parts = [", ".join(c["nodes"]), ", ".join(f"rank {r}" for r in c["ranks"])]
    return " / ".join(p for p in parts if p) or "-"


def run_demo(ruleset: Ruleset, data_dir: Path, show: str | None = "xid79-gpu-off-bus") -> int:
    root = data_dir / "demo" / "jobs"
    out = data_dir / "demo" / "diagnoses.jsonl"
    root.mkdir(parents=True, exist_ok=True)
    rows, right = [], 0
    with out.open("w", encoding="utf-8") as fh:
        for sc in all_scenarios():
            job = sc.write(root)
            d = diagnose_files([job], ruleset, job_id=sc.name, cluster="demo", state=sc.state)
            fh.write(json.dumps(d, default=str) + "\n")
            ok = d["outcome"] == sc.expect_outcome and _culprit_text(d) == (", ".join(sc.expect_culprit) or "-")
            right += ok
            rows.append((sc, d, ok))
    print(f"faultline demo: {len(rows)} jobs diagnosed with ruleset {ruleset.version} "
          f"({len(ruleset.rules)} rules)\n")
    print(f"  {'job':20} {'verdict':22} {'culprit':18} {'conf':7} {'action':17} expected")
    for sc, d, ok in rows:
        verdict = d["outcome"] + ("?" if d["ambiguous"] else "")
        print(f"  {sc.name:20} {verdict:22} {_culprit_text(d):18} {d['confidence']:7} "
              f"{d['recommended_action']['action']:17} {'ok' if ok else 'MISMATCH: ' + sc.expect_outcome + ' / ' + ', '.join(sc.expect_culprit)}")
    print(f"\n  {right}/{len(rows)} verdicts match the injected faults")
    if show:
        d = next(d for sc, d, _ in rows if sc.name == show)
        print(f"\nOne verdict in full ({show}):\n")
        print(render(d))
    print(f"\nDiagnoses (JSON lines): {out}\nJob logs: {root}")
    return 0 if right == len(rows) else 1


def _window(truth) -> tuple:
    import polars as pl
    from datetime import datetime, time, timedelta, timezone

    ends = truth.select(lo=pl.col("end_time").min(), hi=pl.col("end_time").max()).row(0)
    start = datetime.combine(ends[0].date(), time(), tzinfo=timezone.utc)
    end = datetime.combine(ends[1].date() + timedelta(days=1), time(), tzinfo=timezone.utc)
    return start, end


def _kube_cluster(sim: Path, day: str, seed: int):
    """The demo's small Kubernetes + Kueue cluster (faultline.simulate.kube), read back as a kubectl snapshot."""
    from faultline.simulate.kube import simulate_kube

    truth = simulate_kube(sim, day, seed)
    truth.write_parquet(sim / "kube_truth.parquet")
    return truth


def _metrics_only_score(diagnoses, truth) -> dict:
    """The GPU faults whose syslog was not shipped: only the DCGM samples name the node. Right = the
    truth's outcome and culprit node."""
    import polars as pl

    mo = truth.filter(pl.col("fault").str.starts_with("gpu_") & pl.col("missing").str.starts_with("syslog")
                      & (pl.col("blame") == "node"))
    both = mo.join(diagnoses.select("cluster", "job_id", "attempt", pl.col("outcome").alias("got"),
                                    pl.col("culprit_nodes").alias("got_nodes")),
                   on=["cluster", "job_id", "attempt"], how="left")
    right = both.filter((pl.col("got") == pl.col("outcome"))
                        & (pl.col("got_nodes").list.sort().list.join(",") == pl.col("culprit_nodes").list.sort()
                           .list.join(",")))
    return {"jobs": both.height, "right": right.height}


def run_fleet_demo(data_dir: Path, jobs: int = 3000, days: int = 3, clusters: int = 2, seed: int = 0) -> int:
    import json as _json
    import shutil
    import time as _time

    import polars as pl

    from faultline.evaluate import fleet_scores
    from faultline.fleet.config import write_config
    from faultline.flows.env import configure_prefect
    from faultline.simulate import SimConfig, simulate
    from faultline.simulate.kube import kube_cluster_config
    from faultline.warehouse.store import Warehouse

    t0 = _time.perf_counter()
    demo = Path(data_dir).resolve()
    cfg_path = demo / "faultline.yaml"
    if cfg_path.is_file() and "demo: true" not in cfg_path.read_text(encoding="utf-8"):
        print(f"faultline demo: {cfg_path} is not a demo's config; the demo would replace its warehouse. "
              "Choose another --data-dir.", file=__import__("sys").stderr)
        return 2
    shutil.rmtree(demo / "warehouse", ignore_errors=True)
    sim = demo / "sim"
    stage = {"t": _time.perf_counter()}

    def done(what: str) -> None:
        now = _time.perf_counter()
        print(f"           {what} ({now - stage['t']:.0f} s; {now - t0:.0f} s in all)", flush=True)
        stage["t"] = now

    print(f"faultline demo -> {demo} (about 2-3 minutes on 2 cores; four stages)", flush=True)
    print(f"  1/4 simulate {jobs} jobs on {clusters} clusters over {days} days ...", flush=True)
    s = simulate(sim, SimConfig(jobs=jobs, days=days, clusters=clusters, seed=seed, nodes_per_cluster=256),
                 log=lambda msg: print(f"          {msg.strip()}", flush=True))
    names = [c["name"] for c in _json.loads((sim / "fleet.json").read_text())["clusters"]]
    kube_truth = _kube_cluster(sim, SimConfig().start, seed)
    write_config(demo, [{"name": n, "scheduler": {"kind": "sacct_files", "path": str(sim)},
                         "logs": {"kind": "loki_files", "path": str(sim)},
                         "metrics": {"kind": "parquet_files", "path": str(sim)},
                         "node_events": {"kind": "jsonl_files", "path": str(sim)}} for n in names]
                 + [kube_cluster_config(sim)], demo=True)
    truth = pl.concat([pl.read_parquet(sim / "truth.parquet"), kube_truth], how="diagonal_relaxed")
    start, end = _window(truth)
    done(f"{s['jobs']} job attempts, {s['failed']} failed, {s['lines']:,} log lines; "
         f"Kubernetes/Kueue cluster kube: {kube_truth.height} workloads")

    configure_prefect(demo)
    from faultline.flows.server import prefect_api

    with prefect_api():  # Prefect's temporary API inside this process: nothing outlives the demo
        from faultline.flows import flows

        print("  2/4 collect  (Prefect flow: each cluster's jobs, their logs and coverage, committed per day) ...",
              flush=True)
        collected = flows.collect(data_dir=str(demo), start=start, end=end)
        done(f"{sum(c['jobs'] for c in collected)} jobs, {sum(c['logs'] for c in collected):,} log lines collected")
        print("  3/4 diagnose (Prefect flow: every collected failed job at once) ...", flush=True)
        diagnosed = flows.diagnose(data_dir=str(demo))
        done(f"{sum(d['diagnosed'] for d in diagnosed)} diagnoses")
        print("  4/4 report   (trend tables + HTML) ...", flush=True)
        # the report of the night after the last simulated day (its "last 24 h"); the few jobs still running
        # then end in later nights' reports
        last_day = start.date() + __import__("datetime").timedelta(days=days - 1)
        html = flows.report(data_dir=str(demo), day=last_day, days=days)
        done("report written")
    wh = Warehouse(demo / "warehouse")
    diagnoses = wh.read("diagnoses")
    sc = fleet_scores(diagnoses, truth)
    n_jobs = sum(c["jobs"] for c in collected)
    n_failed = sum(c["failed"] for c in collected)
    print(f"\n{n_jobs} jobs, {n_failed} failed, {sum(d['diagnosed'] for d in diagnosed)} diagnosed "
          f"in {_time.perf_counter() - t0:.0f} s\n")
    print("failures by outcome:")
    by = diagnoses.group_by("outcome").agg(jobs=pl.len(), gpu_hours=pl.col("gpu_hours").sum()).sort(
        "jobs", descending=True)
    for outcome, n, gh in by.iter_rows():
        print(f"  {outcome:28} {n:6}   {gh:10,.0f} GPU-h")
    top = (diagnoses.filter(~pl.col("ambiguous") & pl.col("domain").is_in(["hardware", "network", "infrastructure"]))
           .explode("culprit_nodes").drop_nulls("culprit_nodes").group_by("cluster", "culprit_nodes").len()
           .sort(["len", "culprit_nodes"], descending=[True, False]).head(5))
    print("top culprit nodes:")
    for cluster, node, n in top.iter_rows():
        print(f"  {cluster}/{node:16} culprit of {n} job(s)")
    print("\naccuracy against the simulator's ground truth:")
    print(f"  outcome  {sc['outcome_right']}/{sc['jobs']} ({100 * sc['outcome_right'] / max(sc['jobs'], 1):.1f}%)")
    print(f"  culprit  {sc['culprit_right']}/{sc['culprit_cases']} "
          f"({100 * sc['culprit_right'] / max(sc['culprit_cases'], 1):.1f}%) of jobs whose truth names one")
    print(f"  wrong blames {sc['wrong_blames']}, ambiguous {sc['ambiguous']}")
    kube = fleet_scores(diagnoses.filter(pl.col("cluster") == "kube"), kube_truth)
    print(f"  of which the Kubernetes/Kueue cluster: outcome {kube['outcome_right']}/{kube['jobs']}, culprit "
          f"{kube['culprit_right']}/{kube['culprit_cases']}, wrong blames {kube['wrong_blames']} "
          "(an OOMKilled pod, a PodsReadyTimeout eviction, a preemption, a NotReady node)")
    mo = _metrics_only_score(diagnoses, truth)
    if mo["jobs"]:
        print(f"  metrics-only faults (GPU Xid, no syslog shipped): {mo['right']}/{mo['jobs']} right "
              f"(outcome and culprit node, from the DCGM Xid gauge)")
    example = diagnoses.filter(pl.col("outcome") == "gpu_hardware").sort("cluster", "job_id").head(1)
    print(f"\nreport: {html}\nwarehouse: {demo / 'warehouse'}\ntry: faultline sql"
          + ("" if demo == Path("data").resolve() else f" --data-dir {data_dir}")
          + " \"SELECT outcome, count(*) FROM diagnoses GROUP BY 1 ORDER BY 2 DESC\"")
    if example.height:
        print(f"     faultline flow job --data-dir {data_dir} --cluster {example['cluster'][0]} "
              f"--job-id {example['job_id'][0]}")
    return 0 if sc["wrong_blames"] == 0 else 1
