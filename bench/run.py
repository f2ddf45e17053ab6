"""faultline benchmark suite: one command, one table. See bench/README.md.

    python bench/run.py [--scenarios S,M,L] [--repeat 3] [--out bench/results.json]
    python bench/run.py --scenarios smoke --repeat 1          # seconds; what tests/test_bench_smoke.py runs

Every stage runs in its own subprocess (peak RSS = that process's ru_maxrss, read with wait4);
seconds are measured inside it around the work only (imports and data generation excluded).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# The faultline of this interpreter (what `faultline` runs), whatever PATH holds.
FAULTLINE = [sys.executable, "-m", "faultline"]
BATCH_BYTES = 192 << 20  # text per ingest batch / Parquet part (jobs are never split)
YEAR = 2025

# name: (failed jobs, chatter lines per simulator applog line, replicas, single-job lines, python-loop lines)
SCENARIOS = {
    "smoke": dict(failed=40, chatter=0, replicas=1, single_lines=20_000, py_lines=20_000, metrics_nodes=16),
    "S": dict(failed=1000, chatter=0, replicas=1, single_lines=100_000, py_lines=100_000, metrics_nodes=128),
    "M": dict(failed=270, chatter=9, replicas=10, single_lines=0, py_lines=100_000),
    "L": dict(failed=270, chatter=9, replicas=100, single_lines=0, py_lines=0, stream=True),  # ~17 min
    "L20": dict(failed=270, chatter=9, replicas=20, single_lines=0, py_lines=0, stream=True),  # L at 1/5, ~4 min
}
STAGES = ["ingest", "extract", "diagnose", "e2e", "stream", "single", "single_cli", "service", "metrics",
          "python_loop", "ripgrep", "ripgrep_unicode"]


# ----------------------------------------------------------------------------- child stages
def _jobs(data: Path):
    import polars as pl
    return pl.read_parquet(data / "jobs.parquet")


def _batches(data: Path) -> list[list[str]]:
    """Job folders in batches of about BATCH_BYTES of text."""
    jobs = _jobs(data)
    out, cur, size = [], [], 0
    for name in jobs["_folder"].to_list():
        b = sum(f.stat().st_size for f in (data / "jobs" / name).iterdir())
        if cur and size + b > BATCH_BYTES:
            out.append(cur)
            cur, size = [], 0
        cur.append(name)
        size += b
    if cur:
        out.append(cur)
    return out


def _read_batch(data: Path, names: list[str], jobs):
    """Files of these job folders -> one frame of lines with key, source, file, seq, node, rank."""
    import numpy as np
    import polars as pl

    from faultline.collectors import files as filecol
    from faultline.logparse import identity_exprs

    key = {r["_folder"]: r for r in jobs.filter(pl.col("_folder").is_in(names)).iter_rows(named=True)}
    blocks, meta, fid, seq, nbytes = [], [], [], [], 0
    for name in names:
        files, _ = filecol.expand([data / "jobs" / name])
        for path in files:
            source, node, rank = filecol.hints(path)
            rep = filecol.FileReport(str(path), source, node, rank)
            k = len(meta)
            meta.append({"cluster": key[name]["cluster"], "job_id": key[name]["job_id"],
                         "attempt": key[name]["attempt"], "source": source, "file": str(path),
                         "_fnode": node, "_frank": rank})
            s0 = 0
            for block in filecol.read_blocks(path, rep):
                blocks.append(block)
                fid.append(np.full(block.height, k, np.int64))
                seq.append(np.arange(s0, s0 + block.height, dtype=np.int64))
                s0 += block.height
            nbytes += rep.bytes
    m = pl.DataFrame(meta, schema={"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32,
                                   "source": pl.String, "file": pl.String, "_fnode": pl.String, "_frank": pl.Int32})
    df = pl.concat(blocks)
    f = pl.Series(np.concatenate(fid))
    df = df.with_columns(**{c: m[c].gather(f) for c in m.columns}, seq=pl.Series(np.concatenate(seq)))
    ident = identity_exprs()  # file-name hints come last, as in pipeline.collect_files
    df = df.with_columns(node=pl.coalesce(ident["node"], pl.col("_fnode")),
                         rank=pl.coalesce(ident["rank"], pl.col("_frank")))
    return df.select("cluster", "job_id", "attempt", "source", "file", "seq", "node", "rank", "line"), nbytes


def _diagnose_frame(df, jobs, rs, lits):
    import polars as pl

    from faultline.logparse import detail_exprs
    from faultline.evidence import COVERAGE_SCHEMA, STATS_SCHEMA, Evidence
    from faultline.pipeline import run_engine
    from faultline.rules.extract import KEY, LOG_SCHEMA, extract_logs, prefilter_expr
    from faultline.taxonomy import SOURCES

    jb = jobs.join(df.select(KEY).unique(), on=KEY, how="semi").drop("_folder")
    stats = df.group_by([*KEY, "node", "rank"]).agg(lines=pl.len().cast(pl.Int64)).cast(STATS_SCHEMA)
    cand = df.filter(prefilter_expr(lits)).with_columns(**detail_exprs(YEAR)).select(list(LOG_SCHEMA))
    symptoms = extract_logs(cand, rs, lits)
    counts = df.group_by([*KEY, "source"]).agg(rows=pl.len().cast(pl.Int64))
    cov = (jb.select(KEY).join(pl.DataFrame({"source": list(SOURCES)}), how="cross")
           .join(counts, on=[*KEY, "source"], how="left").with_columns(pl.col("rows").fill_null(0)))
    cov = cov.with_columns(
        status=pl.when(pl.col("source") == "scheduler").then(pl.lit("ok"))
        .when(pl.col("source") == "k8s_event").then(pl.lit("not_configured"))
        .when(pl.col("rows") > 0).then(pl.lit("ok")).otherwise(pl.lit("empty")),
        reason=pl.lit("")).select(list(COVERAGE_SCHEMA)).cast(COVERAGE_SCHEMA)
    return run_engine(Evidence(jobs=jb, symptoms=symptoms, stats=stats, coverage=cov), rs).diagnoses


def stage_ingest(data: Path) -> dict:
    jobs = _jobs(data)
    out = data / "parquet"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    t0 = time.perf_counter()
    lines = nbytes = 0
    for k, names in enumerate(_batches(data)):
        df, b = _read_batch(data, names, jobs)
        df.write_parquet(out / f"part-{k:05d}.parquet")
        lines += df.height
        nbytes += b
    return {"seconds": time.perf_counter() - t0, "lines": lines, "bytes": nbytes}


def _text_bytes(data: Path) -> int:
    return sum(f.stat().st_size for f in (data / "jobs").rglob("*") if f.is_file())


def stage_extract(data: Path) -> dict:
    import polars as pl

    from faultline.rules.extract import LOG_SCHEMA, extract_logs, prefilter_literals
    from faultline.rules.loader import load_ruleset

    rs = load_ruleset()
    lits = prefilter_literals(rs)
    spent = lines = symptoms = 0.0
    matched = 0
    for part in sorted((data / "parquet").glob("part-*.parquet")):
        df = pl.read_parquet(part).with_columns(local_rank=pl.lit(None, pl.Int32), gpu=pl.lit(None, pl.Int32),
                                                ts=pl.lit(None, LOG_SCHEMA["ts"])).select(list(LOG_SCHEMA))
        t0 = time.perf_counter()
        s = extract_logs(df, rs, lits)
        spent += time.perf_counter() - t0
        lines += df.height
        symptoms += s.height
        matched += s.select("file", "seq").n_unique() if s.height else 0
        del df, s
    return {"seconds": spent, "lines": int(lines), "bytes": _text_bytes(data), "symptoms": int(symptoms),
            "matched_lines": matched, "rules": len(rs.log_rules)}


def stage_diagnose(data: Path) -> dict:
    import polars as pl

    from faultline.rules.extract import prefilter_literals
    from faultline.rules.loader import load_ruleset

    jobs = _jobs(data)
    rs = load_ruleset()
    lits = prefilter_literals(rs)
    t0 = time.perf_counter()
    lines, outcomes = 0, {}
    for part in sorted((data / "parquet").glob("part-*.parquet")):
        df = pl.read_parquet(part)
        lines += df.height
        for d in _diagnose_frame(df, jobs, rs, lits):
            outcomes[d["outcome"]] = outcomes.get(d["outcome"], 0) + 1
        del df
    return {"seconds": time.perf_counter() - t0, "lines": lines, "bytes": _text_bytes(data),
            "diagnoses": sum(outcomes.values()), "outcomes": outcomes}


def stage_stream(data: Path) -> dict:
    """Ingest + diagnose batch by batch (scenario L): Parquet parts are written, diagnosed, deleted."""
    import polars as pl

    from faultline.rules.extract import prefilter_literals
    from faultline.rules.loader import load_ruleset

    jobs = _jobs(data)
    rs = load_ruleset()
    lits = prefilter_literals(rs)
    out = data / "stream"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    t0 = time.perf_counter()
    lines = nbytes = ndiag = 0
    for k, names in enumerate(_batches(data)):
        df, b = _read_batch(data, names, jobs)
        part = out / f"part-{k:05d}.parquet"
        df.write_parquet(part)
        del df
        df = pl.read_parquet(part)
        ndiag += len(_diagnose_frame(df, jobs, rs, lits))
        lines += df.height
        nbytes += b
        del df
        part.unlink()
    return {"seconds": time.perf_counter() - t0, "lines": lines, "bytes": nbytes, "diagnoses": ndiag}


def stage_single(data: Path) -> dict:
    from faultline.pipeline import diagnose_files
    from faultline.rules.loader import load_ruleset

    t0 = time.perf_counter()
    rs = load_ruleset()
    t1 = time.perf_counter()
    d = diagnose_files([data / "single"], rs)
    t2 = time.perf_counter()
    files = [f for f in (data / "single").rglob("*") if f.is_file()]
    lines = sum(1 for f in files for _ in f.open("rb"))
    return {"seconds": t2 - t0, "load_ruleset_s": t1 - t0, "lines": lines,
            "bytes": sum(f.stat().st_size for f in files), "outcome": d["outcome"], "culprit": d["culprit"]["nodes"]}


def stage_python(data: Path, limit: int) -> dict:
    from baselines import python_loop

    from faultline.rules.loader import load_ruleset

    names = _jobs(data)["_folder"].to_list()
    return python_loop([data / "jobs" / n for n in names], load_ruleset(), limit or None)


def make_metrics_day(data: Path, nodes: int, jobs: int, seed: int = 7) -> dict:
    """A fleet day of DCGM (5 fields x 8 GPUs) and InfiniBand (4 counters x 2 ports) samples every 30 s for
    `nodes` nodes, and `jobs` failed jobs of 1-16 nodes on them; one job in ten has a fault only the metrics
    show (an Xid, a DBE, an IB link down or a symbol-error storm on one of its nodes)."""
    import numpy as np
    import polars as pl

    rng = np.random.default_rng(seed)
    day0 = np.datetime64("2026-11-20T00:00:00", "us")
    steps = np.arange(0, 86400, 30, dtype=np.int64) * 1_000_000
    gpu_names = ["DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_PENDING",
                 "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_GPU_TEMP"]
    ib_names = ["node_infiniband_link_downed_total", "node_infiniband_symbol_error_total",
                "node_infiniband_port_errors_received_total", "node_infiniband_link_error_recovery_total"]
    series = [(f"gpu{n:04d}", g, name, "{}") for n in range(nodes) for g in range(8) for name in gpu_names]
    series += [(f"gpu{n:04d}", None, name, f'{{"device":"mlx5_{p}","port":"1"}}')
               for n in range(nodes) for p in range(2) for name in ib_names]
    meta = pl.DataFrame(series, schema={"node": pl.String, "gpu": pl.Int32, "name": pl.String, "labels": pl.String},
                        orient="row").with_row_index("_s")
    k = len(steps)
    values = np.where(np.char.startswith(meta["name"].to_numpy().astype(str), "DCGM_FI_DEV_GPU_TEMP"), 60.0, 0.0)
    frame = pl.DataFrame({"_s": np.repeat(np.arange(meta.height, dtype=np.uint32), k),
                          "ts": np.tile(day0 + steps.astype("timedelta64[us]"), meta.height),
                          "value": np.repeat(values, k)})
    # jobs
    starts = rng.integers(0, 86400 - 7200, jobs)
    durs = rng.integers(600, 6 * 3600, jobs)
    sizes = np.minimum(rng.choice([1, 2, 4, 8, 16], jobs), nodes)
    firsts = rng.integers(0, nodes - sizes + 1)
    job_rows, faults = [], []
    for j in range(jobs):
        ns = [f"gpu{firsts[j] + i:04d}" for i in range(sizes[j])]
        t0 = day0 + np.timedelta64(int(starts[j]), "s")
        t1 = t0 + np.timedelta64(int(durs[j]), "s")
        job_rows.append({"cluster": "alpha", "job_id": str(900000 + j), "attempt": 0,
                         "start_time": int(t0.astype("int64")), "end_time": int(t1.astype("int64")), "nodes": ns})
        if j % 10 == 0:
            faults.append((ns[-1], t0 + np.timedelta64(int(durs[j] // 2), "s"), j % 40))
    frame = frame.join(meta, on="_s").drop("_s")
    for node, at, kind in faults:  # the fault's series steps up at `at` and stays
        name, gpu = {0: ("DCGM_FI_DEV_XID_ERRORS", 3), 10: ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 5),
                     20: ("node_infiniband_link_downed_total", None), 30: ("node_infiniband_symbol_error_total", None)}[kind]
        hit = (pl.col("node") == node) & (pl.col("name") == name) & (pl.col("ts") >= at)
        hit = hit & (pl.col("gpu") == gpu if gpu is not None else pl.col("labels").str.contains("mlx5_0"))
        frame = frame.with_columns(value=pl.when(hit).then(pl.lit(79.0 if kind == 0 else 500.0)).otherwise("value"))
    frame = frame.with_columns(cluster=pl.lit("alpha"), ts=pl.col("ts").dt.replace_time_zone("UTC"))
    frame.write_parquet(data / "metrics.parquet")
    pl.DataFrame(job_rows).with_columns(pl.col("start_time", "end_time").cast(pl.Datetime("us", "UTC")),
                                        pl.col("attempt").cast(pl.Int32)).write_parquet(data / "metric_jobs.parquet")
    return {"samples": frame.height, "series": meta.height, "jobs": jobs, "faults": len(faults)}


def stage_metrics(data: Path) -> dict:
    """Every metric rule over a fleet day of samples and the day's failed jobs, at once."""
    import polars as pl

    from faultline.rules.loader import load_ruleset
    from faultline.rules.metric import extract_metrics

    rs = load_ruleset()
    t0 = time.perf_counter()
    metrics = pl.read_parquet(data / "metrics.parquet")
    jobs = pl.read_parquet(data / "metric_jobs.parquet")
    sym = extract_metrics(metrics, jobs, rs)
    spent = time.perf_counter() - t0
    return {"seconds": spent, "lines": metrics.height, "bytes": 0, "symptoms": sym.height,
            "jobs_with_symptoms": sym.filter(pl.col("role") != "context")["job_id"].n_unique(),
            "rules": len(rs.metric_rules)}


CHILD = {"metrics": stage_metrics, "ingest": stage_ingest, "extract": stage_extract, "diagnose": stage_diagnose, "stream": stage_stream,
         "single": stage_single}


# ----------------------------------------------------------------------------- parent
def _child(cmd: list[str], env=None, ok: tuple[int, ...] = (0,), cwd=None) -> tuple[dict, float, int]:
    """Run a command; (its JSON result line or {}, wall seconds, peak RSS in bytes) via wait4.
    `ok`: the exit codes that mean success (`faultline diagnose` exits 1 for a diagnosed failure)."""
    # GNU time reports the command's own peak; wait4 from this (large) process would also count the
    # pages of the fork before exec.
    gtime = shutil.which("time") if Path("/usr/bin/time").exists() else None
    if gtime:
        cmd = ["/usr/bin/time", "-f", "BENCH_MAXRSS_KB %M\nBENCH_CPU_S %U %S", *cmd]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    # Both pipes drained at once: a child that fills stderr first (ripgrep echoing a 100 KB pattern set it
    # cannot parse) would block on it while this read waited for stdout's end.
    errs: list[bytes] = []
    drain = threading.Thread(target=lambda: errs.append(p.stderr.read()), daemon=True)
    drain.start()
    out = p.stdout.read()
    drain.join()
    err = errs[0]
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if p.returncode not in ok:
        raise RuntimeError(f"{' '.join(cmd[:6])} failed ({p.returncode}): {err.decode()[-2000:]}")
    rss = ru.ru_maxrss * 1024
    for line in err.decode().splitlines():
        if line.startswith("BENCH_MAXRSS_KB "):
            rss = int(line.split()[1]) * 1024
    res = {}
    for line in err.decode().splitlines():
        if line.startswith("BENCH_CPU_S "):  # user + system seconds of the command, all threads
            res["cpu_s"] = sum(map(float, line.split()[1:]))
    for line in out.decode().splitlines():
        if line.startswith("BENCH_RESULT "):
            res = json.loads(line[len("BENCH_RESULT "):])
    return res, wall, rss, out


def _py_stage(stage: str, data: Path, *extra: str):
    res, wall, rss, _ = _child([sys.executable, str(HERE / "run.py"), "--stage", stage, "--data", str(data), *extra])
    return res, rss


def _rg(data: Path, patterns: Path):
    rg = shutil.which("rg")
    if rg is None:
        return None
    res, wall, rss, out = _child([rg, "-c", "--no-messages", "-f", str(patterns), str(data / "jobs")])
    matched = sum(int(line.rsplit(":", 1)[1]) for line in out.decode().splitlines() if ":" in line)
    return {"seconds": wall, "matched_lines": matched}, rss


def _free_port() -> int:
    import socket
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def _peak_rss(pid: int) -> int:
    """VmHWM of a running process (its peak resident set so far), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def service_latency(job: Path, requests: int, log) -> dict:
    """Start `faultline serve`, POST the job's files inline `requests` times (after 2 warm-ups), stop it."""
    import base64
    import tempfile

    import httpx

    files = sorted(f for f in job.rglob("*") if f.is_file())
    body = json.dumps({"job_id": "bench", "state": "FAILED", "files": [
        {"name": str(f.relative_to(job)), "base64": base64.b64encode(f.read_bytes()).decode()} for f in files]})
    lines = sum(f.read_bytes().count(b"\n") for f in files)
    port = _free_port()
    with tempfile.TemporaryDirectory() as cwd:  # no data/faultline.yaml there: inline diagnosis only
        server = subprocess.Popen([*FAULTLINE, "serve", "--host", "127.0.0.1", "--port", str(port)], cwd=cwd,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            with httpx.Client(timeout=120) as client:
                deadline = time.monotonic() + 120
                while True:
                    try:
                        if client.get(url + "/healthz").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("faultline serve did not come up")
                    time.sleep(0.2)
                headers = {"content-type": "application/json"}
                latencies, outcome = [], None
                for k in range(requests + 2):
                    t0 = time.perf_counter()
                    r = client.post(url + "/v1/diagnose", content=body, headers=headers)
                    dt = time.perf_counter() - t0
                    r.raise_for_status()
                    outcome = r.json()["outcome"]
                    if k >= 2:
                        latencies.append(dt)
            peak = _peak_rss(server.pid)
        finally:
            server.terminate()
            server.wait(timeout=30)
    latencies.sort()
    return {"seconds": statistics.median(latencies), "latencies_s": latencies,
            "p95_s": latencies[min(len(latencies) - 1, int(round(0.95 * (len(latencies) - 1))))],
            "lines": lines, "bytes": sum(f.stat().st_size for f in files), "peak_rss": peak, "outcome": outcome}


def _median_run(fn, repeat: int) -> tuple[dict, list[float], int]:
    runs, peak, last = [], 0, {}
    for _ in range(repeat):
        res, rss = fn()
        runs.append(res["seconds"])
        peak = max(peak, rss)
        last = res
    return last, runs, peak


def run_scenario(name: str, work: Path, repeat: int, log, stages: set[str] | None = None,
                 reuse: bool = False) -> list[dict]:
    from baselines import rg_patterns
    from data import make_fleet_scenario, make_single_job

    from faultline.rules.loader import load_ruleset

    spec = SCENARIOS[name]
    data = work / name
    want = lambda stage: stages is None or stage in stages  # noqa: E731
    info_file = data / "info.json"
    if reuse and info_file.exists():
        info = json.loads(info_file.read_text())
        log(f"  [{name}] reusing data in {data}")
    else:
        shutil.rmtree(data, ignore_errors=True)
        t0 = time.perf_counter()
        info = make_fleet_scenario(data, spec["failed"], chatter=spec["chatter"], replicas=spec["replicas"], log=log)
        if spec["single_lines"]:
            info["single"] = make_single_job(data / "single", total_lines=spec["single_lines"])
        info_file.write_text(json.dumps(info, default=str))
        log(f"  [{name}] data generated in {time.perf_counter() - t0:.1f}s")
    rs = load_ruleset()
    pats, pats_u = data / "patterns.txt", data / "patterns_unicode.txt"
    pats.write_text("\n".join(rg_patterns(rs)) + "\n")
    pats_u.write_text("\n".join(rg_patterns(rs, unicode=True)) + "\n")
    rows: list[dict] = []

    def row(stage, res, runs, peak, **kw):
        r = {"stage": stage, "scenario": name, "lines": res.get("lines"), "bytes": res.get("bytes"),
             "median_s": statistics.median(runs) if runs else None, "runs_s": runs, "peak_rss": peak, **kw}
        rows.append(r)
        log(f"  [{name}] {stage}: {r['median_s'] if r['median_s'] is None else round(r['median_s'], 3)} s "
            f"(runs {[round(x, 3) for x in runs]}), peak {peak / 2**20:.0f} MiB")
        return r

    # baselines first (the text is in the page cache for everyone after generation)
    rg = rg_u = None
    if not want("ripgrep"):
        pass
    elif shutil.which("rg"):
        res, runs, peak = _median_run(lambda: _rg(data, pats), repeat)
        rg = row("ripgrep", {**res, "lines": info["lines"], "bytes": info["bytes"]}, runs, peak,
                 patterns=len(rs.log_rules), matched_lines=res["matched_lines"])
        if name in ("smoke", "S") and want("ripgrep_unicode"):
            res, runs, peak = _median_run(lambda: _rg(data, pats_u), 1)
            rg_u = row("ripgrep_unicode", {**res, "lines": info["lines"], "bytes": info["bytes"]}, runs, peak,
                       patterns=len(rs.log_rules), note="same patterns without (?-u), 1 run")
    else:
        row("ripgrep", {}, [], 0, note="rg not installed (apt-get install ripgrep): skipped")
    py = None
    if spec["py_lines"] and want("python_loop"):
        res, runs, peak = _median_run(lambda: _py_stage("python", data, "--limit", str(spec["py_lines"])), repeat)
        py = row("python_loop", res, runs, peak, patterns=res["patterns"], refused=res["refused"],
                 note=f"first {res['lines']:,} lines; rate extrapolates")

    if spec.get("stream") and want("stream"):
        res, runs, peak = _median_run(lambda: _py_stage("stream", data), 1)
        row("stream", res, runs, peak, diagnoses=res["diagnoses"],
            note=f"ingest+diagnose batch by batch, {info['replicas']} replicas of {info['unique_lines']:,} lines")
    elif not spec.get("stream"):
        ing = dg = None
        needs_parquet = (want("extract") or want("diagnose")) and not (data / "parquet").is_dir()
        if want("ingest") or needs_parquet:  # extract and diagnose read its Parquet
            ing = row("ingest", *_median_run(lambda: _py_stage("ingest", data), repeat))
        if want("extract"):
            res, runs, peak = _median_run(lambda: _py_stage("extract", data), repeat)
            row("extract", res, runs, peak, rules=res["rules"], symptoms=res["symptoms"], matched_lines=res["matched_lines"])
        if want("diagnose"):
            res, runs, peak = _median_run(lambda: _py_stage("diagnose", data), repeat)
            dg = row("diagnose", res, runs, peak, diagnoses=res["diagnoses"], outcomes=res["outcomes"])
        if ing and dg:
            rows.append({"stage": "e2e", "scenario": name, "lines": dg["lines"], "bytes": dg["bytes"],
                         "median_s": ing["median_s"] + dg["median_s"], "runs_s": [],
                         "peak_rss": max(ing["peak_rss"], dg["peak_rss"]), "note": "ingest + diagnose"})
    if spec["single_lines"] and want("single"):
        res, runs, peak = _median_run(lambda: _py_stage("single", data), repeat)
        row("single", res, runs, peak, outcome=res["outcome"], culprit=res["culprit"],
            load_ruleset_s=res["load_ruleset_s"], nodes=64)
        def cli():
            _, wall, rss, out = _child([*FAULTLINE, "diagnose", str(data / "single"), "--format", "json"],
                                         ok=(0, 1, 3, 4))
            return {"seconds": wall}, rss
        res, runs, peak = _median_run(cli, repeat)
        row("single_cli", {"lines": rows[-1]["lines"], "bytes": rows[-1]["bytes"], **res}, runs, peak,
            note="`faultline diagnose DIR --format json` wall time, interpreter start-up included")
    if spec["single_lines"] and want("service"):
        res = service_latency(data / "single", requests=max(20, 5 * repeat), log=log)
        row("service", res, res["latencies_s"], res["peak_rss"], p95_s=res["p95_s"], outcome=res["outcome"],
            note=f"POST /v1/diagnose, the 64-node job inline as JSON, {len(res['latencies_s'])} requests to one "
                 f"`faultline serve` (ruleset loaded at start-up); client-side latency, p95 {res['p95_s']:.3f} s")

    if spec.get("metrics_nodes") and want("metrics"):
        if not (data / "metrics.parquet").is_file():
            minfo = make_metrics_day(data, spec["metrics_nodes"], jobs=max(20, spec["metrics_nodes"] * 2))
            (data / "metrics_info.json").write_text(json.dumps(minfo))
        minfo = json.loads((data / "metrics_info.json").read_text())
        res, runs, peak = _median_run(lambda: _py_stage("metrics", data), repeat)
        row("metrics", res, runs, peak, symptoms=res["symptoms"], rules=res["rules"],
            note=f"a day of DCGM + IB samples (30 s) of {spec['metrics_nodes']} nodes, {minfo['series']:,} series, "
                 f"{minfo['jobs']} failed jobs ({minfo['faults']} with a metrics-only fault; "
                 f"{res['jobs_with_symptoms']} got a non-context metric symptom) through {res['rules']} metric rules")

    # ratios against the baselines of the same scenario
    rg_s = rg["median_s"] if rg and rg.get("median_s") else None
    py_rate = py["lines"] / py["median_s"] if py and py.get("median_s") else None
    for r in rows:
        r["info"] = None
        if r["median_s"] and r["lines"]:
            r["lines_per_s"] = r["lines"] / r["median_s"]
            r["mb_per_s"] = r["bytes"] / 2**20 / r["median_s"] if r["bytes"] else None
            same_bytes = r["stage"] in ("extract", "diagnose", "e2e", "ingest", "stream", "ripgrep_unicode")
            r["vs_rg"] = r["median_s"] / rg_s if rg_s and same_bytes else None
            r["vs_py"] = r["lines_per_s"] / py_rate if py_rate and r["stage"] not in ("python_loop", "metrics") else None
    if rows:
        rows[0]["info"] = info
    return rows


# ----------------------------------------------------------------------------- bigfile
BIGFILES = {"bigfile": 2_000_000, "bigfile2g": 20_000_000, "bigfile_smoke": 50_000}


def stage_bigpy(path: Path, limit: int) -> dict:
    from bigfile import python_loop, typical_regexes

    from faultline.rules.loader import load_ruleset
    return python_loop(path, typical_regexes(load_ruleset()), limit or None)


def run_bigfile(name: str, work: Path, repeat: int, log, reuse: bool = False, py_lines: int = 200_000,
                baseline_src: str | None = None) -> list[dict]:
    """One big combined log through `faultline diagnose FILE --format json` (a whole process) against
    ripgrep (the ~36 typical failure patterns, byte mode) and the per-line Python `re.search` loop over
    the same patterns and bytes, in the same run."""
    import re as _re

    from bigfile import TYPICAL_RULES, make_bigfile, typical_regexes

    from faultline.rules.loader import load_ruleset

    data = work / name
    data.mkdir(parents=True, exist_ok=True)
    path, info_file = data / "big.log", data / "info.json"
    if reuse and info_file.exists() and path.exists():
        info = json.loads(info_file.read_text())
        log(f"  [{name}] reusing {path}")
    else:
        info = make_bigfile(path, BIGFILES[name])
        info_file.write_text(json.dumps(info))
        log(f"  [{name}] {info['lines']:,} lines, {info['bytes'] / 2**20:.0f} MiB written in {info['seconds']:.1f}s")
    rs = load_ruleset()
    named = _re.compile(r"\(\?P<\w+>")
    pats = data / "patterns36.txt"
    pats.write_text("\n".join(f"(?:(?-u){named.sub('(?:', x)})" for x in typical_regexes(rs)) + "\n")
    rows: list[dict] = []

    def row(stage, res, runs, peak, **kw):
        r = {"stage": stage, "scenario": name, "lines": res.get("lines", info["lines"]),
             "bytes": res.get("bytes", info["bytes"]), "median_s": statistics.median(runs) if runs else None,
             "runs_s": runs, "peak_rss": peak, **kw}
        rows.append(r)
        log(f"  [{name}] {stage}: {r['median_s'] if r['median_s'] is None else round(r['median_s'], 3)} s "
            f"(runs {[round(x, 3) for x in runs]}), peak {peak / 2**20:.0f} MiB")
        return r

    cpu: dict[str, list[float]] = {"ripgrep": [], "diagnose_cli": [], "diagnose_cli_base": []}

    # Bytecode is written (PYTHONDONTWRITEBYTECODE off) and reused after the warm-up, as in an installed
    # faultline: compiling its modules from source on every start would be ~0.1 s a run no user pays.
    env_cli = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

    def cli(env=None):
        # `python -m` puts the working folder first on sys.path: the baseline runs from its own tree
        res, wall, rss, out = _child([*FAULTLINE, "diagnose", str(path), "--format", "json"], env=env or env_cli,
                                     ok=(0, 1, 3, 4), cwd=baseline_src if env else None)
        cpu["diagnose_cli_base" if env else "diagnose_cli"].append(res.get("cpu_s"))
        return {"seconds": wall, "outcome": json.loads(out)["outcome"]}, rss

    def rg():
        res, wall, rss, out = _child([shutil.which("rg"), "-c", "--no-messages", "-f", str(pats), str(path)])
        cpu["ripgrep"].append(res.get("cpu_s"))
        return {"seconds": wall, "matched_lines": int(out.decode().strip() or 0)}, rss

    env_base = None
    if baseline_src:
        env_base = {**env_cli, "PYTHONPATH": baseline_src}
    cli()  # warm-up: the file in the page cache, the ruleset cache and bytecode written, for every row alike
    if env_base:
        cli(env_base)
    cpu["diagnose_cli"].clear()
    cpu["diagnose_cli_base"].clear()
    # interleaved, so that the load of a shared machine falls on every row alike
    rg_runs, cli_runs, base_runs, rg_peak, cli_peak, base_peak = [], [], [], 0, 0, 0
    outcome = matched = None
    for _ in range(repeat):
        if shutil.which("rg"):
            res, rss = rg()
            rg_runs.append(res["seconds"])
            rg_peak, matched = max(rg_peak, rss), res["matched_lines"]
        res, rss = cli()
        cli_runs.append(res["seconds"])
        cli_peak, outcome = max(cli_peak, rss), res["outcome"]
        if env_base:
            res, rss = cli(env_base)
            base_runs.append(res["seconds"])
            base_peak = max(base_peak, rss)
    rg_row = row("ripgrep", {}, rg_runs, rg_peak, patterns=len(TYPICAL_RULES), matched_lines=matched,
                 note="rg -c -f patterns36.txt FILE (byte mode)") if rg_runs else None
    py = None
    if py_lines:
        res, runs, peak = _median_run(lambda: _py_stage_big(path, py_lines), repeat)
        py = row("python_loop", res, runs, peak, patterns=res["patterns"], cpu_s=res["cpu_s"],
                 matched_lines=res["matched_lines"],
                 note=f"re.search of the {res['patterns']} patterns per line, first {res['lines']:,} lines; rate extrapolates")
    row("diagnose_cli", {}, cli_runs, cli_peak, outcome=outcome,
        note="`python -m faultline diagnose FILE --format json`, whole process")
    if base_runs:
        row("diagnose_cli_base", {}, base_runs, base_peak, note=f"the same, code at {baseline_src}")
    for r in rows:  # CPU seconds (user + system, all threads): what a loaded shared machine distorts least
        if r["stage"] in cpu:
            c = [x for x in cpu[r["stage"]] if x is not None]
            r["cpu_s"] = statistics.median(c) if c else None
    rg_s = rg_row["median_s"] if rg_row else None
    py_rate = py["lines"] / py["median_s"] if py else None
    for r in rows:
        r["info"] = None
        r["lines_per_s"] = r["lines"] / r["median_s"] if r["median_s"] else None
        r["mb_per_s"] = r["bytes"] / 2**20 / r["median_s"] if r["median_s"] else None
        r["vs_rg"] = r["median_s"] / rg_s if rg_s and r["stage"].startswith("diagnose") else None
        r["vs_py"] = r["lines_per_s"] / py_rate if py_rate and r["stage"] != "python_loop" and r["lines_per_s"] else None
        # the same ratios from CPU seconds
        rg_c = rg_row.get("cpu_s") if rg_row else None
        py_c = py["lines"] / py["cpu_s"] if py and py.get("cpu_s") else None
        r["vs_rg_cpu"] = r["cpu_s"] / rg_c if rg_c and r.get("cpu_s") and r["stage"].startswith("diagnose") else None
        r["vs_py_cpu"] = (r["lines"] / r["cpu_s"] / py_c if py_c and r.get("cpu_s") and r["stage"] != "python_loop"
                          else None)
    rows[0]["info"] = info
    return rows


def _py_stage_big(path: Path, limit: int):
    res, wall, rss, _ = _child([sys.executable, str(HERE / "run.py"), "--stage", "bigpy", "--data", str(path),
                                "--limit", str(limit)])
    return res, rss


def fmt_table(rows: list[dict]) -> str:
    head = ["stage", "scen", "lines", "MB", "median s", "lines/s", "MB/s", "x rg time", "x py speed", "peak RSS"]
    if any(r.get("cpu_s") for r in rows):
        head += ["CPU s", "x rg CPU", "x py CPU"]
    out = [head]
    for r in rows:
        def f(v, spec):
            return "-" if v is None else format(v, spec)
        out.append([r["stage"], r["scenario"], f(r.get("lines"), ","), f(r["bytes"] / 2**20 if r.get("bytes") else None, ".0f"),
                    f(r.get("median_s"), ".3f"), f(r.get("lines_per_s"), ",.0f"), f(r.get("mb_per_s"), ".0f"),
                    f(r.get("vs_rg"), ".2f"), f(r.get("vs_py"), ".1f"),
                    "-" if not r.get("peak_rss") else f"{r['peak_rss'] / 2**20:.0f} MiB"]
                   + ([f(r.get("cpu_s"), ".2f"), f(r.get("vs_rg_cpu"), ".2f"), f(r.get("vs_py_cpu"), ".1f")]
                      if len(head) > 10 else []))
    w = [max(len(str(row[i])) for row in out) for i in range(len(head))]
    lines = ["| " + " | ".join(str(c).ljust(w[i]) for i, c in enumerate(row)) + " |" for row in out]
    lines.insert(1, "|" + "|".join("-" * (x + 2) for x in w) + "|")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="S")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None, help="write all figures as JSON here")
    ap.add_argument("--workdir", default=None, help="where scenario data goes (default: a temp dir under /work or /tmp)")
    ap.add_argument("--keep-data", action="store_true")
    ap.add_argument("--reuse-data", action="store_true",
                    help="with --workdir: use scenario data left there by an earlier --keep-data run")
    ap.add_argument("--stages", default=None,
                    help=f"comma-separated subset of {','.join(STAGES)} (default: all)")
    ap.add_argument("--bigfile-2g", action="store_true",
                    help="also the ~2 GB bigfile log (20 M lines; ~5 GB of disk with the 210 MB one, minutes)")
    ap.add_argument("--bigfile-py-lines", type=int, default=200_000,
                    help="lines the bigfile Python-loop baseline reads (its rate extrapolates; 0: all)")
    ap.add_argument("--baseline-src", default=None,
                    help="bigfile: also time the CLI with PYTHONPATH=this source tree (e.g. a git worktree of main)")
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.stage:  # child mode
        data = Path(a.data)
        res = (stage_python(data, a.limit) if a.stage == "python" else stage_bigpy(data, a.limit)
               if a.stage == "bigpy" else CHILD[a.stage](data))
        print("BENCH_RESULT " + json.dumps(res))
        return 0
    import tempfile
    base = a.workdir or ("/work" if Path("/work").is_dir() and os.access("/work", os.W_OK) else None)
    if a.reuse_data and not a.workdir:
        ap.error("--reuse-data needs --workdir")
    keep = a.keep_data or a.reuse_data
    if keep and a.workdir:  # kept data sits at WORKDIR/<scenario>, where --reuse-data looks
        work = Path(a.workdir)
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="faultline-bench-", dir=base))
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    rows: list[dict] = []
    try:
        names = [n.strip() for n in a.scenarios.split(",")]
        if a.bigfile_2g and "bigfile2g" not in names:
            names.append("bigfile2g")
        for name in names:
            log(f"scenario {name}")
            if name in BIGFILES:
                rows += run_bigfile(name, work, a.repeat, log, a.reuse_data, a.bigfile_py_lines, a.baseline_src)
            else:
                rows += run_scenario(name, work, a.repeat, log,
                                     set(a.stages.split(",")) if a.stages else None, a.reuse_data)
            if not keep:
                shutil.rmtree(work / name, ignore_errors=True)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    print(fmt_table(rows))
    if a.out:
        import polars as pl
        doc = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                           "polars": pl.__version__,
                           "ripgrep": subprocess.run(["rg", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
                           if shutil.which("rg") else None},
               "repeat": a.repeat, "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "rows": rows}
        Path(a.out).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
