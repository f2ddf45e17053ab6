"""The fixed vocabularies of DESIGN.md: outcomes, roles, domains, actions, sources, job states."""

OUTCOMES: dict[str, str] = {
    "gpu_hardware": "GPU/HBM/SRAM fault: uncorrectable ECC, Xid 48/63-64 failure/79/94/95/140, fallen off the bus",
    "gpu_driver_xid_other": "driver/firmware/GSP faults and other Xids, driver mismatch, CUDA 802",
    "nvlink": "NVLink/NVSwitch/fabric manager faults (Xid 74, 144-150, SXid)",
    "network_ib": "InfiniBand/RoCE/EFA fabric: port errors, link down, retry exceeded with a named peer",
    "network_socket_rendezvous": "TCP store / c10d rendezvous / DNS / connection refused",
    "nccl_timeout_hang": "collective timeout or hang where no earlier root cause is visible",
    "cuda_oom": "GPU out of memory",
    "host_oom": "host RAM exhausted: OOM killer, cgroup kill, MemoryError",
    "user_code_error": "an exception in the user's program (Python traceback, device-side assert)",
    "numerical_nan": "NaN/Inf loss or gradients",
    "storage_io": "filesystem/object store errors: NFS/Lustre, stale handle, disk or /dev/shm full",
    "checkpoint": "checkpoint save/load failure or incompatibility",
    "config_error": "environment/config: missing module or file, bad arguments, two ranks on one GPU, version mismatch",
    "segfault_native": "native crash: SIGSEGV, illegal instruction, core dump",
    "scheduler_timelimit": "wall-time limit reached",
    "scheduler_preemption_cancel": "preempted, requeued or cancelled by a user or admin",
    "node_failure": "node lost: NODE_FAIL, kernel panic, unreachable, NotReady",
    "healthy": "the job did not fail, or the scary lines are benign",
    "unknown": "failed, but the evidence names no cause",
}

# Order matters: it is the tier used by the decide phase (lower wins).
ROLES = ("root", "confirmation", "cascade", "teardown", "context")
ROLE_TIER = {role: i for i, role in enumerate(ROLES)}

DOMAINS = ("hardware", "network", "software", "workload", "infrastructure", "scheduler", "unknown")
IMPLICATES = ("self", "peer", "none")
ACTIONS = (
    "drain_node", "reset_gpu", "restart", "restart_excluding",
    "fix_and_resubmit", "no_action", "human_review",
)
# Actions that take hardware out of service: only ever aimed at culprits of a
# hardware/network/infrastructure domain, never at a workload culprit.
NODE_ACTIONS = ("drain_node", "reset_gpu", "restart_excluding")
STATUSES = ("experimental", "test", "stable", "deprecated")
SOURCES = ("applog", "syslog", "scheduler", "k8s_event")

JOB_STATES = (
    "COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
    "CANCELLED", "PREEMPTED", "RUNNING", "PENDING", "UNKNOWN",
)
FAILED_STATES = ("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "CANCELLED", "PREEMPTED")
