"""The sacct collector and node-state collector against a real one-node Slurm 22.05 (tests/slurm_cluster.py):
real COMPLETED, FAILED, TIMEOUT and CANCELLED jobs collected, then diagnosed from their own output files
and by reference through the fleet path.

OUT_OF_MEMORY is not produced: Slurm sets it only when a step's cgroup reports an OOM kill (task/cgroup
with ConstrainRAMSpace), and this cluster runs without systemd or a delegated cgroup tree (task/none,
proctrack/linuxproc), so a job that exhausts memory here is killed by the kernel and ends FAILED. The
OUT_OF_MEMORY mapping is covered by the sacct-text tests.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import polars as pl
import pytest

from faultline.fleet.collect import collect_cluster
from faultline.fleet.config import load_config, write_config
from faultline.fleet.single import diagnose_one
from faultline.pipeline import diagnose_files

from .slurm_cluster import MISSING, NODE, REASON, SlurmCluster

pytestmark = pytest.mark.skipif(bool(MISSING), reason=REASON)

# Written by us from the printers' formats: a torchrun rank's traceback and Python's import error.
FAILING = """echo "[rank0]: step 10 loss 2.2143"
echo "[rank0]: Traceback (most recent call last):"
echo '[rank0]:   File "/opt/train/main.py", line 12, in <module>'
echo "[rank0]:     import flash_attn"
echo "[rank0]: ModuleNotFoundError: No module named 'flash_attn'"
exit 3"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    try:
        t0 = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(seconds=5)
        jobs = {
            "TIMEOUT": cluster.sbatch("echo '[rank0]: step 1 loss 9.1'; sleep 600", "--time=1", "--job-name=tlimit"),
            "CANCELLED": cluster.sbatch("sleep 600", "--job-name=cancelme"),
            "COMPLETED": cluster.sbatch("echo '[rank0]: step 10 loss 2.2'", "--job-name=ok"),
            "FAILED": cluster.sbatch(FAILING, "--job-name=broken"),
        }
        deadline = time.monotonic() + 60
        while cluster.run("squeue", "-h", "-j", jobs["CANCELLED"], "-o", "%T").strip() != "RUNNING":
            assert time.monotonic() < deadline, "the job to cancel never ran"
            time.sleep(1)
        cluster.run("scancel", jobs["CANCELLED"])
        states = cluster.wait_done(list(jobs.values()), timeout=300)
        # A drain with a reason, as an operator or a health check sets it (after the jobs: it blocks the node).
        cluster.run("scontrol", "update", f"nodename={NODE}", "state=drain", "reason=healthcheck: GPU 3 Xid 79")
        cluster.t0, cluster.t1 = t0, datetime.now(timezone.utc) + timedelta(seconds=5)
        cluster.jobs, cluster.states = jobs, states
        yield cluster
    finally:
        cluster.stop()


def fleet(tmp_path: Path, slurm: SlurmCluster) -> Path:
    write_config(tmp_path, [{"name": "faultline", "scheduler": {"kind": "sacct"}}])
    return tmp_path


def test_real_jobs_end_in_the_states_asked_for(slurm):
    assert {want: slurm.states[j].split()[0] for want, j in slurm.jobs.items()} == {
        "TIMEOUT": "TIMEOUT", "CANCELLED": "CANCELLED", "COMPLETED": "COMPLETED", "FAILED": "FAILED"}


def test_sacct_collector_reads_a_real_slurm_in_utc(slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    monkeypatch.setenv("TZ", "Asia/Kolkata")  # the caller's zone must not shift the times (+05:30)
    cfg = load_config(fleet(tmp_path, slurm))
    got = collect_cluster(cfg.clusters[0], slurm.t0, slurm.t1)
    jobs = {r["job_id"]: r for r in got.jobs.iter_rows(named=True)}
    by_state = {want: jobs[j] for want, j in slurm.jobs.items()}
    assert {k: v["state"] for k, v in by_state.items()} == {k: k for k in by_state}
    assert by_state["FAILED"]["exit_code"] == 3 and by_state["FAILED"]["signal"] == 0  # from the text, not JSON
    assert by_state["CANCELLED"]["raw_state"].startswith("CANCELLED by ")
    for row in by_state.values():
        assert row["nodes"] == [NODE] and row["scheduler"] == "slurm"
        assert slurm.t0 - timedelta(minutes=1) <= row["end_time"] <= slurm.t1 + timedelta(minutes=1), row
    timeout = by_state["TIMEOUT"]
    assert timedelta(seconds=55) <= timeout["end_time"] - timeout["start_time"] <= timedelta(minutes=4)
    assert set(got.allocations["node"]) == {NODE}
    # the drain, from sinfo -R, in node_events
    ev = got.node_events.filter(pl.col("node") == NODE).row(0, named=True)
    assert ev["kind"] == "drain" and ev["reason"].startswith("healthcheck: GPU 3 Xid 79")
    assert slurm.t0 - timedelta(minutes=1) <= ev["ts"] <= slurm.t1 + timedelta(minutes=1)
    failed = got.coverage.filter(pl.col("source") == "scheduler")
    assert set(failed["job_id"]) == {slurm.jobs[s] for s in ("TIMEOUT", "CANCELLED", "FAILED")}


def test_real_jobs_are_diagnosed_from_their_output_and_state(slurm, ruleset):
    out = Path(slurm.env["SLURM_CONF"]).parent / "jobs"
    want = {"TIMEOUT": "scheduler_timelimit", "CANCELLED": "scheduler_preemption_cancel",
            "FAILED": "config_error", "COMPLETED": "healthy"}
    for state, outcome in want.items():
        job = slurm.jobs[state]
        d = diagnose_files([out / f"slurm-{job}.out"], ruleset, job_id=job, state=state)
        assert d["outcome"] == outcome, (state, d["outcome"], d["root_cause"])
        assert d["recommended_action"]["action"] not in ("drain_node", "reset_gpu")


def test_a_real_job_is_diagnosed_by_reference(slurm, tmp_path, monkeypatch, ruleset):
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    cfg = load_config(fleet(tmp_path, slurm))
    d = diagnose_one(cfg, "faultline", slurm.jobs["TIMEOUT"], ruleset)
    assert d["outcome"] == "scheduler_timelimit"
    healthy = diagnose_one(cfg, "faultline", slurm.jobs["COMPLETED"], ruleset)
    assert healthy["outcome"] == "healthy"


def restd_fleet(tmp_path: Path, slurm: SlurmCluster, **extra) -> Path:
    write_config(tmp_path, [{"name": "faultline", "scheduler": {"kind": "slurmrestd", "url": slurm.restd_url,
                                                                 "token_env": "FL_TEST_JWT", **extra}}])
    return tmp_path


def test_slurmrestd_with_jwt_gives_the_jobs_sacct_gives(slurm, tmp_path, monkeypatch):
    if not slurm.restd_url:
        pytest.skip("slurmrestd (and setpriv) not installed")
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    monkeypatch.setenv("FL_TEST_JWT", slurm.token("root"))
    rest = collect_cluster(load_config(restd_fleet(tmp_path / "r", slurm)).clusters[0], slurm.t0, slurm.t1)
    text = collect_cluster(load_config(fleet(tmp_path / "s", slurm)).clusters[0], slurm.t0, slurm.t1)
    cols = ["job_id", "state", "start_time", "end_time", "nodes", "name", "queue", "user"]
    assert rest.jobs.select(cols).sort("job_id").equals(text.jobs.select(cols).sort("job_id"))
    by_id = {r["job_id"]: r for r in rest.jobs.iter_rows(named=True)}
    # 22.05's JSON says exit code 0 for the job that exited 3: unknown, never a success
    assert by_id[slurm.jobs["FAILED"]]["exit_code"] is None
    assert by_id[slurm.jobs["COMPLETED"]]["exit_code"] == 0
    ev = rest.node_events.row(0, named=True)
    assert (ev["node"], ev["kind"]) == (NODE, "drain") and ev["reason"].startswith("healthcheck: GPU 3 Xid 79 [")
    monkeypatch.setenv("FL_TEST_JWT", slurm.token("root"))
    d = diagnose_one(load_config(restd_fleet(tmp_path / "r", slurm)), "faultline", slurm.jobs["TIMEOUT"],
                     load_ruleset_once())
    assert d["outcome"] == "scheduler_timelimit"


def test_slurmrestd_refusals_say_why(slurm, tmp_path, monkeypatch):
    if not slurm.restd_url:
        pytest.skip("slurmrestd (and setpriv) not installed")
    from faultline.collectors import slurmrestd
    cfg = {"url": slurm.restd_url, "token_env": "FL_TEST_JWT", "retries": 1, "backoff_s": 0.01}
    with pytest.raises(slurmrestd.SlurmRestError, match="FL_TEST_JWT is not set"):
        slurmrestd.fetch_jobs(cfg, "faultline", slurm.t0, slurm.t1, env={})
    with pytest.raises(slurmrestd.SlurmRestError, match="slurmrestd error .*[Aa]uthentication"):
        slurmrestd.fetch_jobs(cfg, "faultline", slurm.t0, slurm.t1, env={"FL_TEST_JWT": "not-a-jwt"})
    with pytest.raises(slurmrestd.SlurmRestError, match="cannot reach .*gave up after 2 attempts"):
        slurmrestd.fetch_jobs({**cfg, "url": "http://127.0.0.1:9"}, "faultline", slurm.t0, slurm.t1,
                              env={"FL_TEST_JWT": slurm.token()})
    from faultline.fleet.single import JobNotFound, SourceError
    monkeypatch.setenv("FL_TEST_JWT", slurm.token())
    with pytest.raises(JobNotFound):
        diagnose_one(load_config(restd_fleet(tmp_path, slurm)), "faultline", "987654", load_ruleset_once())
    monkeypatch.setenv("FL_TEST_JWT", "not-a-jwt")
    with pytest.raises(SourceError, match="slurmrestd"):
        diagnose_one(load_config(restd_fleet(tmp_path, slurm)), "faultline", slurm.jobs["FAILED"], load_ruleset_once())


def load_ruleset_once():
    from faultline.rules.loader import load_ruleset
    return load_ruleset()
