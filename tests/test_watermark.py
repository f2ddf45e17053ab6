"""Watermarks, not windows: collect from a durable cursor, diagnose what is pending, commit whole batches.

The replay test runs a simulated day of a fleet on the deployed schedule (collect every 10 minutes,
diagnose 5 minutes later) with runs skipped and killed at every failure point, a scheduler that shows
jobs minutes late and a Loki outage, and holds every failed job to exactly one diagnosis, the same one a
clean run gives.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import polars as pl
import pytest

from faultline.fleet import collect as collect_mod
from faultline.fleet import crashpoints, watermark
from faultline.fleet.config import load_config, write_config
from faultline.taxonomy import FAILED_STATES
from faultline.warehouse.schema import JOB_KEY, TX_TABLES
from faultline.warehouse.store import Warehouse

from .fleet_fixture import END, START, make_fleet

UTC = timezone.utc


def uncommitted_files(wh: Warehouse) -> list[Path]:
    done = wh.committed()
    return [p for t in TX_TABLES for p in wh.files(t) if p.stem not in done]


@pytest.fixture
def kill_at():
    """kill_at("collect.logs"): the next run reaching that point dies there (once)."""
    armed: list[str] = []

    def hook(name: str) -> None:
        if armed and armed[0] == name:
            armed.clear()
            raise crashpoints.SimulatedKill(name)

    crashpoints.arm(hook)
    yield lambda name: armed.append(name)
    crashpoints.arm(None)


def test_collect_reads_from_its_cursor_and_a_rerun_is_a_no_op(tmp_path, ruleset):
    cfg = load_config(make_fleet(tmp_path))
    wh = Warehouse(cfg.warehouse_dir)
    first = watermark.collect(cfg, "alpha", now=datetime(2026, 11, 20, 10, 30, tzinfo=UTC))
    # no cursor yet: the first run reads initial_lookback (60) + lag (15) minutes back, to now
    assert (first["start"], first["end"]) == ("2026-11-20T09:15:00+00:00", "2026-11-20T10:30:00+00:00")
    assert first["jobs"] == 1 and watermark.cursor(wh, "alpha") == datetime(2026, 11, 20, 10, 30, tzinfo=UTC)
    files = sorted(wh.root.rglob("*.parquet"))
    assert watermark.collect(cfg, "alpha", now=datetime(2026, 11, 20, 10, 30, tzinfo=UTC))["batches"] == []
    assert sorted(wh.root.rglob("*.parquet")) == files  # the re-run wrote nothing
    # three slots missed: the next run catches up from the cursor (less the lag) to now
    later = watermark.collect(cfg, "alpha", now=datetime(2026, 11, 20, 12, 0, tzinfo=UTC))
    assert later["start"] == "2026-11-20T10:15:00+00:00" and later["jobs"] == 2  # 1003 (11:01), 1004 (11:20)
    assert sorted(wh.read("jobs")["job_id"]) == ["1001", "1003", "1004"]
    assert watermark.diagnose(cfg, "alpha", ruleset, now=datetime(2026, 11, 20, 12, 5, tzinfo=UTC))["diagnosed"] == 3
    assert watermark.diagnose(cfg, "alpha", ruleset, now=datetime(2026, 11, 20, 12, 15, tzinfo=UTC))["diagnosed"] == 0
    assert wh.sql("SELECT count(*) FROM diagnoses_all").item() == 3


def test_a_collect_killed_between_jobs_and_logs_shows_nothing_and_the_next_run_redoes_it(tmp_path, ruleset, kill_at):
    cfg = load_config(make_fleet(tmp_path))
    wh = Warehouse(cfg.warehouse_dir)
    kill_at("collect.jobs")
    with pytest.raises(crashpoints.SimulatedKill):
        watermark.collect(cfg, "alpha", start=START, end=END)
    assert list((wh.root / "jobs").rglob("*.parquet"))  # the jobs file is there ...
    assert wh.read("jobs").height == 0 and wh.read_window("jobs", START, END).height == 0  # ... but not committed
    assert watermark.cursor(wh, "alpha") is None
    assert watermark.diagnose(cfg, "alpha", ruleset)["diagnosed"] == 0  # nothing diagnosed from half a batch
    got = watermark.collect(cfg, "alpha", start=START, end=END)
    assert got["jobs"] == 4 and not uncommitted_files(wh)  # the killed run's files are gone
    kill_at("diagnose.diagnoses")  # verdicts written, symptoms not: readers see neither
    with pytest.raises(crashpoints.SimulatedKill):
        watermark.diagnose(cfg, "alpha", ruleset)
    assert wh.read("diagnoses").height == 0 and wh.read("symptoms").height == 0
    assert watermark.diagnose(cfg, "alpha", ruleset)["diagnosed"] == 3
    d = wh.read("diagnoses").sort("job_id")
    assert d["job_id"].to_list() == ["1001", "1003", "1004"] and d["outcome"][0] == "gpu_hardware"
    assert wh.read("symptoms").height > 0
    assert wh.sql("SELECT count(*) FROM diagnoses_all").item() == 3


KILLED_COLLECT = """
import sys
from pathlib import Path
from datetime import datetime
from faultline.fleet import watermark
from faultline.fleet.config import load_config
watermark.collect(load_config(Path(sys.argv[1])), "alpha", start=datetime.fromisoformat(sys.argv[2]),
                  end=datetime.fromisoformat(sys.argv[3]))
"""


def test_a_collect_sigkilled_between_logs_and_coverage(tmp_path, ruleset):
    data = make_fleet(tmp_path)
    cfg = load_config(data)
    env = {**os.environ, crashpoints.ENV: "collect.logs"}
    proc = subprocess.run([sys.executable, "-c", KILLED_COLLECT, str(data), START.isoformat(), END.isoformat()],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    wh = Warehouse(cfg.warehouse_dir)
    assert list((wh.root / "logs").rglob("*.parquet")) and not (wh.root / "coverage").exists()
    assert wh.read("jobs").height == wh.read("logs").height == 0
    assert list((wh.root / "_tx").glob("*.json"))  # the dead run's journal names its files
    assert watermark.diagnose(cfg, "alpha", ruleset)["diagnosed"] == 0
    assert watermark.collect(cfg, "alpha", start=START, end=END)["jobs"] == 4
    assert not uncommitted_files(wh) and not list((wh.root / "_tx").glob("*.json"))
    assert watermark.diagnose(cfg, "alpha", ruleset)["diagnosed"] == 3


def test_a_changed_scheduler_row_is_collected_and_diagnosed_again(tmp_path, ruleset):
    data = make_fleet(tmp_path)
    cfg = load_config(data)
    watermark.collect(cfg, "alpha", start=START, end=END)
    watermark.diagnose(cfg, "alpha", ruleset)
    sacct = tmp_path / "sim" / "alpha" / "sacct" / "2026-11-20.txt"
    sacct.write_text(sacct.read_text().replace("1004|sweep|dee|debug|FAILED|1:0", "1004|sweep|dee|debug|FAILED|2:0"))
    again = watermark.collect(cfg, "alpha", start=START, end=END)
    assert again["jobs"] == 1  # only the changed attempt
    assert watermark.diagnose(cfg, "alpha", ruleset)["diagnosed"] == 1
    wh = Warehouse(cfg.warehouse_dir)
    per_job = wh.sql("SELECT job_id, count(*) AS n FROM diagnoses_all GROUP BY 1 ORDER BY 1").rows()
    assert per_job == [("1001", 1), ("1003", 1), ("1004", 2)]
    assert wh.read("diagnoses").filter(pl.col("job_id") == "1004")["inputs"][0] == again["batches"][0]


def test_backfill_collects_history_and_moves_the_cursor(tmp_path, ruleset):
    cfg = load_config(make_fleet(tmp_path))
    now = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)
    out = watermark.backfill(cfg, datetime(2026, 11, 19, tzinfo=UTC), ruleset, until=now)
    assert out[0]["jobs"] == 4 and out[0]["diagnosed"] == 3
    wh = Warehouse(cfg.warehouse_dir)
    assert watermark.cursor(wh, "alpha") == now
    assert watermark.backfill(cfg, datetime(2026, 11, 19, tzinfo=UTC), ruleset, until=now)[0]["jobs"] == 0
    assert watermark.collect(cfg, "alpha", now=now + timedelta(minutes=10))["start"] == "2026-11-22T08:45:00+00:00"


# ------------------------------------------------------------------ a day on the deployed schedule

def _sim_fleet(root: Path, jobs: int = 200, seed: int = 3) -> tuple[Path, pl.DataFrame]:
    from faultline.simulate import SimConfig, simulate

    sim = root / "sim"
    simulate(sim, SimConfig(jobs=jobs, days=1, clusters=1, seed=seed, nodes_per_cluster=96), log=lambda *_: None)
    return sim, pl.read_parquet(sim / "truth.parquet")


def _config(data: Path, sim: Path, cluster: str) -> None:
    write_config(data, [{"name": cluster, "scheduler": {"kind": "sacct_files", "path": str(sim)},
                         "logs": {"kind": "loki_files", "path": str(sim)}}],
                 scheduler_lag_minutes=15, logs_retry_minutes=240)


def test_a_day_on_the_deployed_schedule_diagnoses_every_failed_job_exactly_once(tmp_path, ruleset, monkeypatch):
    sim, truth = _sim_fleet(tmp_path)
    cluster = truth["cluster"][0]
    rng = random.Random(11)
    # the scheduler shows a job 0-12 minutes after it ended (within the 15-minute lag allowance)
    delay = truth.select(*JOB_KEY, _visible=pl.col("end_time")
                         + pl.duration(seconds=pl.Series([rng.randint(0, 720) for _ in range(truth.height)])))
    clock = {"now": None}
    real_jobs, real_logs = collect_mod.scheduler_jobs, collect_mod.fetch_logs

    def late_scheduler(c, start, end):
        jobs, allocs = real_jobs(c, start, end)
        seen = jobs.join(delay, on=JOB_KEY, how="left").filter(pl.col("_visible") <= clock["now"]).drop("_visible")
        return seen, allocs.join(seen.select(JOB_KEY), on=JOB_KEY, how="semi")

    day = datetime.combine(truth["end_time"].min().date(), datetime.min.time(), tzinfo=UTC)
    outage = (day + timedelta(hours=10), day + timedelta(hours=10, minutes=50))

    def flaky_logs(c, failed, margin=15):
        if outage[0] <= clock["now"] < outage[1] and failed.height:
            raise OSError("loki: cannot reach http://loki:3100: [Errno 111] Connection refused")
        return real_logs(c, failed, margin)

    monkeypatch.setattr(collect_mod, "scheduler_jobs", late_scheduler)
    monkeypatch.setattr(collect_mod, "fetch_logs", flaky_logs)

    data = tmp_path / "replay"
    _config(data, sim, cluster)
    cfg = load_config(data)
    armed: list[str] = []

    def hook(name):
        if armed and armed[0] == name:
            armed.clear()
            raise crashpoints.SimulatedKill(name)

    crashpoints.arm(hook)
    stats = {"runs": 0, "skipped": 0, "killed": {}, "held": 0}
    t_replay = time.perf_counter()
    try:
        runs = [(day + timedelta(minutes=10 * i), "collect") for i in range(144)]
        runs += [(day + timedelta(minutes=10 * i + 5), "diagnose") for i in range(144)]
        runs += [(day + timedelta(hours=25), "collect"), (day + timedelta(hours=25, minutes=5), "diagnose")]
        for n, (at, kind) in enumerate(sorted(runs)):
            final = n >= len(runs) - 2
            if not final and rng.random() < 0.15:
                stats["skipped"] += 1
                continue
            if not final and rng.random() < 0.25:
                armed[:] = [rng.choice([p for p in crashpoints.POINTS if p.startswith(kind)])]
            clock["now"] = at
            stats["runs"] += 1
            try:
                if kind == "collect":
                    stats["held"] += watermark.collect(cfg, cluster, now=at)["held"]
                else:
                    watermark.diagnose(cfg, cluster, ruleset, now=at)
            except crashpoints.SimulatedKill as kill:
                stats["killed"][str(kill)] = stats["killed"].get(str(kill), 0) + 1
            armed.clear()
    finally:
        crashpoints.arm(None)
    seconds = time.perf_counter() - t_replay

    wh = Warehouse(cfg.warehouse_dir)
    final_now = day + timedelta(hours=25)
    expected = (truth.join(delay, on=JOB_KEY).filter(pl.col("state").is_in(list(FAILED_STATES))
                                                      & (pl.col("_visible") <= final_now)).select(JOB_KEY))
    rows = wh.read("diagnoses", dedupe=False)
    counts = rows.group_by(JOB_KEY).len()
    print(f"replay: {stats['runs']} runs, {stats['skipped']} skipped, killed {stats['killed']}, "
          f"{stats['held']} job(s) held back during the Loki outage; {expected.height} failed jobs, "
          f"{rows.height} diagnoses, {seconds:.0f} s")
    assert sum(stats["killed"].values()) >= 20 and len(stats["killed"]) == len(crashpoints.POINTS)
    assert stats["held"] > 0
    assert expected.height >= 30
    assert counts["len"].max() == 1, counts.filter(pl.col("len") > 1)  # none twice
    assert sorted(counts.select(JOB_KEY).rows()) == sorted(expected.rows())  # every one once
    assert wh.read("coverage").filter(pl.col("status") == "error").height == 0  # the outage was caught up
    assert not uncommitted_files(wh)  # killed runs left nothing behind

    # the same verdicts as one clean collect + diagnose of the whole day
    clock["now"] = final_now
    ref = tmp_path / "clean"
    _config(ref, sim, cluster)
    rcfg = load_config(ref)
    watermark.collect(rcfg, cluster, now=final_now, start=day - timedelta(days=1), end=final_now)
    watermark.diagnose(rcfg, cluster, ruleset, now=final_now)
    cols = [*JOB_KEY, "outcome", "culprit_nodes", "culprit_ranks", "ambiguous", "confidence", "root_cause"]
    clean = Warehouse(rcfg.warehouse_dir).read("diagnoses").select(cols).sort(JOB_KEY)
    assert rows.select(cols).sort(JOB_KEY).equals(clean)
