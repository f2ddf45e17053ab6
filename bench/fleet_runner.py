"""Thread runner against Dask for the diagnose flow on one simulated fleet (bench/README.md "Fleet runners").

    python bench/fleet_runner.py --jobs 100000 --workdir /work/bench-fleet [--repeat 1] [--dask-workers 2]

Simulates the fleet (`faultline simulate` code, seed 20250303), collects it once, then for each runner
and repeat copies the collected warehouse and times the whole `faultline flow diagnose` command (a fresh
interpreter: imports, Prefect's ephemeral server, Dask LocalCluster start included) as wall time.
Prints one JSON object; verifies that both runners wrote the same number of diagnoses.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path


def run(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--workdir", type=Path, default=Path("/work/bench-fleet"))
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--dask-workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    import polars as pl

    from faultline.fleet.config import write_config
    from faultline.simulate import SimConfig, simulate
    from faultline.warehouse.store import Warehouse

    work = a.workdir
    shutil.rmtree(work, ignore_errors=True)
    sim, base = work / "sim", work / "collected"
    t = time.perf_counter()
    s = simulate(sim, SimConfig(jobs=a.jobs, days=a.days, clusters=2, seed=20250303, nodes_per_cluster=256),
                 log=lambda _: None)
    t_sim = time.perf_counter() - t
    names = sorted(p.name for p in sim.iterdir() if p.is_dir())
    write_config(base, [{"name": n, "scheduler": {"kind": "sacct_files", "path": str(sim)},
                         "logs": {"kind": "loki_files", "path": str(sim)}} for n in names], demo=True)
    truth = pl.read_parquet(sim / "truth.parquet")
    lo = truth["end_time"].min().replace(hour=0, minute=0, second=0, microsecond=0)
    hi = truth["end_time"].max() + timedelta(days=1)
    fl = [sys.executable, "-m", "faultline", "flow"]
    env = {**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING", "FAULTLINE_WORKERS": str(a.threads)}
    env.pop("FAULTLINE_DASK_ADDRESS", None)
    env.pop("FAULTLINE_DASK_WORKERS", None)
    t_collect = run([*fl, "collect", "--data-dir", str(base), "--start", lo.isoformat(), "--end", hi.isoformat()], env)

    times: dict[str, list[float]] = {"threads": [], "dask": []}
    rows: dict[str, int] = {}
    for i in range(a.repeat):
        for name, extra in (("threads", []), ("dask", ["--dask-workers", str(a.dask_workers)])):
            d = work / f"{name}-{i}"
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(base, d)
            shutil.rmtree(d / "prefect", ignore_errors=True)
            times[name].append(run([*fl, "diagnose", "--data-dir", str(d), *extra], env))
            rows[name] = Warehouse(d / "warehouse").read("diagnoses").height
            shutil.rmtree(d)
    assert rows["threads"] == rows["dask"], rows
    out = {"jobs": s["jobs"], "failed": s["failed"], "log_lines": s["lines"], "diagnoses": rows["threads"],
           "simulate_s": round(t_sim, 1), "collect_s": round(t_collect, 1),
           "threads": a.threads, "dask_workers": a.dask_workers, "repeat": a.repeat,
           "diagnose_threads_s": round(statistics.median(times["threads"]), 1),
           "diagnose_dask_s": round(statistics.median(times["dask"]), 1),
           "runs": {k: [round(x, 1) for x in v] for k, v in times.items()}, "cpus": os.cpu_count()}
    out["dask_over_threads"] = round(out["diagnose_dask_s"] / out["diagnose_threads_s"], 2)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
