"""The `bigfile` stage's input and baselines: one combined multi-rank training log, as an ML engineer
pastes it to `faultline diagnose` (bench/README.md, "bigfile").

The log is what a long torchrun job on 8 nodes x 8 GPUs writes to one file: mostly NCCL INFO set-up
and channel lines (`host:pid:tid [gpu] NCCL INFO ...`, some behind torchrun's `[defaultN]:` tag),
step/loss lines (`[rankN]:`), warnings, kernel chatter from the nodes' consoles; near the end one GPU
falls off the bus (Xid 79 on one node) and every other rank's watchdog times out. Every rank's
process keeps one pid and a few thread ids for the whole run, as real processes do.

    python bench/bigfile.py OUT LINES          # e.g. 2000000 lines ~ 210 MB
"""

from __future__ import annotations

import random
import re
import sys
import time
from pathlib import Path

NODES, GPUS = 8, 8
RANKS = NODES * GPUS
BAD_NODE, BAD_GPU = 5, 3

# The ~36 failure patterns a user would grep for first: the regexes of these rules of the built-in
# packs (ripgrep gets them through baselines.rg_patterns, in byte mode; the Python loop compiles the
# same regexes with `re`).
TYPICAL_RULES = (
    "nvidia.xid", "nvidia.gpu_fallen_off_bus", "nvidia.row_remap_failure", "pytorch.cuda_oom",
    "pytorch.cuda_error_oom", "pytorch.cuda_illegal_memory_access", "pytorch.cuda_device_assert",
    "pytorch.cuda_ecc_uncorrectable", "pytorch.nan_loss", "nccl.watchdog_timeout", "nccl.remote_error",
    "nccl.ib_completion_error", "nccl.ib_async_event", "nccl.system_error", "nccl.unhandled_cuda_error",
    "nccl.internal_error", "nccl.socket_connect_failed", "pytorch.watchdog_terminated",
    "pytorch.elastic_child_failed", "pytorch.store_connection_refused", "pytorch.rendezvous_error",
    "pytorch.checkpoint_write_failed", "generic.traceback_header", "python.module_not_found",
    "python.file_not_found", "python.no_space_left", "python.stale_file_handle", "kernel.oom_killed_process",
    "kernel.segfault", "kernel.panic", "slurm.time_limit", "slurm.cancelled", "slurm.oom_kill",
    "slurm.srun_node_failure", "storage.nfs_not_responding", "network.mlx5_link_down",
)


def typical_regexes(ruleset) -> list[str]:
    by_id = {r.id: r for r in ruleset.log_rules}
    missing = [i for i in TYPICAL_RULES if i not in by_id]
    if missing:
        raise KeyError(f"bench/bigfile.py: rules not in the ruleset: {missing}")
    return [by_id[i].log.regex for i in TYPICAL_RULES]


def _ranks():
    """rank -> (host, pid, thread ids, gpu)."""
    rnd = random.Random(7)
    out = []
    for r in range(RANKS):
        n, g = divmod(r, GPUS)
        pid = 20000 + 1000 * n + rnd.randrange(900)
        out.append((f"gpu-node-{n:03d}", pid, [pid + 17 + k * rnd.randrange(3, 40) for k in range(4)], g))
    return out


def _chatter(rnd: random.Random, ranks, step: int, t: float) -> str:
    """One ordinary line of a training run (none is a failure)."""
    r = rnd.randrange(RANKS)
    host, pid, tids, g = ranks[r]
    tid = tids[rnd.randrange(len(tids))]
    k = rnd.random()
    hh, mm, ss = int(t // 3600) % 24, int(t // 60) % 60, t % 60
    tag = f"[default{g}]:" if rnd.random() < 0.35 else ""
    if k < 0.30:
        c = rnd.randrange(32)
        return (f"{tag}{host}:{pid}:{tid} [{g}] NCCL INFO Channel {c:02d}/{rnd.randrange(2)} : "
                f"{r}[{g}] -> {(r + 1) % RANKS}[{(g + 1) % GPUS}] via P2P/IPC/read")
    if k < 0.42:
        return (f"{tag}{host}:{pid}:{tid} [{g}] NCCL INFO Channel {rnd.randrange(32):02d}/0 : {r}[{g}] -> "
                f"{(r + GPUS) % RANKS}[{g}] [send] via NET/IB/{g % 4}/GDRDMA")
    if k < 0.50:
        return (f"{tag}{host}:{pid}:{tid} [{g}] NCCL INFO comm 0x{0x55d5c1a0 + r * 4096:x} rank {r} nRanks {RANKS} "
                f"nNodes {NODES} localRanks {GPUS} localRank {g} MNNVL 0")
    if k < 0.505:  # once per process and communicator in real runs: rare
        return (f"{tag}{host}:{pid}:{tid} [{g}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB "
                f"[2]mlx5_2:1/IB [3]mlx5_3:1/IB ; OOB ib0:10.10.{r // GPUS}.{11 + r % GPUS}<0>")
    if k < 0.55:
        return (f"{tag}{host}:{pid}:{tid} [{g}] NCCL INFO Setting affinity for GPU {g} to "
                f"{'ff' * (4 - g % 2)},{'00' * 4}{'ff' * 4}")
    if k < 0.60:
        return (f"{tag}{host}:{pid}:{tid} [{g}] NCCL INFO Trees [0] {(r + 1) % RANKS}/-1/-1->{r}->{r - 1} "
                f"[1] {(r + 1) % RANKS}/-1/-1->{r}->{r - 1}")
    if k < 0.64:
        return f"{tag}{host}:{pid}:{tid} [{g}] NCCL INFO ncclCommInitRank comm 0x{0x55d5c1a0 + r * 4096:x} rank {r} nranks {RANKS} cudaDev {g} nvmlDev {g} busId {0x1b + 0x20 * g:x}000 commId 0x9c2e31d4a6f0b7e5 - Init COMPLETE"
    if k < 0.82:
        return (f"[rank{r}]:[I{12:02d}{1:02d} {hh:02d}:{mm:02d}:{ss:09.6f} train.py:{412}] step {step} "
                f"loss {2.0 + rnd.random():.4f} lr 3.0e-04 grad_norm {0.8 + rnd.random() * 0.4:.3f} tokens/s {40000 + rnd.randrange(4000)}")
    if k < 0.88:
        return (f"[default{g}]: iteration {step:8d}/ 500000 | consumed samples: {step * 512:12d} | elapsed time per "
                f"iteration (ms): {980 + rnd.randrange(60):.1f} | learning rate: 3.000E-04 | lm loss: {2 + rnd.random():.6E} |")
    if k < 0.91:
        return (f"[rank{r}]: /opt/conda/lib/python3.11/site-packages/torch/utils/checkpoint.py:{91 + rnd.randrange(5)}: "
                "UserWarning: None of the inputs have requires_grad=True. Gradients will be None")
    if k < 0.94:
        return f"[rank{r}]:[I1201 {hh:02d}:{mm:02d}:{ss:09.6f} checkpoint.py:211] saved shard {rnd.randrange(64)} of step {step} in {1 + rnd.random() * 2:.2f}s"
    if k < 0.97:  # console chatter of the nodes' kernels, interleaved by the collector
        n = rnd.randrange(NODES)
        return (f"Dec  1 {hh:02d}:{mm:02d}:{int(ss):02d} gpu-node-{n:03d} kernel: [{t + 3000:.6f}] mlx5_core "
                f"0000:{0x0c + 0x10 * rnd.randrange(4):02x}:00.0: mlx5_cmd_out_err:838: QUERY_VPORT_COUNTER(0x770) op_mod(0x0) "
                "failed, status bad parameter(0x3), syndrome (0x7a1c9b)")
    return (f"{tag}{host}:{pid}:{tid} [{g}] NCCL INFO [Service thread] Connection closed by localRank {rnd.randrange(GPUS)}"
            if rnd.random() < 0.03 else f"[default{g}]:Epoch {step // 1000}:  {step % 1000 // 10}%|##   | {step % 1000}/1000 [00:{mm:02d}<01:{ss:05.2f}, 1.02it/s]")


def _failure(ranks, t: float) -> list[str]:
    """Xid 79 on BAD_NODE's GPU BAD_GPU, ten minutes later every other rank's watchdog times out."""
    hh, mm = int(t // 3600) % 24, int(t // 60) % 60
    bad = f"gpu-node-{BAD_NODE:03d}"
    out = [f"Dec  1 {hh:02d}:{mm:02d}:01 {bad} kernel: [{t + 3000:.6f}] NVRM: Xid (PCI:0000:{0x1b + 0x20 * BAD_GPU:02x}:00): "
           f"79, pid=1913, name=python, GPU has fallen off the bus.",
           f"Dec  1 {hh:02d}:{mm:02d}:01 {bad} kernel: [{t + 3000.1:.6f}] NVRM: GPU 0000:{0x1b + 0x20 * BAD_GPU:02x}:00.0: "
           "GPU has fallen off the bus."]
    for r in range(RANKS):
        if r == BAD_NODE * GPUS + BAD_GPU:
            continue
        out.append(f"[rank{r}]:[E1201 {hh:02d}:{(mm + 10) % 60:02d}:02.408271257 ProcessGroupNCCL.cpp:632] [Rank {r}] "
                   "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=91580, OpType=ALLREDUCE, NumelIn=2097152, "
                   "NumelOut=2097152, Timeout(ms)=600000) ran for 600042 milliseconds before timing out.")
    for r in range(0, RANKS, GPUS):
        out.append(f"[default0]:[rank{r}]:[E1201 {hh:02d}:{(mm + 10) % 60:02d}:03.000112000 ProcessGroupNCCL.cpp:1654] "
                   f"[PG ID 0 PG GUID 0(default_pg) Rank {r}] Process group watchdog thread terminated with exception: "
                   "[Rank 0] Watchdog caught collective operation timeout")
    out.append("E1201 {:02d}:{:02d}:09.112000 2718 torch/distributed/elastic/multiprocessing/api.py:881] failed "
               "(exitcode: -6) local_rank: 0 (pid: 1913) of binary: /opt/conda/bin/python".format(hh, (mm + 10) % 60))
    return out


def make_bigfile(path: Path, lines: int, seed: int = 20251201) -> dict:
    """Write `lines` lines (the failure among the last few hundred); returns lines and bytes."""
    rnd = random.Random(seed)
    ranks = _ranks()
    fail = _failure(ranks, 36000 + lines / 2000)
    body = lines - len(fail) - 200
    n = nbytes = 0
    t0 = time.perf_counter()
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        def write(batch):
            nonlocal n, nbytes
            text = "\n".join(batch) + "\n"
            fh.write(text)
            n += len(batch)
            nbytes += len(text.encode())
        while n < body:
            k = min(20000, body - n)
            base = n
            write([_chatter(rnd, ranks, (base + i) // 640, 36000 + (base + i) / 2000) for i in range(k)])
        write(fail)
        write([_chatter(rnd, ranks, body // 640, 36000 + lines / 2000 + 700) for _ in range(lines - n)])
    return {"lines": n, "bytes": nbytes, "seconds": time.perf_counter() - t0}


def python_loop(path: Path, regexes: list[str], limit: int | None = None) -> dict:
    """The per-line loop a user writes by hand: `re.search` of every pattern on every line (first `limit`)."""
    compiled = [re.compile(x) for x in regexes]
    n = nbytes = matched = 0
    t0, c0 = time.perf_counter(), time.process_time()
    with path.open("r", encoding="utf-8", errors="replace", newline="") as fh:
        for line in fh:
            nbytes += len(line)
            for rx in compiled:
                if rx.search(line):
                    matched += 1
                    break
            n += 1
            if limit and n >= limit:
                break
    return {"seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "lines": n, "bytes": nbytes,
            "matched_lines": matched,
            "patterns": len(compiled)}


if __name__ == "__main__":
    print(make_bigfile(Path(sys.argv[1]), int(sys.argv[2])))
