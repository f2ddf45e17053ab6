"""The fault catalog: what can end a job, how often, and the verdict it deserves.

`group` says where the weight comes from:
- `infra`: the 419 unexpected interruptions of Llama 3 405B pre-training (Dubey et al. 2024,
  table 5), used as relative weights; a job's chance of one grows with its node-hours.
- `workload`: user and workload failures, a share of all jobs regardless of size.
- `scheduler`: time limits, preemptions, cancellations.

`blame` is what truth records as the culprit: `node` (the machine where it started), `rank`
(the process where it started, a workload fault: never a reason to drain a node) or `none`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    name: str
    group: str
    weight: float
    outcome: str
    state: str
    blame: str
    root_cause: str


FAULTS: tuple[Fault, ...] = (
    # --- infra: Llama 3 405B interruption counts (out of 419) ---
    Fault("gpu_faulty", "infra", 148, "gpu_hardware", "FAILED", "node",
          "Faulty GPU on {node} (GPU {gpu}): {detail}; the other ranks timed out waiting for it"),
    Fault("gpu_hbm", "infra", 72, "gpu_hardware", "FAILED", "node",
          "Uncorrectable HBM3 memory error on {node} GPU {gpu} ({detail}); the rank on it failed, the others timed out"),
    Fault("software_bug", "infra", 54, "user_code_error", "FAILED", "rank",
          "Software bug: rank {rank} on {node} {detail}; the other ranks were torn down or timed out"),
    Fault("network_switch_cable", "infra", 35, "network_ib", "FAILED", "node",
          "IB link of {node} ({detail}) went down (switch/cable); peers got transport retry errors naming it"),
    Fault("host_maintenance", "infra", 32, "node_failure", "NODE_FAIL", "node",
          "Host maintenance took {node} down during the job; Slurm reported NODE_FAIL"),
    Fault("gpu_sram", "infra", 19, "gpu_hardware", "FAILED", "node",
          "Uncorrectable GPU SRAM error on {node} GPU {gpu} ({detail})"),
    Fault("gpu_gsp", "infra", 17, "gpu_driver_xid_other", "FAILED", "node",
          "GPU System Processor (GSP) fault on {node} GPU {gpu} ({detail}); the GPU stopped responding"),
    Fault("nic", "infra", 7, "network_ib", "FAILED", "node",
          "ConnectX NIC {detail} on {node} hit a fatal firmware/hardware error; peers lost it"),
    Fault("nccl_watchdog_unexplained", "infra", 7, "nccl_timeout_hang", "FAILED", "rank",
          "Rank {rank} on {node} stopped progressing with no visible cause; every other rank hit the NCCL watchdog"),
    Fault("sdc", "infra", 6, "numerical_nan", "FAILED", "none",
          "Silent data corruption: the loss became NaN; the corrupting GPU cannot be told from the logs"),
    Fault("gpu_thermal", "infra", 6, "gpu_hardware", "FAILED", "node",
          "GPU thermal interface/sensor fault on {node} GPU {gpu}: it overheated and fell off the bus"),
    Fault("ssd", "infra", 3, "storage_io", "FAILED", "node",
          "Local NVMe SSD of {node} failed; reads of the data cache failed on rank {rank}"),
    Fault("power_supply", "infra", 3, "node_failure", "NODE_FAIL", "node",
          "Power supply failure took {node} down; Slurm reported NODE_FAIL"),
    Fault("server_chassis", "infra", 2, "node_failure", "NODE_FAIL", "node",
          "Server chassis fault on {node}; the node went down and Slurm reported NODE_FAIL"),
    Fault("io_expansion_board", "infra", 2, "node_failure", "NODE_FAIL", "node",
          "Fatal PCIe error on the IO expansion board of {node}; the node went down"),
    Fault("dependency", "infra", 2, "storage_io", "FAILED", "none",
          "A dependency (the NFS data server) stopped responding; data loading timed out"),
    Fault("cpu", "infra", 2, "node_failure", "NODE_FAIL", "node",
          "CPU machine check on {node}: kernel panic, node lost"),
    Fault("system_memory", "infra", 2, "node_failure", "NODE_FAIL", "node",
          "Uncorrectable host DIMM error on {node}: kernel panic, node lost"),
    # --- workload: share of all jobs (percent) ---
    Fault("user_exception", "workload", 3.0, "user_code_error", "FAILED", "rank",
          "Python exception in the user's program ({detail})"),
    Fault("config_error", "workload", 2.2, "config_error", "FAILED", "none",
          "Environment/config error at startup on every rank ({detail})"),
    Fault("cuda_oom", "workload", 1.8, "cuda_oom", "FAILED", "rank",
          "CUDA out of memory on rank {rank} ({detail}); the other ranks timed out or were torn down"),
    Fault("host_oom", "workload", 0.7, "host_oom", "OUT_OF_MEMORY", "rank",
          "Host RAM exhausted on {node}: the kernel OOM killer killed rank {rank} ({detail})"),
    Fault("nan_loss", "workload", 0.5, "numerical_nan", "FAILED", "none",
          "Training diverged: the loss became NaN and the script stopped"),
    Fault("checkpoint", "workload", 0.7, "checkpoint", "FAILED", "none",
          "Checkpoint {detail}"),
    Fault("storage_error", "workload", 0.7, "storage_io", "FAILED", "none",
          "Storage error ({detail})"),
    Fault("segfault", "workload", 0.4, "segfault_native", "FAILED", "rank",
          "Native crash (SIGSEGV) of rank {rank} on {node} in {detail}"),
    # --- scheduler: share of all jobs (percent) ---
    Fault("timeout", "scheduler", 3.5, "scheduler_timelimit", "TIMEOUT", "none",
          "The job reached its wall-time limit"),
    Fault("cancelled", "scheduler", 3.0, "scheduler_preemption_cancel", "CANCELLED", "none",
          "The job was cancelled by {detail}"),
    Fault("preempted", "scheduler", 1.5, "scheduler_preemption_cancel", "PREEMPTED", "none",
          "The job was preempted by a higher-priority job"),
)

BY_NAME = {f.name: f for f in FAULTS}
INFRA = tuple(f for f in FAULTS if f.group == "infra")
OTHER = tuple(f for f in FAULTS if f.group != "infra")
# Faults a lemon node can keep having (node-blamed and repeatable on the same hardware).
LEMON_FAULTS = ("gpu_faulty", "gpu_hbm", "gpu_sram", "nic", "network_switch_cable")
