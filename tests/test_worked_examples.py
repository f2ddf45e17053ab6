"""The worked examples of DESIGN.md, as multi-node logs written the way real jobs write them."""

from faultline.pipeline import diagnose_files


def watchdog(rank: int, hhmmss: str, seq: int = 1580) -> str:
    return (f"[rank{rank}]:[E321 {hhmmss}.408271257 ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog caught "
            f"collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=466119168, "
            f"NumelOut=466119168, Timeout(ms)=600000) ran for 600060 milliseconds before timing out.")


def sigabrt(rank: int) -> str:
    return (f"[rank{rank}]:[E321 10:12:09.465150152 ProcessGroupNCCL.cpp:1664] [PG 1 Rank {rank}] "
            "Exception (either an error or timeout) detected by watchdog at work: 1580, last enqueued NCCL work: "
            "1582, last completed NCCL work: 1579.")


def test_xid79_culprit_node_others_affected(tmp_path, write, ruleset):
    write("node-a/dmesg.log",
          "[Thu Mar 21 10:02:00 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, "
          "GPU has fallen off the bus.")
    write("node-a/train.log", "[rank0]: step 1200 loss 2.31")
    for i, node in enumerate(["node-b", "node-c", "node-d"], start=1):
        write(f"{node}/train.log", f"[rank{i}]: step 1200 loss 2.31", watchdog(i, "10:12:08"), sigabrt(i))
    d = diagnose_files([tmp_path], ruleset)
    assert d["outcome"] == "gpu_hardware", d
    assert d["culprit"]["nodes"] == ["node-a"]
    assert not d["ambiguous"]
    assert d["confidence"] == "high"
    assert set(d["affected"]["nodes"]) == {"node-b", "node-c", "node-d"}
    assert d["recommended_action"]["action"] in ("drain_node", "reset_gpu")
    assert d["recommended_action"]["targets"] == ["node-a"]
    assert d["evidence"][0]["node"] == "node-a" and "Xid" in d["evidence"][0]["line"]


IB_PORT = "node-b:34050:34121 [0] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : port error"
BOOT_B = "node-b:34050:34050 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.2<0>"
BOOT_C = "node-c:73076:73076 [4] NCCL INFO Bootstrap : Using eth0:10.0.0.3<0>"
IB12 = ("node-c:73076:73185 [4] transport/net_ib.cc:1238 NCCL WARN NET/IB : Got completion from peer "
        "{peer}<37948> with error 12, opcode 2, len 1, vendor err 129")


def test_ib_port_error_blames_the_port_owner_not_the_reporter(tmp_path, write, ruleset):
    write("combined.log", BOOT_B, BOOT_C, IB_PORT, IB_PORT.replace("[0]", "[1]"), IB12.format(peer="10.0.0.2"))
    d = diagnose_files([tmp_path / "combined.log"], ruleset)
    assert d["outcome"] == "network_ib"
    assert d["culprit"]["nodes"] == ["node-b"]
    assert "node-c" in d["affected"]["nodes"]


def test_ib_peer_address_resolved_through_bootstrap_lines(tmp_path, write, ruleset):
    write("combined.log", BOOT_B, BOOT_C, IB12.format(peer="10.0.0.2"))
    d = diagnose_files([tmp_path / "combined.log"], ruleset)
    assert d["outcome"] == "network_ib"
    assert d["culprit"]["nodes"] == ["node-b"]  # the peer, never the node that spoke
    assert "node-c" not in d["culprit"]["nodes"]


def test_ib_peer_unmapped_is_named_by_address_with_lower_confidence(tmp_path, write, ruleset):
    write("combined.log", BOOT_C, IB12.format(peer="10.0.0.9"))
    d = diagnose_files([tmp_path / "combined.log"], ruleset)
    assert d["outcome"] == "network_ib"
    assert d["culprit"]["nodes"] == ["10.0.0.9"]
    assert d["confidence"] in ("low", "medium")
    assert d["recommended_action"]["action"] not in ("drain_node", "reset_gpu")
    assert "could not be mapped" in d["confidence_reason"]


def test_cuda_oom_beats_later_timeouts_and_never_drains(tmp_path, write, ruleset):
    write("train.log",
          "[rank2]:[E321 09:00:01.000000000 train.py:10] step failed",
          "[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
          "capacity of 79.15 GiB of which 1.23 GiB is free.",
          *[watchdog(r, "09:10:02") for r in (0, 1, 3)])
    d = diagnose_files([tmp_path / "train.log"], ruleset)
    assert d["outcome"] == "cuda_oom"
    assert d["culprit"]["ranks"] == [2]
    assert d["domain"] == "workload"
    assert d["recommended_action"]["action"] == "fix_and_resubmit"
    assert d["recommended_action"]["targets"] == []


def test_the_one_silent_rank_is_the_inferred_culprit(tmp_path, write, ruleset):
    lines = [f"[rank{r}]: step 900 loss 1.7" for r in range(64)]
    lines += [watchdog(r, "02:07:08") for r in range(64) if r != 17]
    write("train.log", *lines)
    d = diagnose_files([tmp_path / "train.log"], ruleset)
    assert d["outcome"] == "nccl_timeout_hang"
    assert d["culprit"]["ranks"] == [17]
    assert d["confidence"] == "medium"
    assert "only rank" in d["confidence_reason"]
    assert not d["ambiguous"]


def test_a_rank_that_never_spoke_is_hang_or_lost_node(tmp_path, write, ruleset):
    lines = [f"[rank{r}]: step 900 loss 1.7" for r in range(64) if r != 17]
    lines += [watchdog(r, "02:07:08") for r in range(64) if r != 17]
    write("train.log", *lines)
    d = diagnose_files([tmp_path / "train.log"], ruleset)
    assert d["ambiguous"]
    assert {c["outcome"] for c in d["candidates"]} == {"nccl_timeout_hang", "node_failure"}
    assert d["culprit"] == {"nodes": [], "ranks": [], "gpus": [], "gpu_pci": [], "local_ranks": []}
    assert d["recommended_action"]["action"] == "human_review"


def test_completed_job_with_benign_chatter_is_healthy(tmp_path, write, ruleset):
    write("node-a/train.log",
          "node-a:100:100 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.2<0>",
          "node-a:100:100 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",
          "node-a:100:100 [0] NCCL INFO Could not find real path of /sys/class/net/eth0/device",
          "node-a:100:200 [0] NCCL INFO [Service thread] Connection closed by localRank 1",
          "[rank0]: training finished")
    write("node-a/dmesg.log",
          "[Thu Mar 21 10:02:00 2024] NVRM: Xid (PCI:0000:3b:00): 63, pid=4242, name=python, Row Remapper: "
          "New row (0x0000000000001234) marked for remapping, reset gpu to activate.")
    d = diagnose_files([tmp_path], ruleset, state="COMPLETED")
    assert d["outcome"] == "healthy"
    assert d["culprit"] == {"nodes": [], "ranks": [], "gpus": [], "gpu_pci": [], "local_ranks": []}
    assert d["recommended_action"]["action"] == "no_action"


def test_time_limit_does_not_blame_the_printing_node(tmp_path, write, ruleset):
    write("slurm-4711.out",
          "slurmstepd: error: *** JOB 4711 ON gpu017 CANCELLED AT 2024-03-21T10:00:00 DUE TO TIME LIMIT ***")
    d = diagnose_files([tmp_path / "slurm-4711.out"], ruleset)
    assert d["outcome"] == "scheduler_timelimit"
    assert d["culprit"] == {"nodes": [], "ranks": [], "gpus": [], "gpu_pci": [], "local_ranks": []}
    assert d["recommended_action"]["action"] not in ("drain_node", "reset_gpu")


def test_conflicting_roots_at_the_same_moment_are_ambiguous(tmp_path, write, ruleset):
    write("node-a/dmesg.log",
          "[Thu Mar 21 10:02:00 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.")
    write("node-b/dmesg.log",
          "[Thu Mar 21 10:02:01 2024] NVRM: Xid (PCI:0000:18:00): 74, pid=1912, name=python, NVLink: fatal error "
          "detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)")
    d = diagnose_files([tmp_path], ruleset)
    # Two definitive hardware faults one second apart on two nodes: both fit, so say so.
    assert d["ambiguous"]
    assert {c["outcome"] for c in d["candidates"]} == {"gpu_hardware", "nvlink"}
    assert d["culprit"]["nodes"] == []
    assert d["recommended_action"]["action"] == "human_review"
    assert d["confidence"] == "low"


def test_first_failure_wins_beyond_the_skew_tolerance(tmp_path, write, ruleset):
    write("node-a/dmesg.log",
          "[Thu Mar 21 10:02:00 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.")
    write("node-b/dmesg.log",
          "[Thu Mar 21 10:05:00 2024] NVRM: Xid (PCI:0000:18:00): 74, pid=1912, name=python, NVLink: fatal error "
          "detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)")
    d = diagnose_files([tmp_path], ruleset)
    assert not d["ambiguous"]
    assert d["outcome"] == "gpu_hardware"
    assert d["culprit"]["nodes"] == ["node-a"]


def test_same_evidence_same_verdict(tmp_path, write, ruleset):
    write("train.log", *[watchdog(r, "02:07:08") for r in range(8) if r != 3], "[rank3]: step 1 loss 1")
    a = diagnose_files([tmp_path / "train.log"], ruleset, diagnosed_at="x")
    b = diagnose_files([tmp_path / "train.log"], ruleset, diagnosed_at="x")
    assert a == b
