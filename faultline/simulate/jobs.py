"""Job table of the simulated fleet: sizes, times, allocations and the fault each job meets.

Everything is drawn up front per cluster with numpy (100k jobs are a few MB); logs are made
later, day by day, from these rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from faultline.simulate.faults import BY_NAME, INFRA, LEMON_FAULTS, OTHER
from faultline.simulate.fleet import GPUS_PER_NODE, PARTITIONS, Cluster

NS = 1_000_000_000
SIZES = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
SIZE_W = np.array([38, 17, 12, 10, 8, 6, 4, 2.5, 1.5, 0.5, 0.2])
LIMIT_H = {"batch": 24, "large": 48, "debug": 2, "interactive": 4, "low": 12}
NAMES = ("pretrain-llama-8b", "pretrain-moe-16x3b", "sft-llama-70b", "dpo-mistral-7b", "rlhf-ppo-13b",
         "vit-h14-in22k", "diffusion-xl", "bert-large-ft", "eval-harness", "long-ctx-128k", "distill-3b",
         "speech-conformer", "protein-esm", "code-llm-34b", "ablation-lr-sweep")
USERS = ("akumar", "bchen", "cdiaz", "dnguyen", "eokafor", "fmueller", "gsato", "hpatel", "ijohansson",
         "jkim", "klopez", "lwang", "mrossi", "nsingh", "oadeyemi", "pnovak", "qzhao", "rgarcia", "sito",
         "tbrown", "ucelik", "vrao", "wlee", "xliu", "ysmith", "zhuang")
# Watchdog timeout by launch style: 0 = torchrun, PyTorch >= 2.2 (10 min); 1 = srun, PyTorch 1.x/2.0 (30 min)
WATCHDOG_S = (600, 1800)
CASCADE = {"gpu_faulty", "gpu_hbm", "gpu_sram", "gpu_gsp", "gpu_thermal", "software_bug", "network_switch_cable",
           "nic", "nccl_watchdog_unexplained", "ssd", "cuda_oom", "user_exception", "segfault", "storage_error",
           "checkpoint"}
NETWORK = {"network_switch_cable", "nic"}
NODE_LOST = {"host_maintenance", "power_supply", "server_chassis", "io_expansion_board", "cpu", "system_memory"}
VARIANTS = {
    "gpu_faulty": (("xid79", 50), ("xid48", 15), ("xid94", 10), ("xid95", 10), ("ecc_app", 15)),
    "gpu_hbm": (("xid48", 40), ("xid95", 25), ("xid94", 15), ("xid64", 20)),
    "gpu_sram": (("xid48_sram", 60), ("xid95_sram", 40)),
    "gpu_gsp": (("xid119", 70), ("xid120", 30)),
    "software_bug": (("exception", 60), ("segv", 40)),
    "network_switch_cable": (("port_error", 100),),
    "nic": (("health", 60), ("cmd_timeout", 40)),
    "user_exception": (("one_rank", 60), ("all_ranks", 40)),
    "config_error": (("module", 50), ("file", 25), ("args", 25)),
    "cuda_oom": (("one", 75), ("several", 25)),
    "host_oom": (("kernel", 60), ("dataloader", 40)),
    "checkpoint": (("save", 50), ("load", 50)),
    "storage_error": (("stale", 40), ("enospc", 35), ("lustre", 25)),
    "cancelled": (("user", 80), ("admin", 20)),
}


@dataclass
class SimConfig:
    jobs: int = 5000
    days: int = 7
    clusters: int = 2
    seed: int = 0
    start: str = "2025-03-03"
    nodes_per_cluster: int = 1152
    infra_share: float = 0.05        # jobs with an infra interruption (weighted by node-hours)
    healthy_log_share: float = 0.02  # completed jobs that still get logs
    missing_syslog: float = 0.03     # logged failed jobs without any syslog
    missing_applog: float = 0.02     # logged failed multi-node jobs missing one node's applog
    lemon_share: float = 0.005       # nodes per cluster that keep failing
    metrics_only_per_cluster: int = 1  # GPU-Xid failures whose syslog is not shipped: only metrics show them
    lemon_pick: float = 0.35         # node faults of a lemon's kind that land on a lemon
    new_style_share: float = 0.7     # torchrun + PyTorch >= 2.2 formats; the rest srun + old formats
    requeue_share: float = 0.6       # preempted jobs requeued as attempt 1

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class JobTable:
    """Column arrays, one entry per job attempt, plus each row's allocation as (start, length) runs."""

    cols: dict[str, np.ndarray]
    runs: list[list[tuple[int, int]]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.cols["job_id"])

    def nodes(self, i: int) -> np.ndarray:
        return np.concatenate([np.arange(s, s + n) for s, n in self.runs[i]])


def _pick(rng: np.random.Generator, items: tuple, n: int | None = None):
    names = [x[0] for x in items]
    w = np.array([x[1] for x in items], dtype=float)
    return rng.choice(names, size=n, p=w / w.sum())


def _runs(rng: np.random.Generator, size: int, total: int, must: int | None) -> list[tuple[int, int]]:
    """1-3 ascending, disjoint runs of node indexes covering `size` nodes (and node `must`)."""
    k = 1 if size < 4 or rng.random() < 0.7 else int(rng.integers(2, 4))
    cuts = np.sort(rng.choice(np.arange(1, size), k - 1, replace=False)) if k > 1 else np.array([], int)
    lens = np.diff(np.concatenate([[0], cuts, [size]])).astype(int)
    gaps = rng.integers(1, 12, k - 1) if k > 1 else np.array([], int)
    span = int(lens.sum() + gaps.sum())
    if must is not None:
        off = int(rng.integers(0, lens[0]))
        start = must - off
    else:
        start = int(rng.integers(0, max(1, total - span + 1)))
    start = min(max(start, 0), total - span)
    if must is not None and not (start <= must < start + lens[0]):
        start = max(0, min(must, total - span))  # near the edge: put the node first
        if not (start <= must < start + lens[0]):
            start, lens, gaps = max(0, min(must, total - size)), np.array([size]), np.array([], int)
    out, pos = [], start
    for j, ln in enumerate(lens):
        out.append((pos, int(ln)))
        pos += int(ln) + (int(gaps[j]) if j < len(gaps) else 0)
    return out


def build_jobs(cfg: SimConfig, clusters: list[Cluster]) -> JobTable:
    start_ns = int(np.datetime64(cfg.start, "s").astype(np.int64)) * NS
    per = [cfg.jobs // len(clusters) + (1 if c < cfg.jobs % len(clusters) else 0) for c in range(len(clusters))]
    rows: dict[str, list] = {k: [] for k in (
        "cluster", "cidx", "job_id", "attempt", "name", "user", "uid", "partition", "submit", "start", "end",
        "fail_t", "limit_s", "nnodes", "state", "raw_state", "exit_code", "fault", "variant", "outcome",
        "blame", "culprit_pos", "culprit_rank", "culprit_gpu", "style", "has_logs", "missing", "missing_pos",
        "row_seed")}
    runs: list[list[tuple[int, int]]] = []
    infra_names = [f.name for f in INFRA]
    infra_w = np.array([f.weight for f in INFRA])
    other_names = [f.name for f in OTHER]
    other_w = np.array([f.weight for f in OTHER]) / 100.0
    for cl, n in zip(clusters, per):
        rng = np.random.default_rng([cfg.seed, 1, cl.index])
        submit = np.sort(start_ns + (rng.random(n) * cfg.days * 86400 * NS).astype(np.int64))
        size = rng.choice(SIZES, n, p=SIZE_W / SIZE_W.sum())
        odd = rng.random(n) < 0.2
        size = np.where(odd & (size > 2), rng.integers(np.maximum(size // 2, 1), size + 1), size)
        size = np.minimum(size, cl.size)
        part = rng.choice([p for p, _ in PARTITIONS], n, p=[w for _, w in PARTITIONS])
        part = np.where(size >= 128, "large", np.where((part == "debug") & (size > 4), "batch", part))
        part = np.where((part == "large") & (size < 32), "batch", part)
        limit_s = np.array([LIMIT_H[p] * 3600 for p in part])
        planned = np.clip(rng.lognormal(np.log(3 * 3600), 1.1, n), 300, limit_s).astype(np.int64)
        wait = rng.lognormal(np.log(60 + 20 * size ** 0.8), 1.0, n).astype(np.int64)
        nh = size * planned / 3600.0
        k = cfg.infra_share * n / nh.sum()
        for _ in range(3):  # clipping lowers the mean: correct k a few times
            p_inf = np.clip(k * nh, 0, 0.5)
            k *= cfg.infra_share / max(p_inf.mean(), 1e-9)
        p_inf = np.clip(k * nh, 0, 0.5)
        u = rng.random(n)
        infra = u < p_inf
        u2 = rng.random(n)
        other = ~infra & (u2 < other_w.sum())
        fault = np.where(infra, rng.choice(infra_names, n, p=infra_w / infra_w.sum()),
                         np.where(other, rng.choice(other_names, n, p=other_w / other_w.sum()), "none"))
        style = (rng.random(n) >= cfg.new_style_share).astype(np.int8)
        job_ids = 4_200_000 + 1_000_000 * cl.index + np.arange(n) * 3 + rng.integers(0, 3, n)
        lemons_by_fault: dict[str, list[int]] = {}
        for node, f in cl.lemons.items():
            lemons_by_fault.setdefault(f, []).append(node)
        for i in range(n):
            jr = np.random.default_rng([cfg.seed, 2, cl.index, i])
            f = str(fault[i])
            sz = int(size[i])
            while sz == 1 and f in NETWORK:  # a one-node job does not use the IB fabric
                f = str(jr.choice(infra_names, p=infra_w / infra_w.sum()))
            spec = BY_NAME.get(f)
            variant = str(_pick(jr, VARIANTS[f])) if f in VARIANTS else ""
            must, lemon_gpu = None, None
            if f in LEMON_FAULTS and f in lemons_by_fault and jr.random() < cfg.lemon_pick:
                must = int(jr.choice(lemons_by_fault[f]))
                lemon_gpu = cl.lemon_gpu[must]
            job_runs = _runs(jr, sz, cl.size, must)
            nodes = np.concatenate([np.arange(s, s + ln) for s, ln in job_runs])
            st = int(submit[i] + wait[i] * NS)
            sty = int(style[i])
            T = WATCHDOG_S[sty]
            lim = int(limit_s[i])
            cpos = crank = cgpu = -1
            if spec is not None and spec.blame != "none":
                if must is not None:
                    cpos = int(np.searchsorted(nodes, must))
                elif f in NODE_LOST and sz > 1:
                    cpos = int(jr.integers(1, sz))
                else:
                    cpos = int(jr.integers(0, sz))
                cgpu = lemon_gpu if lemon_gpu is not None else int(jr.integers(0, GPUS_PER_NODE))
                crank = cpos * GPUS_PER_NODE + cgpu
            plan = int(planned[i])
            if f == "none":
                tf, end = st + plan * NS, st + plan * NS
            elif f == "timeout":
                end = st + lim * NS
                tf = end
            elif f in ("config_error",) or (f == "checkpoint" and variant == "load"):
                tf = st + int(jr.uniform(15, 240) * NS)
                end = tf + int(jr.uniform(2, 20) * NS)
            else:
                budget = max(120, min(plan, lim - T - 400))
                frac = jr.uniform(0.05, 0.95)
                if f == "cuda_oom" and jr.random() < 0.5:
                    frac = jr.uniform(0.0, 0.1)
                tf = st + int(max(90, budget * frac) * NS)
                if f in CASCADE and variant not in ("all_ranks", "load"):
                    end = tf + int((T + jr.uniform(5, 60)) * NS)
                elif f in NODE_LOST:
                    end = tf + int(jr.uniform(300, 400) * NS)
                elif f == "dependency":
                    end = tf + int((T + jr.uniform(20, 90)) * NS)
                else:
                    end = tf + int(jr.uniform(2, 30) * NS)
            state = spec.state if spec else "COMPLETED"
            raw = state
            uid = 1000 + USERS.index(USERS[int(jr.integers(0, len(USERS)))])
            user = USERS[uid - 1000]
            if state == "CANCELLED":
                raw = f"CANCELLED by {uid if variant == 'user' else 0}"
            exit_code = {"FAILED": "1:0", "NODE_FAIL": "0:0", "OUT_OF_MEMORY": "0:125", "TIMEOUT": "0:0",
                         "CANCELLED": "0:15", "PREEMPTED": "0:0", "COMPLETED": "0:0"}[state]
            if state == "FAILED" and sty == 1 and (f == "segfault" or variant == "segv"):
                exit_code = "139:0"
            failed = state != "COMPLETED"
            has_logs = failed or jr.random() < cfg.healthy_log_share
            missing, mpos = "", -1
            if failed:
                um = jr.random()
                if um < cfg.missing_syslog:
                    missing = "syslog"
                elif sz > 1 and um < cfg.missing_syslog + cfg.missing_applog:
                    missing, mpos = "applog", int(jr.integers(0, sz))
            outcome = spec.outcome if spec else "healthy"
            if f == "software_bug" and variant == "segv":
                outcome = "segfault_native"
            blame = spec.blame if spec else "none"
            if f == "user_exception" and variant == "all_ranks":
                blame, cpos, crank, cgpu = "none", -1, -1, -1
            if blame == "none":
                cpos = crank = cgpu = -1
            attempts = [(0, f, state, raw, exit_code, st, end, tf, job_runs, has_logs, missing, mpos,
                         outcome, blame, cpos, crank, cgpu, variant)]
            if f == "preempted" and jr.random() < cfg.requeue_share:
                st1 = end + int(jr.lognormal(np.log(600), 1.0) * NS)
                runs1 = _runs(jr, sz, cl.size, None)
                rem = max(300, plan - (tf - st) // NS)
                attempts.append((1, "none", "COMPLETED", "COMPLETED", "0:0", st1, st1 + rem * NS, st1 + rem * NS,
                                 runs1, jr.random() < cfg.healthy_log_share, "", -1, "healthy", "none",
                                 -1, -1, -1, ""))
            for (att, f_, state_, raw_, ec_, st_, end_, tf_, runs_, hl_, miss_, mpos_, out_, bl_, cp_, cr_, cg_,
                 var_) in attempts:
                rows["cluster"].append(cl.name)
                rows["cidx"].append(cl.index)
                rows["job_id"].append(str(job_ids[i]))
                rows["attempt"].append(att)
                rows["name"].append(NAMES[int(jr.integers(0, len(NAMES)))] if att == 0 else rows["name"][-1])
                rows["user"].append(user)
                rows["uid"].append(uid)
                rows["partition"].append(str(part[i]))
                rows["submit"].append(int(submit[i]) if att == 0 else end)
                rows["start"].append(st_)
                rows["end"].append(end_)
                rows["fail_t"].append(tf_)
                rows["limit_s"].append(lim)
                rows["nnodes"].append(sz)
                rows["state"].append(state_)
                rows["raw_state"].append(raw_)
                rows["exit_code"].append(ec_)
                rows["fault"].append(f_)
                rows["variant"].append(var_)
                rows["outcome"].append(out_)
                rows["blame"].append(bl_)
                rows["culprit_pos"].append(cp_)
                rows["culprit_rank"].append(cr_)
                rows["culprit_gpu"].append(cg_)
                rows["style"].append(sty)
                rows["has_logs"].append(bool(hl_))
                rows["missing"].append(miss_)
                rows["missing_pos"].append(mpos_)
                rows["row_seed"].append(i * 2 + att)
                runs.append(runs_)
    cols = {k: np.array(v) for k, v in rows.items()}
    return JobTable(cols, runs)
