"""Deterministic scenario data for the benchmark suite (see bench/README.md).

Every scenario is a folder of job folders, the input `faultline diagnose` takes:

    <root>/jobs/<cluster>-<job_id>[-r<replica>]/slurm.out    combined applog of all ranks/nodes
    <root>/jobs/<...>/syslog.log                              syslog lines of all the job's nodes
    <root>/jobs.parquet                                       one row per job: key, state, exit code, times

plus, for the single-job stage, `<root>/single/<host>/train.log` and `syslog.log` (per-node layout).

Lines come from the fleet simulator (`faultline.simulate`): the failure stories of failed jobs. The
simulator renders only the part of a job around its failure, so its lines are failure-dense (about half
of them hold a rule literal). Scenarios M and L add training chatter in the style of
bench/make_big_log.py (step/loss lines, NCCL INFO channel set-up, checkpoint saves; none holds a rule
literal) so that a job looks like a job that ran for a while: `chatter` chatter lines per simulator
line. M and L are replicas of one base set written once and hard-linked under new job ids, so disk
use stays at the base size; the engine keeps no state between jobs, so replicas cost what new jobs
would cost (the page cache serves both the engine and ripgrep alike).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl

from faultline.simulate.jobs import SimConfig
from faultline.simulate.sim import Fleet, _day

JOB_COLS = {"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "state": pl.String,
            "exit_code": pl.Int32, "signal": pl.Int32, "start_time": pl.Datetime("us", "UTC"),
            "end_time": pl.Datetime("us", "UTC")}

# Training chatter (bench/make_big_log.py templates); {H} host, {R} rank, {R2} next rank, {G} GPU, ...
CHATTER = [
    ["[rank", "{R}", "]:[I0304 ", "{T}", " train.py:", "{LN}", "] step ", "{S}", " loss ", "{LOSS}",
     " lr 3.0e-4 tokens/s 41234 grad_norm 1.02"],
    ["{H}", ":", "{PID}", ":", "{PID}", " [", "{G}", "] NCCL INFO Channel ", "{C}", "/0 : ", "{R}", " -> ", "{R2}",
     " via P2P/IPC/read"],
    ["[rank", "{R}", "]: /usr/lib/python3/dist-packages/torch/utils/data/dataloader.py:558: UserWarning: "
     "This DataLoader will create 8 worker processes in total."],
    ["{H}", ":", "{PID}", ":", "{PID}", " [", "{G}", "] NCCL INFO comm 0x55d5c1a0 rank ", "{R}", " nranks ", "{NR}",
     " cudaDev ", "{G}", " busId 3b000 - Init COMPLETE"],
    ["[rank", "{R}", "]:[I0304 ", "{T}", " checkpoint.py:211] saved shard ", "{C}", " of step ", "{S}", " in 2.31s"],
]


def _failed_jobs(n_failed: int, seed: int, max_nodes: int | None = None) -> tuple[Fleet, np.ndarray]:
    """A simulated fleet big enough to hold `n_failed` failed jobs with logs; their row indices."""
    jobs = max(200, int(n_failed / 0.2))
    while True:
        fleet = Fleet(SimConfig(jobs=jobs, days=max(1, min(14, jobs // 2000)), seed=seed))
        c = fleet.jt.cols
        ok = (c["state"] != "COMPLETED") & c["has_logs"]
        if max_nodes:
            ok &= c["nnodes"] <= max_nodes
        idx = np.flatnonzero(ok)
        if idx.size >= n_failed:
            return fleet, idx[:n_failed]
        jobs = int(jobs * 1.5)


def _jobs_frame(fleet: Fleet, idx: np.ndarray, suffix: str = "") -> pl.DataFrame:
    c = fleet.jt.cols
    ts = lambda k: pl.Series(c[k][idx]).cast(pl.Datetime("ns")).dt.cast_time_unit("us").dt.replace_time_zone("UTC")  # noqa: E731
    ec = [str(x) for x in c["exit_code"][idx]]
    return pl.DataFrame({
        "cluster": c["cluster"][idx].astype(str), "job_id": [f"{j}{suffix}" for j in c["job_id"][idx].astype(str)],
        "attempt": c["attempt"][idx].astype(np.int32), "state": [str(s) for s in c["state"][idx]],
        "exit_code": [int(e.split(":")[0]) if e.split(":")[0].isdigit() else None for e in ec],
        "signal": [int(e.split(":")[1]) if ":" in e and e.split(":")[1].isdigit() else None for e in ec],
        "start_time": ts("start"), "end_time": ts("end")}, schema=JOB_COLS)


def _chatter(n: int, hosts: list[str], rng: np.random.Generator) -> pl.Series:
    """n chatter lines of a job on these hosts (8 ranks per host), vectorized."""
    if n <= 0:
        return pl.Series("line", [], dtype=pl.String)
    nr = 8 * len(hosts)
    r = rng.integers(0, nr, n)
    step = np.arange(n) // max(1, nr)
    df = pl.DataFrame({
        "tpl": rng.integers(0, len(CHATTER), n), "R": r, "R2": (r + 1) % nr, "G": r % 8, "PID": 1000 + r,
        "C": rng.integers(0, 32, n), "LN": rng.integers(0, 900, n), "S": step, "NR": np.full(n, nr),
        "LOSS": (rng.random(n) * 3).round(4), "H": pl.Series(hosts, dtype=pl.String).gather(r // 8),
        "T": 9 * 3600 * 10**6 + step.astype(np.int64) * 10**6 + rng.integers(0, 10**6, n)})
    df = df.with_columns(T=pl.from_epoch("T", time_unit="us").dt.strftime("%H:%M:%S%.6f"))
    out = pl.Series("line", [None] * n, dtype=pl.String)
    for k, parts in enumerate(CHATTER):
        expr = pl.concat_str([pl.col(p[1:-1]).cast(pl.String) if p.startswith("{") else pl.lit(p) for p in parts])
        mask = df["tpl"] == k
        out = out.scatter(np.flatnonzero(mask.to_numpy()), df.filter(mask).select(expr).to_series())
    return out


def _write_job(folder: Path, lines: pl.DataFrame) -> tuple[int, int]:
    """lines: (src, line) in order -> slurm.out (applog) and syslog.log; returns (lines, bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    n = b = 0
    for src, name in ((0, "slurm.out"), (1, "syslog.log")):
        part = lines.filter(pl.col("src") == src)["line"]
        if part.len():
            text = ("\n".join(part.to_list()) + "\n").encode()
            (folder / name).write_bytes(text)
            n += part.len()
            b += len(text)
    return n, b


def make_fleet_scenario(root: Path, n_failed: int, *, chatter: int = 0, replicas: int = 1, seed: int = 20250303,
                        log=print) -> dict:
    """Write the job folders of a scenario; returns {jobs, lines, bytes} over all replicas."""
    root = Path(root)
    base = root / "jobs"
    base.mkdir(parents=True, exist_ok=True)
    fleet, idx = _failed_jobs(n_failed, seed)
    c = fleet.jt.cols
    days = _day(c["end"])
    rng = np.random.default_rng([seed, 99])
    n_lines = n_bytes = 0
    names: list[str] = []
    order = sorted(idx.tolist(), key=lambda i: (int(c["cidx"][i]), int(days[i]), int(c["job_id"][i]), int(c["attempt"][i])))
    groups: dict[tuple[int, int], list[int]] = {}
    for i in order:
        groups.setdefault((int(c["cidx"][i]), int(days[i])), []).append(i)
    for (ci, day), members in groups.items():
        cl = fleet.clusters[ci]
        lines = fleet.logs(members, cl, day)  # job = position in `members`
        for k, part in lines.partition_by("job", as_dict=True, maintain_order=True).items():
            i = members[int(k[0])]
            name = f"{cl.name}-{c['job_id'][i]}" + (f"-a{c['attempt'][i]}" if c["attempt"][i] else "")
            part = part.select("src", "line")
            if chatter:
                hosts = [cl.nodes[int(x)] for x in fleet.jt.nodes(i)]
                app = int((part["src"] == 0).sum())
                extra = _chatter(app * chatter, hosts, rng)
                part = pl.concat([pl.DataFrame({"src": pl.Series(np.zeros(extra.len(), np.int64)), "line": extra}), part])
            nl, nb = _write_job(base / name, part)
            names.append(name)
            n_lines += nl
            n_bytes += nb
    jobs = _jobs_frame(fleet, np.array(order))
    jobs = jobs.with_columns(_folder=pl.Series(names))
    all_jobs = [jobs.with_columns(pl.col("job_id") + (f"-r{r}" if r else ""),
                                  pl.col("_folder") + (f"-r{r}" if r else "")) for r in range(replicas)]
    for r in range(1, replicas):  # hard links: same bytes, new job ids, no extra disk
        for name in names:
            dst = base / f"{name}-r{r}"
            dst.mkdir(exist_ok=True)
            for f in (base / name).iterdir():
                if not (dst / f.name).exists():
                    os.link(f, dst / f.name)
    pl.concat(all_jobs).write_parquet(root / "jobs.parquet")
    info = {"jobs": len(names) * replicas, "lines": n_lines * replicas, "bytes": n_bytes * replicas,
            "unique_lines": n_lines, "replicas": replicas, "chatter": chatter}
    log(f"  data: {info}")
    return info


def make_single_job(root: Path, nodes: int = 64, total_lines: int = 100_000, seed: int = 20250303) -> dict:
    """One failed job of `nodes` nodes, per-node files, padded with chatter to `total_lines` lines."""
    root = Path(root)
    jobs = 4000
    while True:
        fleet = Fleet(SimConfig(jobs=jobs, days=3, seed=seed))
        c = fleet.jt.cols
        ok = np.flatnonzero((c["nnodes"] == nodes) & (c["state"] != "COMPLETED") & c["has_logs"]
                            & (c["missing"] == "") & (c["blame"] == "node"))
        if ok.size:
            break
        jobs *= 2
    i = int(ok[0])
    cl = fleet.clusters[int(c["cidx"][i])]
    lines = fleet.logs([i], cl, int(_day(c["end"])[i]))
    hosts = fleet.hosts[cl.index]
    pad = max(0, total_lines - lines.height)
    rng = np.random.default_rng([seed, 7])
    per = np.full(nodes, pad // nodes)
    per[: pad % nodes] += 1
    n = b = 0
    node_ids = fleet.jt.nodes(i)
    for k, node in enumerate(node_ids):
        host = hosts[int(node)]
        d = root / host
        d.mkdir(parents=True, exist_ok=True)
        mine = lines.filter(pl.col("node") == int(node))
        app = pl.concat([_chatter(int(per[k]), [host], rng), mine.filter(pl.col("src") == 0)["line"]])
        for name, part in (("train.log", app), ("syslog.log", mine.filter(pl.col("src") == 1)["line"])):
            if part.len():
                text = ("\n".join(part.to_list()) + "\n").encode()
                (d / name).write_bytes(text)
                n += part.len()
                b += len(text)
    truth = fleet.truth().filter((pl.col("job_id") == str(c["job_id"][i])) & (pl.col("cluster") == cl.name))
    return {"lines": n, "bytes": b, "nodes": nodes, "job_id": str(c["job_id"][i]),
            "outcome": truth["outcome"][0], "culprit_nodes": truth["culprit_nodes"][0].to_list()}
