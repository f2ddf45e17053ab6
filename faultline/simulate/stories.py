"""What each job's nodes print, fault by fault, the way a real Slurm + PyTorch + NCCL cluster prints it.

The culprit prints its root evidence (kernel Xid, IB port error, an OOM traceback on one rank, ...);
the victims print the cascade later (NCCL watchdog timeouts with the same SeqNum ~10 or 30 minutes on,
`Got completion from peer <culprit ip> with error 12`, ncclRemoteError, SIGABRT teardown, torchrun's
ChildFailedError summary); every node has its clock skew (applied at rendering) and benign chatter.

Two launch styles, fixed per job:
  0  srun -> one torchrun per node, PyTorch >= 2.2: `[rankN]:` prefixes, new watchdog format, 10 min timeout
  1  srun --label, one task per GPU, PyTorch 1.x/2.0: `N: ` prefixes, old watchdog format, 30 min timeout
"""

from __future__ import annotations

import numpy as np

from faultline.simulate.fleet import GPU_BUS, GPUS_PER_NODE, NIC_BUS, Cluster
from faultline.simulate.jobs import NODE_LOST, WATCHDOG_S, JobTable
from faultline.simulate.lines import SYSLOG, Rows

NS = 1_000_000_000
MS = 1_000_000
OPS = ("ALLREDUCE", "ALLREDUCE", "_ALLGATHER_BASE", "_REDUCE_SCATTER_BASE", "BROADCAST", "ALLGATHER")

# ---------------------------------------------------------------- templates (rank/node-level, bulk)
BOOT = "{L}{H}:{PID}:{PID} [{LR}] NCCL INFO Bootstrap : Using eth0:{IP}<0>"
PLUGIN = "{L}{H}:{PID}:{PID} [{LR}] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin."
REALPATH = "{L}{H}:{PID}:{PID} [{LR}] NCCL INFO Could not find real path of /sys/class/net/eth0/device"
NETIB = ("{L}{H}:{PID}:{PID} [{LR}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB "
         "[3]mlx5_3:1/IB [4]mlx5_4:1/IB [5]mlx5_5:1/IB [6]mlx5_6:1/IB [7]mlx5_7:1/IB [RO]; OOB eth0:{IP}<0>")
USING_IB = "{L}{H}:{PID}:{PID} [{LR}] NCCL INFO Using network IB"
INIT_DONE = ("{L}{H}:{PID}:{TID} [{LR}] NCCL INFO comm 0x55d1{PID}0 rank {R} nranks {NR} cudaDev {LR} nvmlDev {LR} "
             "busId {BUS}000 commId 0x{A}f3a9c - Init COMPLETE")
CLOSED = "{L}{H}:{PID}:{TID} [{LR}] NCCL INFO [Service thread] Connection closed by localRank {LR}"
DESTROY = ("{L}{H}:{PID}:{PID} [{LR}] NCCL INFO comm 0x55d1{PID}0 rank {R} nranks {NR} cudaDev {LR} busId {BUS}000 "
           "- Destroy COMPLETE")
BARRIER_WARN = ("{P}[W{C10} ProcessGroupNCCL.cpp:4115] [PG ID 0 PG GUID 0 Rank {R}]  using GPU {LR} to perform barrier "
                "as devices used by this process are currently unknown. This can potentially cause a hang if this "
                "rank to GPU mapping is incorrect.")
DIST_INIT = "{P} | distributed init (rank {R}): env://, gpu {LR}"
SLURMD = "{SYS} {H} slurmd[{A}]: launch task StepId={J}.0 request from UID:{B} GID:{B} HOST:{PIP} PORT:{C}"

WD_NEW = ("{P}[E{C10} ProcessGroupNCCL.cpp:632] [Rank {R}] Watchdog caught collective operation timeout: "
          "WorkNCCL(SeqNum={A}, OpType=%s, NumelIn={B}, NumelOut={B}, Timeout(ms)=600000) ran for {C} "
          "milliseconds before timing out.")
WD_PROG = ("{P}[E{C10} ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank {R}] Exception (either an "
           "error or timeout) detected by watchdog at work: {A}, last enqueued NCCL work: {D}, last completed NCCL "
           "work: {B}.")
WD_SOME = ("{P}[E{C10} ProcessGroupNCCL.cpp:630] [Rank {R}] Some NCCL operations have failed or timed out. Due to "
           "the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.")
WD_AVOID = "{P}[E{C10} ProcessGroupNCCL.cpp:636] [Rank {R}] To avoid data inconsistency, we are taking the entire process down."
WD_OLD = ("{P} [E ProcessGroupNCCL.cpp:737] [Rank {R}] Watchdog caught collective operation timeout: "
          "WorkNCCL(SeqNum={A}, OpType=%s, Timeout(ms)=1800000) ran for {C} milliseconds before timing out.")
WD_OLD_SOME = ("{P} [E ProcessGroupNCCL.cpp:455] Some NCCL operations have failed or timed out. Due to the "
               "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.")
WD_OLD_AVOID = "{P} [E ProcessGroupNCCL.cpp:460] To avoid data inconsistency, we are taking the entire process down."

IB_ASYNC_OLD = "{L}{H}:{PID}:{TID} [{LR}] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : port error"
IB_ASYNC_NEW = "{L}{H}:{PID}:{TID} [{LR}] transport/net_ib.cc:123 NCCL WARN NET/IB : mlx5_{LR}:1 Got async event : port error"
IB_CATA = ("{L}{H}:{PID}:{TID} [{LR}] transport/net_ib.cc:123 NCCL WARN NET/IB : mlx5_{LR}:1 Got async event : "
           "local catastrophic error")
IB12_OLD = ("{L}{H}:{PID}:{TID} [{LR}] transport/net_ib.cc:1238 NCCL WARN NET/IB : Got completion from peer "
            "{PIP}<{A}> with error 12, opcode 0, len 0, vendor err 129")
IB12_NEW = ("{L}{H}:{PID}:{TID} [{LR}] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer "
            "{PIP}<{A}> with status=12 opcode=0 len=0 vendor err 129 localGid ::ffff:{IP} remoteGids::ffff:{PIP} "
            "hca mlx5_{LR}")
NET_ARROW = "{L}{H}:{PID}:{TID} [{LR}] NCCL INFO transport/net.cc:1298 -> 6"
REMOTE_TERM = ("{P}[E{C10} ProcessGroupNCCL.cpp:1554] [PG ID 0 PG GUID 0(default_pg) Rank {R}] Process group "
               "watchdog thread terminated with exception: NCCL error: remote process exited or there was a network "
               "error, NCCL version 2.21.5")
REMOTE_MSG = ("{P} ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
              "prematurely.")
REMOTE_OLD = ("{P} RuntimeError: NCCL communicator was aborted on rank {R}.  Original reason for failure was: NCCL "
              "error: remote process exited or there was a network error, NCCL version 2.14.3")
PEER_CLOSED = ("{L}{H}:{PID}:{TID} [{LR}] misc/socket.cc:538 NCCL WARN Net : Connection closed by remote peer "
               "{PIP}<{A}>")

AGENT_SIGTERM = "W{GLOG} {PID} torch/distributed/elastic/multiprocessing/api.py:897] Sending process {A} closing signal SIGTERM"
AGENT_FAILED = ("E{GLOG} {PID} torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: %s) "
                "local_rank: {LR} (pid: {A}) of binary: /usr/bin/python3")
AGENT_DEATH = ("W{GLOG} {PID} torch/distributed/elastic/agent/server/api.py:704] Received Signals.SIGTERM death signal, "
               "shutting down workers")
CHILD_HEAD = [
    "Traceback (most recent call last):",
    '  File "/usr/local/bin/torchrun", line 8, in <module>',
    "    sys.exit(main())",
    '  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", '
    "line 355, in wrapper",
    "    return f(*args, **kwargs)",
    '  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/run.py", line 919, in main',
    "    run(args)",
    '  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/run.py", line 910, in run',
    "    elastic_launch(",
    '  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/launcher/api.py", line 138, in __call__',
    "    return launch_agent(self._config, self._entrypoint, list(args))",
    '  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/launcher/api.py", line 269, in launch_agent',
    "    raise ChildFailedError(",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "============================================================",
    "train.py FAILED",
    "------------------------------------------------------------",
    "Failures:",
    "  <NO_OTHER_FAILURES>",
    "------------------------------------------------------------",
    "Root Cause (first observed failure):",
    "[0]:",
    "  time      : {TRUN}",
    "  host      : {H}",
    "  rank      : {R} (local_rank: {LR})",
    "  exitcode  : %s (pid: {A})",
    "  error_file: %s",
    "  traceback : %s",
    "============================================================",
]
SIGNAMES = {-6: "Signal 6 (SIGABRT) received by PID {A}", -9: "Signal 9 (SIGKILL) received by PID {A}",
            -11: "Signal 11 (SIGSEGV) received by PID {A}", -15: "Signal 15 (SIGTERM) received by PID {A}",
            1: "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"}
SRUN_TASKS = "srun: error: {PH}: tasks {A}-{B}: %s"
SRUN_TASK = "srun: error: {PH}: task {A}: %s"
STEP_ABORTED = "srun: Job step aborted: Waiting up to 32 seconds for job step to finish."
STEPD = "slurmstepd: error: *** STEP {J}.0 ON {H} CANCELLED AT {ISO} DUE TO %s ***"
STEPD_JOB = "slurmstepd: error: *** JOB {J} ON {H} CANCELLED AT {ISO} DUE TO %s ***"
STEPD_NODE_FAIL = "slurmstepd: error: *** STEP {J}.0 ON {H} CANCELLED AT {ISO} DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***"
STEPD_CANCEL = "slurmstepd: error: *** JOB {J} ON {H} CANCELLED AT {ISO} ***"
STEPD_STEP_CANCEL = "slurmstepd: error: *** STEP {J}.0 ON {H} CANCELLED AT {ISO} ***"

TRAIN_FRAMES = [
    '{P}   File "/workspace/train.py", line 687, in <module>',
    "{P}     main()",
    '{P}   File "/workspace/train.py", line 598, in main',
    "{P}     loss = train_step(model, batch, optimizer)",
    '{P}   File "/workspace/train.py", line 331, in train_step',
]
PY_LIB = "/usr/local/lib/python3.10/dist-packages"


class Story:
    """One job attempt's rows: the context (nodes, ranks, pids, seq numbers) and the fault's script."""

    def __init__(self, rows: Rows, jt: JobTable, i: int, job: int, cl: Cluster, seed: int):
        c = jt.cols
        self.rows, self.i, self.job, self.cl = rows, i, job, cl
        self.rng = np.random.default_rng([seed, 3, int(c["cidx"][i]), int(c["row_seed"][i])])
        self.nodes = jt.nodes(i)
        self.N = len(self.nodes)
        self.R = self.N * GPUS_PER_NODE
        self.style = int(c["style"][i])
        self.st, self.end, self.tf = int(c["start"][i]), int(c["end"][i]), int(c["fail_t"][i])
        self.fault, self.variant = str(c["fault"][i]), str(c["variant"][i])
        self.job_id = str(c["job_id"][i])
        self.cpos, self.crank, self.cgpu = int(c["culprit_pos"][i]), int(c["culprit_rank"][i]), int(c["culprit_gpu"][i])
        self.uid = int(c["uid"][i])
        self.detail = ""
        self.oom_ranks: list[int] = []
        self.T = WATCHDOG_S[self.style]
        r = self.rng
        self.agent_pid = r.integers(3000, 3_900_000, self.N)
        self.seq = int(r.integers(200, 500_000))
        self.op = str(r.choice(OPS)) if self.style == 0 else "ALLREDUCE"
        self.numel = int(r.choice([1, 4096, 262144, 16777216, 466119168, 134217728]))
        self.ranks = np.arange(self.R)
        self.pos = self.ranks // GPUS_PER_NODE
        self.lr = self.ranks % GPUS_PER_NODE
        self.rnode = self.nodes[self.pos]
        self.pid = self.agent_pid[self.pos] + 1 + self.lr
        self.tid = self.pid + 110 + self.lr * 3
        self.step0 = int(r.integers(100, 90000))
        self.loss0 = float(r.uniform(1.6, 3.2))

    # ------------------------------------------------------------------ helpers
    def jit(self, n: int, lo: float, hi: float) -> np.ndarray:
        return (self.rng.uniform(lo, hi, n) * NS).astype(np.int64)

    def add_ranks(self, template: str, mask: np.ndarray, ts, **kw) -> None:
        sel = np.flatnonzero(mask)
        if not sel.size:
            return
        ts = np.asarray(ts)
        ts = ts[sel] if ts.size > 1 else ts
        extra = {k: (v[sel] if isinstance(v, np.ndarray) and v.size == self.R else v) for k, v in kw.items()}
        self.rows.add(template, self.job, self.rnode[sel], ts, rank=sel, lr=self.lr[sel], pid=self.pid[sel],
                      tid=self.tid[sel], **extra)

    def block_ranks(self, templates: list[str], mask: np.ndarray, ts, **kw) -> None:
        ts = np.asarray(ts, dtype=np.int64)
        for k, t in enumerate(templates):
            self.add_ranks(t, mask, ts + k * 1000, **kw)

    def prefix(self, rank: int) -> str:
        return f"[rank{rank}]:" if self.style == 0 else f"{rank}:"

    def rank_raws(self, rank: int, lines: list[str], ts: int) -> None:
        p = self.prefix(rank)
        node = int(self.rnode[rank])
        self.rows.raws([x.replace("{P}", p) for x in lines], self.job, node, ts, rank=rank)

    def kernel(self, pos: int, lines: list[str], ts: int) -> None:
        node = int(self.nodes[pos])
        kt = (ts - self.st) / NS + float(self.rng.uniform(2e5, 2e6))
        stamp = self.rng.random() < 0.5
        out = [f"{{SYS}} {{H}} kernel: " + (f"[{kt + k * 1e-6:.6f}] " if stamp else "") + x for k, x in enumerate(lines)]
        self.rows.raws(out, self.job, node, ts, src=SYSLOG)

    def mask(self, fn=None) -> np.ndarray:
        return np.ones(self.R, bool) if fn is None else fn

    # ------------------------------------------------------------------ common parts
    def init(self) -> None:
        """Startup chatter: slurmd in syslog, NCCL INFO (addresses), one init line per rank."""
        r, st = self.rng, self.st
        self.rows.add(SLURMD, self.job, self.nodes, st + self.jit(self.N, 0.1, 1.5), src=SYSLOG,
                      a=r.integers(1000, 9000, self.N), b=self.uid, c=r.integers(30000, 60000, self.N),
                      peer=self.nodes[0])
        t_init = st + int(r.uniform(20, 90) * NS)
        lead = (self.lr == 0) if self.N > 2 else np.ones(self.R, bool)
        ts = t_init + self.jit(self.R, 0, 2)
        self.add_ranks(BOOT, lead, ts)
        if r.random() < 0.6:
            self.add_ranks(PLUGIN, self.lr == 0, ts + 1000)
        if r.random() < 0.3:
            self.add_ranks(REALPATH, self.lr == 0, ts + 2000)
        self.add_ranks(NETIB, self.lr == 0, ts + 3000)
        self.add_ranks(USING_IB, self.lr == 0, ts + 4000)
        self.add_ranks(INIT_DONE, self.lr == 0, ts + int(5 * NS), a=int(r.integers(1000, 9999)))
        ver = "2.21.5+cuda12.4" if self.style == 0 else "2.14.3+cuda11.8"
        self.rows.add("{L}{H}:{PID}:{PID} [0] NCCL INFO NCCL version " + ver, self.job, self.nodes[0], ts[0] - 1000,
                      rank=0, lr=0, pid=self.pid[0])
        # every rank says hello once (big jobs: one per node, to bound the volume)
        self.add_ranks(BARRIER_WARN if self.style == 0 else DIST_INIT, self.mask() if self.N <= 64 else self.lr == 0,
                       ts + int(6 * NS))
        if r.random() < 0.5:
            self.rank_raws(0, [f"{{P}} {PY_LIB}/torch/utils/checkpoint.py:1399: FutureWarning: `torch.cpu.amp.autocast("
                               "args...)` is deprecated. Please use `torch.amp.autocast('cpu', args...)` instead."],
                           t_init + int(40 * NS))
        self.noise()

    def noise(self) -> None:
        """Scary-looking but benign kernel lines on some nodes."""
        r = self.rng
        if r.random() < 0.06:
            pos, g = int(r.integers(0, self.N)), int(r.integers(0, 8))
            self.kernel(pos, [f"NVRM: Xid (PCI:0000:{GPU_BUS[g]}:00): 63, pid={int(self.pid[pos * 8 + g])}, name=python, "
                              f"Row Remapper: New row (0x{int(r.integers(1, 2**40)):016x}) marked for remapping, "
                              "reset gpu to activate."], self.st + int((self.tf - self.st) * r.uniform(0.1, 0.6)))
        if r.random() < 0.05:
            pos, g = int(r.integers(0, self.N)), int(r.integers(0, 8))
            self.kernel(pos, [f"mlx5_core 0000:{NIC_BUS[g]}:00.0: mlx5_pcie_event:299:(pid {int(r.integers(200, 9e5))}): "
                              "Detected insufficient power on the PCIe slot (27W)."], self.st + int(5 * NS))
        if r.random() < 0.03:
            pos = int(r.integers(0, self.N))
            self.kernel(pos, ["nfs: server nfs01 OK"], self.st + int((self.tf - self.st) * r.uniform(0.1, 0.9)))

    def progress(self, t_to: int, nan_from: int | None = None) -> int:
        """Rank 0's training log up to t_to; returns the last step printed."""
        r = self.rng
        span = max(t_to - self.st - 150 * NS, 60 * NS)
        n = int(min(12, max(2, span // (300 * NS))))
        ts = self.st + 150 * NS + np.sort((r.random(n) * span).astype(np.int64))
        step = self.step0
        for k, t in enumerate(ts):
            step += int(r.integers(50, 400))
            loss = self.loss0 * (0.985 ** k) + r.normal(0, 0.02)
            bad = nan_from is not None and k >= n - 3
            ls = "nan" if bad else f"{loss:.4f}"
            gn = "nan" if bad else f"{abs(r.normal(0.9, 0.2)):.3f}"
            if self.style == 0:
                line = (f"{{P}}[{{PY}}] [INFO] [train.py:412] step {step} | loss {ls} | lr {3e-4 * 0.999 ** k:.3e} | "
                        f"grad_norm {gn} | {r.uniform(0.8, 1.4):.2f}e+06 tok/s")
            else:
                line = (f"{{P}}  iteration {step:8d}/  500000 | consumed samples: {step * 512:12d} | elapsed time per "
                        f"iteration (ms): {r.uniform(700, 1500):.1f} | learning rate: {3e-4:.3E} | global batch size:"
                        f"   512 | lm loss: {'NAN' if bad else f'{loss:.6E}'} | loss scale: 1.0 | grad norm: {gn} | "
                        f"number of skipped iterations:   0 | number of nan iterations:   {1 if bad else 0} |")
            self.rank_raws(0, [line], int(t))
        if r.random() < 0.1 and self.style == 0:
            self.rank_raws(0, ["{P}[{PY}] [WARNING] [loss_scaler.py:183] [deepspeed] OVERFLOW! Rank 0 Skipping step. "
                               "Attempted loss scale: 65536, reducing to 32768"], int(ts[0]) + NS)
        self.last_step = step
        return step

    def watchdog(self, victims: np.ndarray, t_detect: int) -> np.ndarray:
        """Victims of a stuck collective: watchdog timeout + progress report + abort; returns their times."""
        n = self.R
        ts = t_detect + self.jit(n, 0, 1.5)
        ran = self.T * 1000 + self.rng.integers(20, 900, n)
        seq, enq = self.seq, self.seq + int(self.rng.integers(0, 3))
        if self.style == 0:
            self.add_ranks(WD_NEW % self.op, victims, ts, a=seq, b=self.numel, c=ran)
            self.add_ranks(WD_PROG, victims, ts + 1000, a=seq, b=seq - 1, d=enq)
            if self.N <= 64:
                self.block_ranks([WD_SOME, WD_AVOID], victims, ts + 2000)
        else:
            self.block_ranks([WD_OLD % self.op, WD_OLD_SOME, WD_OLD_AVOID], victims, ts, a=seq, c=ran)
        return ts

    def teardown(self, t_exit: int, exitcode: dict[int, int], skip_pos: set[int] = frozenset(),
                 first_rank: dict[int, int] | None = None) -> None:
        """End of the job on each node: torchrun agent summaries (style 0) or srun task errors (style 1).

        exitcode: node position -> exit code of its first failed worker (default -6, SIGABRT).
        """
        r = self.rng
        pos = np.array([p for p in range(self.N) if p not in skip_pos], dtype=np.int64)
        if not pos.size:
            return
        ts = t_exit + self.jit(len(pos), 0, 3)
        codes = np.array([exitcode.get(int(p), -6) for p in pos])
        first = np.array([(first_rank or {}).get(int(p), int(p) * 8) for p in pos])
        if self.style == 0:
            for code in sorted(set(codes.tolist())):
                sel = codes == code
                p, t, fr = pos[sel], ts[sel], first[sel]
                wpid = self.pid[fr]
                kw = dict(rank=fr, lr=fr % 8, pid=self.agent_pid[p], a=wpid)
                if code in (1, -9, -11):
                    self.rows.add(AGENT_SIGTERM, self.job, self.nodes[p], t - 2 * MS, pid=self.agent_pid[p],
                                  a=wpid + 1)
                self.rows.add(AGENT_FAILED % code, self.job, self.nodes[p], t, **kw)
                err = "/tmp/torchelastic_3k2j/none_1/attempt_0/{LR}/error.json" if code == 1 else "<N/A>"
                lines = [x % code if "exitcode" in x else x for x in CHILD_HEAD]
                lines = [x % err if "error_file" in x else x for x in lines]
                lines = [x % SIGNAMES.get(code, SIGNAMES[-6]) if "traceback :" in x else x for x in lines]
                self.rows.block(lines, self.job, self.nodes[p], t + MS, **kw)
            # srun on the batch host: one task per node
            words = {1: "Exited with exit code 1", -6: "Exited with exit code 1", -9: "Killed",
                     -11: "Exited with exit code 1", -15: "Terminated"}
            for code in sorted(set(codes.tolist())):
                sel = codes == code
                self.rows.add(SRUN_TASK % words.get(code, "Exited with exit code 1"), self.job, self.nodes[0],
                              ts[sel] + 2 * NS, a=pos[sel], peer=self.nodes[pos[sel]])
        else:
            words = {1: "Exited with exit code 1", -6: "Aborted (core dumped)", -9: "Killed",
                     -11: "Segmentation fault (core dumped)", -15: "Terminated"}
            for code in sorted(set(codes.tolist())):
                sel = codes == code
                p = pos[sel]
                self.rows.add(SRUN_TASKS % words.get(code, "Exited with exit code 1"), self.job, self.nodes[0],
                              ts[sel] + 2 * NS, a=p * 8, b=p * 8 + 7, peer=self.nodes[p])
            if r.random() < 0.5:
                self.rows.add(f"srun: launch/slurm: _step_signal: Terminating StepId={{J}}.0", self.job, self.nodes[0],
                              int(ts.min()) + 2 * NS + 5 * MS)
                self.rows.add(STEPD_STEP_CANCEL, self.job, self.nodes[pos], ts + 3 * NS)

    def traceback(self, rank_mask: np.ndarray, ts, frames: list[str], exc: str) -> None:
        """A Python traceback on every rank of the mask (bulk)."""
        self.block_ranks(["{P} Traceback (most recent call last):", *TRAIN_FRAMES, *frames, exc], rank_mask, ts)

    def healthy_end(self) -> None:
        r = self.rng
        end = self.end
        self.rank_raws(0, [f"{{P}}[{{PY}}] [INFO] [train.py:640] training finished after {self.last_step} steps; "
                           "saving final checkpoint"], end - 40 * NS)
        few = (self.lr < (8 if self.N <= 4 else 1))
        ts = end - 10 * NS + self.jit(self.R, 0, 3)
        self.add_ranks(CLOSED, few & (self.lr % 2 == 1) | (few & (self.ranks == 1)), ts)
        self.add_ranks(DESTROY, few, ts + 1000)
        if r.random() < 0.3:
            pos, g = int(r.integers(0, self.N)), int(r.integers(0, 8))
            self.kernel(pos, [f"NVRM: Xid (PCI:0000:{GPU_BUS[g]}:00): 63, pid={int(self.pid[pos * 8 + g])}, name=python, "
                              "Row Remapper: New row (0x00000000000a3f20) marked for remapping, reset gpu to activate."],
                        end - int(r.uniform(100, 3000) * NS))

    # ------------------------------------------------------------------ the scripts
    def run(self) -> None:
        f = self.fault
        if f == "config_error" or (f == "checkpoint" and self.variant == "load"):
            self.startup_failure()
            return
        self.init()
        if f == "none":
            self.progress(self.end - 60 * NS)
            self.healthy_end()
            return
        getattr(self, "f_" + f)()

    # startup failures: every rank fails the same way, before NCCL init
    def startup_failure(self) -> None:
        r, v = self.rng, self.variant
        self.rows.add(SLURMD, self.job, self.nodes, self.st + self.jit(self.N, 0.1, 1.5), src=SYSLOG,
                      a=r.integers(1000, 9000, self.N), b=self.uid, c=r.integers(30000, 60000, self.N),
                      peer=self.nodes[0])
        ts = self.tf + self.jit(self.R, 0, 2)
        allr = self.mask()
        if self.fault == "checkpoint":
            path = f"/checkpoints/run{int(r.integers(1, 99))}/global_step{int(r.integers(1, 90)) * 1000}/mp_rank_00_model_states.pt"
            frames = ['{P}   File "/workspace/train.py", line 212, in load_checkpoint',
                      "{P}     state = torch.load(path, map_location='cpu')",
                      f'{{P}}   File "{PY_LIB}/torch/serialization.py", line 1072, in load',
                      "{P}     with _open_zipfile_reader(opened_file) as opened_zipfile:",
                      f'{{P}}   File "{PY_LIB}/torch/serialization.py", line 480, in __init__',
                      "{P}     super().__init__(torch._C.PyTorchFileReader(name_or_buffer))"]
            if r.random() < 0.6:
                exc = "{P} RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory"
                self.detail = f"load failed: {path} is truncated/corrupt"
            else:
                exc = "{P} _pickle.UnpicklingError: invalid load key, 'v'."
                self.detail = f"load failed: {path} is a git-lfs pointer, not the weights"
            self.traceback(allr, ts, frames, exc)
        elif v == "module":
            mod = str(r.choice(["flash_attn", "apex", "transformer_engine", "deepspeed", "megatron.core", "triton"]))
            self.detail = f"No module named '{mod}'"
            self.block_ranks(["{P} Traceback (most recent call last):",
                              '{P}   File "/workspace/train.py", line 14, in <module>',
                              f"{{P}}     import {mod}",
                              f"{{P}} ModuleNotFoundError: No module named '{mod}'"], allr, ts)
        elif v == "file":
            cfg = str(r.choice(["configs/llama3_8b.yaml", "configs/moe_16x3b.json", "conf/data/c4.yaml"]))
            self.detail = f"missing config file {cfg}"
            self.traceback(allr, ts, ['{P}   File "/workspace/train.py", line 88, in load_config',
                                      "{P}     with open(args.config) as f:"],
                           f"{{P}} FileNotFoundError: [Errno 2] No such file or directory: '/workspace/{cfg}'")
        else:
            arg = str(r.choice(["--lr-schedule cosine", "--grad-ckpt", "--seq_len 8192", "--fsdp-shard full"]))
            self.detail = f"unrecognized arguments: {arg}"
            self.block_ranks(["{P} usage: train.py [-h] [--config CONFIG] [--lr LR] [--batch-size BATCH_SIZE]",
                              f"{{P}} train.py: error: unrecognized arguments: {arg}"], allr, ts)
        self.teardown(self.end - 3 * NS, {p: 1 for p in range(self.N)})

    # --- GPU faults
    def _gpu_root(self, lines: list[str], app_error: str | None, hang: bool) -> None:
        """Kernel lines on the culprit GPU; its rank either errors (and its node tears down) or hangs."""
        tf, cp, k = self.tf, self.cpos, self.crank
        self.progress(tf)
        self.kernel(cp, lines, tf)
        victims = np.ones(self.R, bool)
        exitcode = {}
        skip = set()
        if app_error is not None:
            self.rank_raws(k, [app_error, "{P} CUDA kernel errors might be asynchronously reported at some other API "
                               "call, so the stacktrace below might be incorrect.",
                               "{P} For debugging consider passing CUDA_LAUNCH_BLOCKING=1.",
                               "{P} Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."],
                           tf + int(self.rng.uniform(0.2, 3) * NS))
            victims &= self.pos != cp  # its agent tears down the node
            exitcode[cp] = 1
        else:
            victims[k] = False  # the hung rank prints nothing
        if self.N == 1 and app_error is not None:
            self.teardown(tf + 5 * NS, exitcode, first_rank={cp: k})
            return
        self.watchdog(victims, tf + self.T * NS)
        self.teardown(tf + (self.T + 4) * NS, exitcode, skip, first_rank={cp: k} if app_error else None)
        del hang

    def _xid(self, code: int, text: str) -> str:
        return (f"NVRM: Xid (PCI:0000:{GPU_BUS[self.cgpu]}:00): {code}, pid={int(self.pid[self.crank])}, name=python, "
                + text)

    def f_gpu_faulty(self) -> None:
        v, g = self.variant, self.cgpu
        bus = GPU_BUS[g]
        ecc = "{P} RuntimeError: CUDA error: uncorrectable ECC error encountered"
        if v == "xid79":
            self.detail = "Xid 79, GPU has fallen off the bus"
            lines = [f"NVRM: GPU at PCI:0000:{bus}:00: {self.cl.gpu_uuids[int(self.nodes[self.cpos])][g]}",
                     f"NVRM: Xid (PCI:0000:{bus}:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
                     f"NVRM: GPU 0000:{bus}:00.0: GPU has fallen off the bus."]
            err = "{P} RuntimeError: CUDA error: unknown error" if self.rng.random() < 0.3 else None
            self._gpu_root(lines, err, err is None)
        elif v == "xid48":
            self.detail = "Xid 48, double bit ECC error"
            self._gpu_root([self._xid(48, "An uncorrectable double bit error (DBE) has been detected on GPU in the "
                                          "framebuffer at partition 6, subpartition 0.")], ecc, False)
        elif v in ("xid94", "xid95"):
            code = int(v[3:])
            self.detail = f"Xid {code}, {'contained' if code == 94 else 'uncontained'} ECC error"
            txt = "Contained: SM (0x1). RST: No, D-RST: No" if code == 94 else "Uncontained: FBHUB. RST: Yes, D-RST: No"
            self._gpu_root([self._xid(code, txt)], ecc, False)
        else:
            self.detail = "uncorrectable ECC error reported by CUDA"
            self._gpu_root([self._xid(48, "An uncorrectable double bit error (DBE) has been detected on GPU in the "
                                          "framebuffer at partition 2, subpartition 1.")], ecc, False)

    def f_gpu_hbm(self) -> None:
        v = self.variant
        ecc = "{P} RuntimeError: CUDA error: uncorrectable ECC error encountered"
        row = f"0x{int(self.rng.integers(1, 2**32)):016x}"
        if v == "xid48":
            self.detail = "Xid 48 DBE in HBM"
            lines = [self._xid(48, "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
                                   "at partition 5, subpartition 1."),
                     self._xid(63, f"Row Remapper: New row ({row}) marked for remapping, reset gpu to activate.")]
        elif v == "xid64":
            self.detail = "Xid 64 row remapping failure after a DBE"
            lines = [self._xid(48, "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
                                   "at partition 1, subpartition 0."),
                     self._xid(64, f"Row Remapper Error: ({row}) - All reserved rows for bank are remapped")]
        else:
            code = int(v[3:])
            self.detail = f"Xid {code}"
            lines = [self._xid(code, "Contained: FBHUB. RST: No, D-RST: No" if code == 94 else
                               "Uncontained: FBHUB. RST: Yes, D-RST: No")]
        self._gpu_root(lines, ecc, False)

    def f_gpu_sram(self) -> None:
        ecc = "{P} RuntimeError: CUDA error: uncorrectable ECC error encountered"
        if self.variant == "xid48_sram":
            self.detail = "Xid 48, SRAM DBE"
            lines = [self._xid(48, "An uncorrectable double bit error (DBE) has been detected on GPU in the SRAM "
                                   f"(L2 slice {int(self.rng.integers(0, 96))}).")]
        else:
            self.detail = "Xid 95, uncontained SRAM error"
            lines = [self._xid(95, "Uncontained: LTC SRAM ECC. RST: Yes, D-RST: No")]
        self._gpu_root(lines, ecc, False)

    def f_gpu_gsp(self) -> None:
        g = self.cgpu
        if self.variant == "xid119":
            self.detail = "Xid 119, GSP RPC timeout"
            lines = [self._xid(119, f"Timeout after 6s of waiting for RPC response from GPU{g} GSP! Expected function 76 "
                                    "(GSP_RM_CONTROL) (0x20800a4c 0x4)."),
                     f"NVRM: GPU{g} GSP RPC buffer contains function 76 (GSP_RM_CONTROL) and data 0x0000000020800a4c "
                     "0x0000000000000004."]
        else:
            self.detail = "Xid 120, GSP error"
            lines = [self._xid(120, "Ch 00000000, GSP Error: Task 1 raised error code 0x5 for reason 0x0 at 0x2c1f8b0 "
                                    "(0 more errors skipped)")]
        err = "{P} RuntimeError: CUDA error: unknown error" if self.rng.random() < 0.4 else None
        self._gpu_root(lines, err, err is None)

    def f_gpu_thermal(self) -> None:
        bus = GPU_BUS[self.cgpu]
        self.detail = "thermal"
        self._gpu_root([f"NVRM: Xid (PCI:0000:{bus}:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
                        f"NVRM: GPU 0000:{bus}:00.0: GPU has fallen off the bus."], None, True)

    # --- network
    def _neighbors(self, g: int | None) -> np.ndarray:
        """Ranks talking to the culprit node over IB: same local rank on the ring neighbours."""
        cp = self.cpos
        nb = {(cp - 1) % self.N, (cp + 1) % self.N} - {cp}
        m = np.isin(self.pos, list(nb))
        if g is not None:
            m &= self.lr == g
        return m

    def _ib_victims(self, t_err: int, g: int | None) -> np.ndarray:
        """Neighbours get IB retry-exceeded naming the culprit's address, then abort; returns the mask."""
        m = self._neighbors(g)
        ts = t_err + self.jit(self.R, 0, 4)
        port = self.rng.integers(30000, 60000, self.R)
        tpl = IB12_NEW if self.style == 0 and self.rng.random() < 0.6 else IB12_OLD
        self.add_ranks(tpl, m, ts, a=port, peer=self.nodes[self.cpos])
        self.add_ranks(NET_ARROW, m, ts + 1000)
        if self.style == 0:
            self.block_ranks([REMOTE_TERM, REMOTE_MSG], m, ts + int(0.5 * NS))
        else:
            self.add_ranks(REMOTE_OLD, m, ts + int(0.5 * NS))
        return m

    def f_network_switch_cable(self) -> None:
        tf, cp, g = self.tf, self.cpos, self.cgpu
        self.detail = f"mlx5_{g} port 1"
        self.progress(tf)
        mine = (self.pos == cp) & (self.lr == g)
        self.add_ranks(IB_ASYNC_NEW if self.style == 0 else IB_ASYNC_OLD, mine, tf + self.jit(self.R, 0, 0.2))
        if self.rng.random() < 0.5:
            self.kernel(cp, [f"mlx5_core 0000:{NIC_BUS[g]}:00.0 ibp{int(NIC_BUS[g], 16)}s0: Link down"], tf - 300 * MS)
        hit = self._ib_victims(tf + int(self.rng.uniform(7, 20) * NS), g)
        self._cascade_rest(hit, exitcode={})

    def f_nic(self) -> None:
        tf, cp, g = self.tf, self.cpos, self.cgpu
        pci = f"0000:{NIC_BUS[g]}:00.0"
        self.progress(tf)
        if self.variant == "health":
            self.detail = f"mlx5_{g} ({pci})"
            lines = [f"mlx5_core {pci}: poll_health:803:(pid 0): device's health compromised - reached miss count",
                     f"mlx5_core {pci}: print_health_info:432:(pid 0): Health issue observed, firmware internal error, "
                     "severity(3) ERROR:",
                     f"mlx5_core {pci}: mlx5_health_try_recover:327:(pid {int(self.rng.integers(200, 9e5))}): handling bad device here"]
        else:
            self.detail = f"mlx5_{g} ({pci}) command interface"
            lines = [f"mlx5_core {pci}: wait_func:1171:(pid {int(self.rng.integers(200, 9e5))}): ACCESS_REG(0x805) "
                     "timeout. Will cause a leak of a command resource",
                     f"mlx5_core {pci}: mlx5_cmd_comp_handler:1614:(pid 0): Command completion arrived after timeout "
                     "(entry idx = 0)."]
        self.kernel(cp, lines, tf)
        mine = (self.pos == cp) & (self.lr == g)
        self.add_ranks(IB_CATA, mine, tf + self.jit(self.R, 0.5, 2))
        hit = self._ib_victims(tf + int(self.rng.uniform(7, 20) * NS), g)
        self._cascade_rest(hit, exitcode={})

    def _cascade_rest(self, already: np.ndarray, exitcode: dict[int, int], silent: np.ndarray | None = None) -> None:
        """Everyone not yet dead times out in the watchdog; then every node tears down."""
        victims = ~already
        if silent is not None:
            victims &= ~silent
        self.watchdog(victims, self.tf + self.T * NS)
        self.teardown(self.tf + (self.T + 4) * NS, exitcode)

    # --- node lost
    def _node_lost(self, dying_words: list[str] | None) -> None:
        tf, cp = self.tf, self.cpos
        self.progress(tf)
        if dying_words:
            self.kernel(cp, dying_words, tf - int(self.rng.uniform(0.2, 2) * NS))
        if self.N == 1:
            return  # the batch host itself is gone: nobody is left to say anything
        if self.rng.random() < 0.5:
            m = self._neighbors(None)
            ts = tf + self.jit(self.R, 7, 20)
            tpl = IB12_NEW if self.style == 0 and self.rng.random() < 0.6 else IB12_OLD
            self.add_ranks(tpl, m, ts, a=self.rng.integers(30000, 60000, self.R), peer=self.nodes[cp])
        t_nf = self.end - int(self.rng.uniform(5, 30) * NS)
        self.rows.add(f"srun: error: Node failure on {self.cl.nodes[int(self.nodes[cp])]}", self.job, self.nodes[0], t_nf)
        self.rows.add(STEP_ABORTED, self.job, self.nodes[0], t_nf + MS)
        alive = np.array([p for p in range(self.N) if p != cp])
        ts = t_nf + self.jit(len(alive), 0.5, 2)
        self.rows.add(STEPD_NODE_FAIL, self.job, self.nodes[alive], ts)
        if self.style == 0:
            self.rows.add(AGENT_DEATH, self.job, self.nodes[alive], ts + 10 * MS, pid=self.agent_pid[alive])

    def f_host_maintenance(self) -> None:
        self.detail = "maintenance"
        self._node_lost(None)

    def f_power_supply(self) -> None:
        self._node_lost(None)

    def f_server_chassis(self) -> None:
        self._node_lost(None)

    def f_io_expansion_board(self) -> None:
        self._node_lost(["pcieport 0000:16:01.0: AER: Uncorrected (Fatal) error received: 0000:17:00.0",
                         "pcieport 0000:16:01.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, "
                         "(Requester ID)"])

    def f_cpu(self) -> None:
        cpu = int(self.rng.integers(0, 112))
        self._node_lost([f"mce: [Hardware Error]: CPU {cpu}: Machine Check Exception: 5 Bank 6: b200000000070005",
                         "mce: [Hardware Error]: Run the above through 'mcelog --ascii'",
                         "Kernel panic - not syncing: Fatal machine check"])

    def f_system_memory(self) -> None:
        self._node_lost(["EDAC MC1: 1 UE memory read error on CPU_SrcID#1_MC#0_Chan#2_DIMM#0 (channel:2 slot:0 "
                         "page:0x7f3a21 offset:0x0 grain:32 - err_code:0x00a0:0x0091 SystemAddress:0x7f3a21000)",
                         "Kernel panic - not syncing: Fatal machine check"])

    # --- software on one rank
    def _rank_dies(self, ranks: list[int], lines_for, exitcode: int) -> None:
        tf = self.tf
        self.progress(tf)
        for j, k in enumerate(ranks):
            self.rank_raws(k, lines_for(k), tf + j * int(0.3 * NS))
        dead_nodes = {k // 8 for k in ranks}
        already = np.isin(self.pos, list(dead_nodes))  # torchrun tears down the culprit's node
        if self.style == 1:
            already = np.isin(self.ranks, ranks)
        codes = {p: exitcode for p in dead_nodes}
        first = {k // 8: k for k in reversed(ranks)}
        if already.all():
            self.teardown(tf + 3 * NS, codes, first_rank=first)
            return
        self.watchdog(~already, tf + self.T * NS)
        self.teardown(tf + (self.T + 4) * NS, codes, first_rank=first)

    def f_software_bug(self) -> None:
        if self.variant == "segv":
            self.f_segfault(lib="libnccl.so.2")
            return
        self.f_user_exception(one=True)

    def f_user_exception(self, one: bool | None = None) -> None:
        r = self.rng
        excs = [("KeyError: 'attention_mask'", "batch['attention_mask']"),
                ("IndexError: index 32768 is out of bounds for dimension 0 with size 32000", "embed(tokens)"),
                ("AttributeError: 'NoneType' object has no attribute 'shape'", "x.shape"),
                ("ValueError: Expected input batch_size (16) to match target batch_size (15).", "loss_fn(out, y)"),
                ("RuntimeError: shape '[4, 2048, 32, 128]' is invalid for input of size 16777216", "q.view(b, s, h, d)"),
                ("NameError: name 'attn_mask' is not defined", "attn(q, k, v, attn_mask)"),
                ("AssertionError: sequence length 8193 exceeds max_position_embeddings 8192", "assert s <= max_len")]
        exc, code = excs[int(r.integers(0, len(excs)))]
        self.detail = exc
        frames = [f"{{P}}     out = {code}"]
        if one is None:
            one = self.variant == "one_rank"
        if one:
            self._rank_dies([self.crank], lambda k: ["{P} Traceback (most recent call last):", *TRAIN_FRAMES,
                                                     *frames, "{P} " + exc], 1)
        else:
            self.progress(self.tf)
            self.traceback(self.mask(), self.tf + self.jit(self.R, 0, 1.5), frames, "{P} " + exc)
            self.teardown(self.tf + 3 * NS, {p: 1 for p in range(self.N)})

    def f_segfault(self, lib: str | None = None) -> None:
        r = self.rng
        lib = lib or str(r.choice(["libtorch_cuda.so", "flash_attn_2_cuda.cpython-310-x86_64-linux-gnu.so",
                                   "libcudnn_engines_precompiled.so.9", "_C.cpython-310-x86_64-linux-gnu.so"]))
        self.detail = lib
        k, cp = self.crank, self.cpos
        pid = int(self.pid[k])
        addr = int(r.integers(0x7F0000000000, 0x7FFFFFFFFFFF))

        def lines(k):
            if self.style == 0 and r.random() < 0.3:
                return [f"{{P}} *** SIGSEGV (@0x8) received by PID {pid} (TID 0x{addr:x}) from PID 8; stack trace: ***",
                        f"{{P}}     @     0x{addr + 0x1a2b:x} (unknown)", f"{{P}}     @     0x{addr - 0x55e0:x} ({lib}+0x3f1a2)"]
            return ["{P} Fatal Python error: Segmentation fault", "{P} ",
                    f"{{P}} Thread 0x{addr:016x} (most recent call first):",
                    f'{{P}}   File "{PY_LIB}/torch/autograd/graph.py", line 768 in _engine_run_backward',
                    f'{{P}}   File "{PY_LIB}/torch/autograd/__init__.py", line 289 in backward']
        self.kernel(cp, [f"pt_main_thread[{pid}]: segfault at 8 ip {addr:016x} sp {addr - 0x3a1f000:016x} error 4 in "
                         f"{lib}[{addr & ~0xFFFFFF:x}+4a000000]"], self.tf + 200 * MS)
        self._rank_dies([k], lines, -11)

    def f_cuda_oom(self) -> None:
        r = self.rng
        ranks = [self.crank]
        if self.variant == "several" and self.N * 8 > 2:
            extra = r.choice(np.setdiff1d(self.ranks, ranks), int(r.integers(1, 4)), replace=False)
            ranks += sorted(int(x) for x in extra)
        self.oom_ranks = ranks
        size = float(r.choice([0.5, 1.0, 2.0, 3.91, 7.81, 16.0]))
        free = float(r.uniform(0.1, 1.5))
        self.detail = f"tried to allocate {size:.2f} GiB"

        def lines(k):
            g = k % 8
            if self.style == 0:
                msg = (f"{{P}} torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {size:.2f} GiB. GPU {g} has "
                       f"a total capacity of 79.19 GiB of which {free:.2f} GiB is free. Including non-PyTorch memory, "
                       f"this process has {79.19 - free:.2f} GiB memory in use. Of the allocated memory "
                       f"{75.1 - free:.2f} GiB is allocated by PyTorch, and 2.31 GiB is reserved by PyTorch but "
                       "unallocated. If reserved but unallocated memory is large try setting "
                       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
                       "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
            else:
                msg = (f"{{P}} RuntimeError: CUDA out of memory. Tried to allocate {size:.2f} GiB (GPU {g}; 79.15 GiB "
                       f"total capacity; {75 - free:.2f} GiB already allocated; {free:.2f} GiB free; 76.50 GiB reserved "
                       "in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb "
                       "to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")
            return ["{P} Traceback (most recent call last):", *TRAIN_FRAMES, "{P}     logits = model(input_ids)",
                    f'{{P}}   File "{PY_LIB}/torch/nn/modules/module.py", line 1553, in _wrapped_call_impl',
                    "{P}     return self._call_impl(*args, **kwargs)", msg]
        self._rank_dies(ranks, lines, 1)

    def f_host_oom(self) -> None:
        r = self.rng
        tf, cp, k = self.tf, self.cpos, self.crank
        pid = int(self.pid[k])
        self.progress(tf)
        rss = int(r.integers(400, 1900)) * 1024 * 1024
        self.detail = f"anon-rss {rss // 1024 // 1024} GiB"
        memcg = f"/slurm/uid_{self.uid}/job_{self.job_id}"
        self.kernel(cp, [
            f"python invoked oom-killer: gfp_mask=0x140dca(GFP_HIGHUSER_MOVABLE|__GFP_COMP|__GFP_ZERO), order=0, oom_score_adj=0",
            f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0-1,oom_memcg={memcg},"
            f"task_memcg={memcg}/step_0/task_{cp},task=python,pid={pid},uid={self.uid}",
            f"Memory cgroup out of memory: Killed process {pid} (python) total-vm:{rss + 40_000_000}kB, anon-rss:{rss}kB, "
            f"file-rss:81920kB, shmem-rss:0kB, UID:{self.uid} pgtables:{rss // 500}kB oom_score_adj:0"], tf)
        if self.variant == "dataloader":
            self.rank_raws(k, ["{P} Traceback (most recent call last):", *TRAIN_FRAMES,
                               "{P}     batch = next(data_iter)",
                               f'{{P}}   File "{PY_LIB}/torch/utils/data/dataloader.py", line 1284, in _get_data',
                               "{P}     raise RuntimeError(f'DataLoader worker (pid(s) {pids_str}) exited unexpectedly') from e",
                               f"{{P}} RuntimeError: DataLoader worker (pid {pid + 40}) is killed by signal: Killed."],
                           tf + 2 * NS)
        self.rows.add("slurmstepd: error: Detected 1 oom_kill event in StepId={J}.0. Some of the step tasks have been "
                      "OOM Killed.", self.job, self.nodes[cp], tf + 5 * NS)
        task = cp if self.style == 0 else k
        self.rows.add(f"srun: error: {{PH}}: task {task}: Out Of Memory", self.job, self.nodes[0], tf + 6 * NS,
                      peer=self.nodes[cp])
        t_kill = tf + int(r.uniform(8, 25) * NS)
        others = [p for p in range(self.N) if p != cp]
        if others:
            self.rows.add(STEP_ABORTED, self.job, self.nodes[0], t_kill)
            if self.style == 0:
                self.rows.add(AGENT_DEATH, self.job, self.nodes[np.array(others)], t_kill + self.jit(len(others), 0, 1),
                              pid=self.agent_pid[np.array(others)])
        self.teardown(t_kill + 2 * NS, {cp: -9}, skip_pos=set(others), first_rank={cp: k})

    def f_nccl_watchdog_unexplained(self) -> None:
        self.detail = "no error printed"
        self.progress(self.tf)
        silent = self.ranks == self.crank
        self.watchdog(~silent, self.tf + self.T * NS)
        self.teardown(self.tf + (self.T + 4) * NS, {})

    def _nan(self) -> None:
        self.progress(self.tf, nan_from=0)
        s = self.last_step
        if self.style == 0:
            exc = f"{{P}} RuntimeError: Loss is NaN at step {s}; stopping (check data, learning rate and precision)"
        else:
            exc = f"{{P}} AssertionError: loss is nan at iteration {s}"
        self.traceback(self.mask(), self.tf + self.jit(self.R, 0, 1), ["{P}     check_finite(loss)"], exc)
        self.teardown(self.tf + 3 * NS, {p: 1 for p in range(self.N)})

    def f_sdc(self) -> None:
        self.detail = "NaN loss"
        self._nan()

    def f_nan_loss(self) -> None:
        self.detail = "NaN loss"
        self._nan()

    def f_checkpoint(self) -> None:  # save variant (load is a startup failure)
        r = self.rng
        path = f"/checkpoints/run{int(r.integers(1, 99))}/global_step{int(r.integers(1, 90)) * 1000}"
        # (a short write of torch's zip writer is the filesystem's fault, storage_io: not this story)
        layer = int(r.integers(0, 48))
        if r.random() < 0.5:
            exc = (f"{{P}} megatron.core.dist_checkpointing.core.CheckpointingException: Invalid access pattern for "
                   f"ShardedTensor(key='decoder.layers.{layer}.mlp.linear_fc1.weight'): some shards are saved by more than one rank")
        else:
            exc = (f"{{P}} megatron.core.dist_checkpointing.core.CheckpointingException: Invalid sharding pattern validation. "
                   f"Errors: ShardedTensor decoder.layers.{layer}.self_attention.linear_qkv.weight is not fully covered")
        self.detail = f"save to {path} failed"
        self._rank_dies([0], lambda k: ["{P} Traceback (most recent call last):", *TRAIN_FRAMES,
                                        "{P}     save_checkpoint(iteration, model, optimizer, opt_param_scheduler)",
                                        f'{{P}}   File "{PY_LIB}/megatron/core/dist_checkpointing/serialization.py", line 389, in save',
                                        "{P}     validate_sharding_integrity(determine_global_metadata(sharded_state_dict)[1])", exc], 1)

    def f_storage_error(self) -> None:
        r = self.rng
        v = self.variant
        if v == "stale":
            k = int(r.integers(0, self.R))
            path = f"/lustre/datasets/c4/en/shard_{int(r.integers(0, 4096)):05d}.arrow"
            self.detail = f"stale NFS file handle on {path}"
            exc = f"{{P}} OSError: [Errno 116] Stale file handle: '{path}'"
        elif v == "enospc":
            k = 0
            path = f"/checkpoints/run{int(r.integers(1, 99))}/global_step{int(r.integers(1, 90)) * 1000}/zero_pp_rank_0_mp_rank_00_optim_states.pt"
            self.detail = "no space left on the checkpoint filesystem"
            exc = f"{{P}} OSError: [Errno 28] No space left on device: '{path}'"
        else:
            k = int(r.integers(0, self.R))
            path = f"/lustre/datasets/pile/train/{int(r.integers(0, 30)):02d}.jsonl"
            self.detail = "Lustre OST I/O error"
            exc = f"{{P}} OSError: [Errno 5] Input/output error: '{path}'"
            pos = k // 8
            self.kernel(pos, [f"LustreError: 11-0: lustre-OST0007-osc-ffff8a1c3b5e2000: operation ost_read to node "
                              f"10.50.0.17@o2ib failed: rc = -5"], self.tf - int(r.uniform(1, 20) * NS))
        self._rank_dies([k], lambda _k: ["{P} Traceback (most recent call last):", *TRAIN_FRAMES,
                                         f"{{P}}     with open('{path}', 'rb') as fh:", exc], 1)

    def f_ssd(self) -> None:
        k, cp = self.crank, self.cpos
        self.kernel(cp, ["nvme nvme0: I/O 417 QID 12 timeout, aborting",
                         "nvme nvme0: controller is down; will reset: CSTS=0xffffffff, PCI_STATUS=0xffff",
                         "nvme nvme0: Removing after probe failure status: -19",
                         "blk_update_request: I/O error, dev nvme0n1, sector 1953525 op 0x0:(READ) flags 0x80700 "
                         "phys_seg 1 prio class 0"], self.tf - 2 * NS)
        self.detail = "nvme0"
        self._rank_dies([k], lambda _k: ["{P} Traceback (most recent call last):", *TRAIN_FRAMES,
                                         "{P}     data = np.load(cache_path, mmap_mode='r')",
                                         "{P} OSError: [Errno 5] Input/output error: '/local_nvme/cache/tokens_0091.npy'"],
                        1)

    def f_dependency(self) -> None:
        self.detail = "nfs01"
        self.progress(self.tf)
        ts = self.tf + self.jit(self.N, 0, 30)
        for p in range(self.N):
            self.kernel(p, ["nfs: server nfs01 not responding, still trying"], int(ts[p]))
        k = int(self.rng.integers(0, self.R))
        t = self.tf + self.T * NS
        self.rank_raws(k, ["{P} Traceback (most recent call last):", *TRAIN_FRAMES, "{P}     batch = next(data_iter)",
                           f'{{P}}   File "{PY_LIB}/torch/utils/data/dataloader.py", line 1133, in _try_get_data',
                           "{P}     raise RuntimeError(f'DataLoader timed out after {self._timeout} seconds') from e",
                           f"{{P}} RuntimeError: DataLoader timed out after {self.T} seconds"], t)
        self.teardown(t + 3 * NS, {p: 1 for p in range(self.N)})

    # --- scheduler
    def _sched_end(self, reason: str | None) -> None:
        end = self.end
        self.progress(end - 30 * NS)
        ts = end + self.jit(self.N, 0, 1)
        if reason is None:
            self.rows.add(STEPD_CANCEL, self.job, self.nodes[0], ts[0])
            self.rows.add(STEPD_STEP_CANCEL, self.job, self.nodes, ts + MS)
        else:
            self.rows.add(STEPD_JOB % reason, self.job, self.nodes[0], ts[0])
            self.rows.add(STEPD % reason, self.job, self.nodes, ts + MS)
        self.rows.add(STEP_ABORTED, self.job, self.nodes[0], ts[0] + 2 * MS)
        if self.style == 0:
            self.rows.add(AGENT_DEATH, self.job, self.nodes, ts + 50 * MS, pid=self.agent_pid)
            m = self.lr < 8
            self.add_ranks(AGENT_SIGTERM.replace("{PID}", "{D}").replace("{A}", "{PID}"), m,
                           ts[self.pos] + 60 * MS, d=self.agent_pid[self.pos])

    def f_timeout(self) -> None:
        self._sched_end("TIME LIMIT")

    def f_preempted(self) -> None:
        self._sched_end("PREEMPTION")

    def f_cancelled(self) -> None:
        self.detail = "its user" if self.variant == "user" else "an administrator"
        self._sched_end(None)


def node_lost(fault: str) -> bool:
    return fault in NODE_LOST
