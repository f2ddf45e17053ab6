"""Small, realistic failure scenarios written as the log files real jobs leave behind.

Each scenario is one job: a dict of relative path -> lines, the job state, and the
expected verdict. `faultline demo` diagnoses them; they double as living examples of
DESIGN.md's worked examples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Scenario:
    name: str
    story: str
    files: dict[str, list[str]]
    expect_outcome: str
    expect_culprit: list[str] = field(default_factory=list)
    state: str = "FAILED"

    def write(self, root: Path) -> Path:
        job = root / self.name
        for rel, lines in self.files.items():
            p = job / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return job


def _watchdog(rank: int, hhmmss: str, seq: int = 1580) -> str:
    return (f"[rank{rank}]:[E321 {hhmmss}.408271257 ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog caught "
            f"collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=466119168, "
            f"NumelOut=466119168, Timeout(ms)=600000) ran for 600060 milliseconds before timing out.")


def _progress(rank: int, hhmmss: str) -> str:
    return (f"[rank{rank}]:[E321 {hhmmss}.465150152 ProcessGroupNCCL.cpp:1664] [PG 0 Rank {rank}] Exception "
            "(either an error or timeout) detected by watchdog at work: 1580, last enqueued NCCL work: 1582, "
            "last completed NCCL work: 1579.")


def _node_logs(nodes: list[str], per_node: int, hhmmss: str, skip: set[int] = frozenset()) -> dict[str, list[str]]:
    files = {}
    for n, node in enumerate(nodes):
        ranks = range(n * per_node, (n + 1) * per_node)
        lines = [f"{node}:{4000 + r}:{4000 + r} [{r % per_node}] NCCL INFO Bootstrap : Using eth0:10.0.0.{n + 10}<0>"
                 for r in ranks]
        lines += [f"[rank{r}]: step 1200 loss 2.31" for r in ranks]
        lines += [x for r in ranks if r not in skip for x in (_watchdog(r, hhmmss), _progress(r, hhmmss))]
        files[f"{node}/train.log"] = lines
    return files


def all_scenarios() -> list[Scenario]:
    nodes = [f"gpu{i:03d}" for i in range(1, 9)]
    xid = _node_logs(nodes, 4, "10:12:08")
    xid["gpu003/dmesg.log"] = [
        "[Thu Mar 21 10:01:58 2024] NVRM: GPU at PCI:0000:3b:00: GPU-6f2a1c9e-91b2-4c1d-8e5f-0a1b2c3d4e5f",
        "[Thu Mar 21 10:02:00 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, "
        "GPU has fallen off the bus.",
    ]
    ib = _node_logs(nodes[:4], 4, "11:20:30")
    ib["gpu002/train.log"] += [
        f"gpu002:{4004 + g}:{4100 + g} [{g}] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : port error"
        for g in range(4)]
    ib["gpu004/train.log"] += [
        "gpu004:4012:4190 [0] transport/net_ib.cc:1238 NCCL WARN NET/IB : Got completion from peer "
        "10.0.0.11<37948> with error 12, opcode 2, len 1, vendor err 129"]
    oom = _node_logs(nodes[:2], 4, "09:10:02", skip={2})
    oom["gpu001/train.log"] += [
        "[rank2]:[E321 09:00:01.000000000 train.py:88] forward failed",
        "[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 2 has a total "
        "capacity of 79.15 GiB of which 1.23 GiB is free."]
    hang = _node_logs(nodes, 8, "02:07:08", skip={17})
    healthy = {"gpu001/train.log": [
        "gpu001:100:100 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.2<0>",
        "gpu001:100:100 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",
        "gpu001:100:100 [0] NCCL INFO Could not find real path of /sys/class/net/eth0/device",
        "gpu001:100:200 [0] NCCL INFO [Service thread] Connection closed by localRank 1",
        "[rank0]: training finished"],
        "gpu001/dmesg.log": [
        "[Thu Mar 21 10:02:00 2024] NVRM: Xid (PCI:0000:3b:00): 63, pid=4242, name=python, Row Remapper: "
        "New row (0x0000000000001234) marked for remapping, reset gpu to activate."]}
    timelimit = {"slurm-4711.out": [
        "[rank0]: step 88000 loss 1.92",
        "slurmstepd: error: *** JOB 4711 ON gpu017 CANCELLED AT 2024-03-21T10:00:00 DUE TO TIME LIMIT ***"]}
    return [
        Scenario("xid79-gpu-off-bus", "GPU on gpu003 falls off the bus; 31 other ranks time out 10 minutes later",
                 xid, "gpu_hardware", ["gpu003"]),
        Scenario("ib-port-flap", "gpu002's IB port flaps; gpu004 gets error 12 naming gpu002's address",
                 ib, "network_ib", ["gpu002"]),
        Scenario("cuda-oom-rank2", "rank 2 runs out of GPU memory; the others time out in ALLREDUCE",
                 oom, "cuda_oom", ["gpu001 / rank 2"]),
        Scenario("silent-rank17", "63 of 64 ranks report the same timeout; rank 17 stays silent",
                 hang, "nccl_timeout_hang", ["gpu003 / rank 17"]),
        Scenario("healthy-chatter", "a completed job with scary-looking but benign lines", healthy, "healthy",
                 state="COMPLETED"),
        Scenario("time-limit", "only the scheduler speaks: time limit", timelimit, "scheduler_timelimit"),
    ]
