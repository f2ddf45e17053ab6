"""A real memory-limit kill on a real one-node Slurm 22.05 (tests/slurm_cluster.py) with jobacct_gather's
OverMemoryKill: slurmstepd samples the step's RSS every second and kills it past --mem.

What Slurm prints and records here is what it does on clusters without task/cgroup: the job ends FAILED
(not OUT_OF_MEMORY, which Slurm sets only from a cgroup's OOM event, unavailable without a delegated
cgroup tree), and slurmstepd writes `StepId=... exceeded memory limit (... > ...), being killed` and
`Exceeded job memory limit` into the job's output. Those lines, not the state, make the verdict.
"""

from __future__ import annotations

import pytest

from faultline.pipeline import diagnose_files

from .slurm_cluster import MISSING, REASON, SlurmCluster

pytestmark = pytest.mark.skipif(bool(MISSING), reason=REASON)

GROW = ("python3 -c \"import time\na = []\nfor _ in range(60):\n"
        "    a.append(bytearray(20 << 20)); time.sleep(0.2)\ntime.sleep(5)\"")


@pytest.fixture(scope="module")
def memory_slurm(tmp_path_factory):
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm-mem"), conf={
        "JobAcctGatherType": "jobacct_gather/linux", "JobAcctGatherFrequency": "1",
        "JobAcctGatherParams": "OverMemoryKill", "SelectTypeParameters": "CR_Core_Memory",
        "DefMemPerCPU": "200"}).start()
    try:
        job = cluster.sbatch(GROW, "--mem=100M", "--job-name=grows")
        cluster.job, cluster.final = job, cluster.wait_done([job], timeout=180)[job]
        yield cluster
    finally:
        cluster.stop()


def test_a_real_memory_limit_kill_is_host_oom(memory_slurm, ruleset):
    c = memory_slurm
    assert c.final == "FAILED"  # not OUT_OF_MEMORY: no cgroup here (module doc)
    out = c.root / "jobs" / f"slurm-{c.job}.out"
    text = out.read_text()
    assert "exceeded memory limit" in text
    d = diagnose_files([out], ruleset, job_id=c.job, state=c.final)
    assert d["outcome"] == "host_oom", d["evidence"]
    assert {e["rule_id"] for e in d["evidence"]} & {"slurm.memory_limit_kill", "slurm.memory_limit_exceeded"}
    assert d["recommended_action"]["action"] not in ("drain_node", "reset_gpu")  # the job's limit, not the node
