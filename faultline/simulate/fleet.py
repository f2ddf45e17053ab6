"""The simulated fleet: clusters, nodes (8 GPUs, IB NICs, one IPv4 each), partitions, lemon nodes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

GPUS_PER_NODE = 8
# PCI bus ids of the 8 GPUs and 8 ConnectX NICs of an HGX H100 board (as `lspci` shows them).
GPU_BUS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
NIC_BUS = ("19", "2b", "3b", "5e", "9b", "ac", "bb", "dc")
IB_DEVS = tuple(f"mlx5_{i}" for i in range(8))
CLUSTER_NAMES = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")
PARTITIONS = (("batch", 0.55), ("large", 0.15), ("debug", 0.12), ("interactive", 0.08), ("low", 0.10))


@dataclass
class Cluster:
    name: str
    letter: str
    index: int
    nodes: list[str]
    ips: list[str]
    gpu_uuids: list[list[str]]
    lemons: dict[int, str] = field(default_factory=dict)  # node index -> the fault it keeps having
    lemon_gpu: dict[int, int] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.nodes)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "scheduler": "slurm",
            "partitions": [p for p, _ in PARTITIONS],
            "gpus_per_node": GPUS_PER_NODE,
            "gpu_model": "NVIDIA H100 80GB HBM3",
            "nodes": [
                {"name": n, "ip": ip, "gpus": [{"index": g, "pci": f"0000:{GPU_BUS[g]}:00.0", "uuid": u}
                                               for g, u in enumerate(uu)],
                 "nics": [{"device": d, "pci": f"0000:{NIC_BUS[i]}:00.0", "port": 1} for i, d in enumerate(IB_DEVS)]}
                for n, ip, uu in zip(self.nodes, self.ips, self.gpu_uuids)],
            "lemon_nodes": [{"node": self.nodes[i], "fault": f, "gpu": self.lemon_gpu.get(i)}
                            for i, f in sorted(self.lemons.items())],
        }


def _uuid(rng: np.random.Generator) -> str:
    h = rng.integers(0, 16, 32)
    s = "".join("0123456789abcdef"[x] for x in h)
    return f"GPU-{s[:8]}-{s[8:12]}-{s[12:16]}-{s[16:20]}-{s[20:]}"


def build_clusters(n_clusters: int, nodes_per_cluster: int, rng: np.random.Generator,
                   lemon_faults: tuple[str, ...], lemon_share: float) -> list[Cluster]:
    out = []
    for c in range(n_clusters):
        name = CLUSTER_NAMES[c] if c < len(CLUSTER_NAMES) else f"cluster{c}"
        letter = chr(ord("a") + c % 26)
        nodes = [f"gpu-{letter}-{i + 1:04d}" for i in range(nodes_per_cluster)]
        # 10.<16+c>.<rack>.<slot>: unique per node across the fleet
        ips = [f"10.{16 + c}.{i // 200}.{i % 200 + 10}" for i in range(nodes_per_cluster)]
        uuids = [[_uuid(rng) for _ in range(GPUS_PER_NODE)] for _ in range(nodes_per_cluster)]
        cl = Cluster(name, letter, c, nodes, ips, uuids)
        n_lemons = max(2, int(round(nodes_per_cluster * lemon_share)))
        for i in sorted(rng.choice(nodes_per_cluster, n_lemons, replace=False).tolist()):
            cl.lemons[int(i)] = str(rng.choice(list(lemon_faults)))
            cl.lemon_gpu[int(i)] = int(rng.integers(0, GPUS_PER_NODE))
        out.append(cl)
    return out


def hostlist(prefix: str, runs: list[tuple[int, int]], width: int = 4) -> str:
    """Slurm hostlist of node indexes given as (start, length) runs: gpu-a-[0001-0004,0007]."""
    idx = sorted({s + k for s, n in runs for k in range(n)})
    parts, i = [], 0
    while i < len(idx):
        j = i
        while j + 1 < len(idx) and idx[j + 1] == idx[j] + 1:
            j += 1
        a, b = idx[i] + 1, idx[j] + 1
        parts.append(f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}")
        i = j + 1
    if len(idx) == 1:
        return f"{prefix}{parts[0]}"
    return f"{prefix}[{','.join(parts)}]"


def expand_hostlist(text: str) -> list[str]:
    """Inverse of `hostlist` for the forms Slurm prints (prefix[a-b,c],other[...] lists)."""
    out, depth, cur = [], 0, ""
    items = []
    for ch in text:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        cur += ch
    if cur:
        items.append(cur)
    for item in items:
        if "[" not in item:
            out.append(item)
            continue
        prefix, rest = item.split("[", 1)
        body, suffix = rest.split("]", 1)
        for part in body.split(","):
            if "-" in part:
                a, b = part.split("-")
                out += [f"{prefix}{k:0{len(a)}d}{suffix}" for k in range(int(a), int(b) + 1)]
            else:
                out.append(f"{prefix}{part}{suffix}")
    return out
