"""Faults that only the metrics show: a GPU Xid on one node of a job whose syslog was not shipped.

The kernel line (`NVRM: Xid ...`) is in syslog; without it the applog shows only the victims (NCCL
timeouts, a CUDA error on the ranks of the bad GPU's node), and the DCGM Xid gauge that rose on that GPU
is the one root evidence. `mark` turns a few logged GPU-Xid jobs into such jobs (their truth stays
gpu_hardware on that node); the metrics writer already emits the Xid gauge for every GPU fault.
"""

from __future__ import annotations

import numpy as np

from faultline.simulate.jobs import JobTable

# Xid variants whose catalog entry blames the node's GPU (the DCGM rule maps the code the same way)
HARDWARE_XIDS = ("xid79", "xid48", "xid94", "xid95")


def mark(jt: JobTable, per_cluster: int, seed: int) -> list[int]:
    """Make up to `per_cluster` logged, node-blamed GPU-Xid failures of each cluster metrics-only
    (syslog missing); returns the job rows changed. Deterministic by `seed`."""
    c = jt.cols
    if per_cluster <= 0:
        return []
    fault = c["fault"].astype(str)
    eligible = ((np.char.startswith(fault, "gpu_")) & np.isin(c["variant"].astype(str), HARDWARE_XIDS)
                & c["has_logs"].astype(bool) & (c["blame"].astype(str) == "node") & (c["culprit_pos"] >= 0)
                & (c["attempt"] == 0))
    rng = np.random.default_rng([seed, 11])
    picked: list[int] = []
    for ci in np.unique(c["cidx"]).tolist():
        rows = np.flatnonzero(eligible & (c["cidx"] == ci))
        if rows.size:
            picked += sorted(rng.choice(rows, size=min(per_cluster, rows.size), replace=False).tolist())
    if picked and c["missing"].dtype.kind == "U" and c["missing"].dtype.itemsize < 4 * len("syslog"):
        c["missing"] = c["missing"].astype("<U8")  # room for the value (a fleet may have had none)
    for i in picked:
        c["missing"][i] = "syslog"
        c["missing_pos"][i] = -1
    return picked
