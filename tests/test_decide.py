"""Decide-phase behaviours beyond the worked examples, each from a small realistic log."""

from faultline.pipeline import diagnose_files

from .test_worked_examples import watchdog

NOBODY = {"nodes": [], "ranks": [], "gpus": [], "gpu_pci": [], "local_ranks": []}


def test_teardown_alone_says_failed_but_not_why(write, ruleset):
    # The task that exited on its own with a code is where to look; the one srun's teardown signalled
    # and the node the step was cancelled on are not. Nothing says why: unknown, nobody drained.
    p = write("slurm-1.out",
              "srun: error: gpu-p03: task 2: Exited with exit code 255",
              "slurmstepd: error: *** STEP 120331.0 ON gpu-p01 CANCELLED AT 2025-01-14T09:13:12 ***",
              "srun: error: gpu-p01: task 0: Terminated")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "unknown" and not d["ambiguous"] and d["confidence"] == "low"
    assert d["culprit"] == {**NOBODY, "nodes": ["gpu-p03"]} and d["recommended_action"]["action"] == "human_review"
    q = write("slurm-2.out",
              "slurmstepd: error: *** STEP 120331.0 ON gpu-p01 CANCELLED AT 2025-01-14T09:13:12 ***",
              "srun: error: gpu-p01: task 0: Terminated", "srun: error: gpu-p02: tasks 4-7: Killed")
    d = diagnose_files([q], ruleset)
    assert d["outcome"] == "unknown" and d["culprit"] == NOBODY


def test_a_completed_job_is_healthy_whatever_it_printed(write, ruleset):
    # (an exception the interpreter *ignored* is not even a failure without the state: python.exception_ignored)
    p = write("train.log", "[rank0]: Traceback (most recent call last):",
              "[rank0]: AttributeError: 'NoneType' object has no attribute 'join'")
    assert diagnose_files([p], ruleset)["outcome"] == "user_code_error"  # without the scheduler's word
    d = diagnose_files([p], ruleset, state="COMPLETED")
    assert d["outcome"] == "healthy" and d["culprit"] == NOBODY
    assert "not fatal" in d["confidence_reason"]
    assert d["evidence"]  # the lines stay visible


def test_desync_report_blames_the_ranks_it_names_not_its_printer(write, ruleset):
    lines = [watchdog(r, "03:00:00") for r in range(8)]
    lines += ["[rank0]:[E321 03:00:01.1 ProcessGroupNCCL.cpp:1400] [PG 0 Rank 0]  - To our best knowledge, the "
              "lagging/dead/mismatched ranks that caused the desync are:",
              "[rank0]:[E321 03:00:01.1 ProcessGroupNCCL.cpp:1400]    - [5] joined but didn't finish collective "
              "#2811 (count from 1)"]
    d = diagnose_files([write("train.log", *lines)], ruleset)
    assert d["outcome"] == "nccl_timeout_hang"
    assert d["culprit"]["ranks"] == [5] and 0 not in d["culprit"]["ranks"]


def test_a_rank_a_desync_report_names_is_placed_on_the_node_its_own_lines_came_from(write, ruleset, tmp_path):
    # rank 5 timed out too (it printed on trn-b01 only); the report on trn-b00 names it: its node is trn-b01
    write("trn-b00/train.log", *[watchdog(r, "03:00:00") for r in range(4)],
          "[rank0]:[E321 03:00:01.1 ProcessGroupNCCL.cpp:1400]    - [5] joined but didn't finish collective "
          "#1580 (count from 1)")
    write("trn-b01/train.log", *[watchdog(r, "03:00:00") for r in range(4, 8)])
    d = diagnose_files([tmp_path], ruleset)
    assert d["outcome"] == "nccl_timeout_hang"
    assert d["culprit"]["ranks"] == [5] and d["culprit"]["nodes"] == ["trn-b01"]
    assert "named rank's own lines" in d["confidence_reason"] and d["confidence"] == "low"


def test_a_named_rank_whose_lines_came_from_two_hosts_gets_no_node(write, ruleset, tmp_path):
    # two attempts' logs put rank 5 on two hosts: which one is unknown, so the rank stays alone
    write("trn-c00/train.log", *[watchdog(r, "03:00:00") for r in range(4)],
          "[rank0]:[E321 03:00:01.1 ProcessGroupNCCL.cpp:1400]    - [5] joined but didn't finish collective "
          "#1580 (count from 1)")
    write("trn-c01/train.log", *[watchdog(r, "03:00:00") for r in range(4, 8)])
    write("trn-c02/train.log", watchdog(5, "03:00:00"))
    d = diagnose_files([tmp_path], ruleset)
    assert d["culprit"]["ranks"] == [5] and d["culprit"]["nodes"] == []


def test_a_dcp_checkpoint_exception_yields_to_the_inner_exception_it_carries(write, ruleset):
    # DCP's CheckpointException text carries each failed rank's exception: disk full decides, not ambiguous
    head = ["[rank0]: torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([0, 1])",
            "[rank0]: Traceback (most recent call last): (RANK 0)",
            '[rank0]:   File "/opt/torch/distributed/checkpoint/filesystem.py", line 350, in _write_files_from_queue']
    d = diagnose_files([write("a/train.log", *head, "[rank0]: OSError: [Errno 28] No space left on device")], ruleset,
                       state="FAILED")
    assert d["outcome"] == "storage_io" and not d["ambiguous"] and d["culprit"] == NOBODY
    d = diagnose_files([write("b/train.log", head[0])], ruleset, state="FAILED")  # the inner lines cut off
    assert d["outcome"] == "checkpoint" and d["culprit"] == NOBODY


def test_a_rank_that_only_heard_of_the_error_through_the_store_is_no_silent_rank(write, ruleset, tmp_path):
    # torch 2.8+ propagates a rank's error through the store: rank 2 aborts on `remote error detected from
    # rank: 5` without printing a timeout of its own. It reported the failure; it is not the one silent rank.
    for n, node in enumerate(["trn-d00", "trn-d01"]):
        lines = [watchdog(r, "03:00:00") for r in range(4 * n, 4 * n + 4) if r != 2]
        if n == 0:
            lines.append("[rank2]:[E321 03:00:05.1 ProcessGroupNCCL.cpp:1910] [PG ID 0 PG GUID 0(default_pg) Rank 2]  "
                         "remote error detected from rank: 5")
        write(f"{node}/train.log", *lines)
    d = diagnose_files([tmp_path], ruleset)
    assert d["outcome"] == "nccl_timeout_hang" and d["culprit"] == NOBODY


def test_a_silent_rank_on_a_node_that_kept_logging_hung(write, ruleset, tmp_path):
    for n, node in enumerate(["trn-a01", "trn-a02"]):
        ranks = range(8 * n, 8 * n + 8)
        write(f"{node}/train.log", *[f"[rank{r}]: step 48000 loss 1.9" for r in ranks if r != 13],
              *[watchdog(r, "05:00:00", 48211) for r in ranks if r != 13])
    d = diagnose_files([tmp_path], ruleset)
    # rank 13 never printed, but it sits in trn-a02's block (8-15) and trn-a02 kept logging
    assert d["outcome"] == "nccl_timeout_hang" and not d["ambiguous"]
    assert d["culprit"]["ranks"] == [13] and d["confidence"] == "medium"
    assert d["culprit"]["nodes"] == ["trn-a02"]  # where the hung rank lives


def test_when_every_candidate_names_the_same_node_the_node_stays(write, ruleset, tmp_path):
    write("gpu-07/dmesg.log",
          "[Thu Mar 21 10:02:00 2024] NVRM: Xid (PCI:0000:3b:00): 74, pid=1912, name=python, NVLink: fatal error "
          "detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
          "[Thu Mar 21 10:02:01 2024] mce: [Hardware Error]: Machine check events logged",
          "[Thu Mar 21 10:02:01 2024] mce: [Hardware Error]: CPU 12: Machine Check: 0 Bank 5: be00000000800400 "
          "Fatal uncorrected error")
    d = diagnose_files([tmp_path], ruleset)
    # NVLink fault or machine check: whichever cause, the place is the same node.
    assert d["culprit"]["nodes"] == ["gpu-07"]
    assert d["ambiguous"] is (d["recommended_action"]["action"] == "human_review")


def test_a_previous_jobs_scheduler_line_is_not_this_jobs_evidence(write, ruleset, capsys):
    from faultline.cli import main

    p = write("slurm-61121.out",
              "slurmstepd: error: *** JOB 61120 ON gpu017 CANCELLED AT 2024-03-21T09:30:00 DUE TO TIME LIMIT ***",
              "[rank0]: RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory")
    assert main(["diagnose", str(p), "--format", "json"]) == 1
    import json

    d = json.loads(capsys.readouterr().out)
    assert d["job_id"] == "61121" and d["outcome"] == "checkpoint" and not d["ambiguous"]
    # the same line about this very job still counts
    d2 = diagnose_files([p], ruleset, job_id="61120")
    assert "scheduler_timelimit" in {d2["outcome"]} | {c["outcome"] for c in d2["candidates"]}


def test_a_log_source_that_failed_lowers_confidence_unless_a_root_signature_stands(write, ruleset, tmp_path):
    # Timeouts on ranks 0-2, rank 3 only trained: the silent rank is the inferred culprit (medium).
    applog = ["[rank3]:[I321 02:57:00.000000000 train.py:10] step 100 loss 1.0"] + [watchdog(r, "03:07:08") for r in range(3)]
    write("ok/slurm.out", *applog)
    write("lost/slurm.out", *applog)
    write("lost/syslog.log.gz", data=b"\x1f\x8b\x08\x00not gzip at all")  # the node log that could say why
    ok = diagnose_files([tmp_path / "ok"], ruleset)
    lost = diagnose_files([tmp_path / "lost"], ruleset)
    assert ok["outcome"] == lost["outcome"] == "nccl_timeout_hang" and lost["culprit"]["ranks"] == [3]
    assert (ok["confidence"], lost["confidence"]) == ("medium", "low")
    assert "telemetry missing: syslog" in lost["confidence_reason"] and "telemetry" not in ok["confidence_reason"]
    # A root signature in the log that did arrive does not depend on the one that failed.
    oom = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.11 GiB"
    write("root/slurm.out", *applog, oom)
    write("root/syslog.log.gz", data=b"\x1f\x8b\x08\x00not gzip at all")
    root = diagnose_files([tmp_path / "root"], ruleset)
    assert root["outcome"] == "cuda_oom" and root["confidence"] == "high"
    assert "telemetry missing: syslog" in root["confidence_reason"]


def test_a_peer_address_never_resolves_to_the_printer_by_a_shared_first_octet(write, ruleset):
    # 10.9.9.9 and the printing node 10.42.7.19 both "shorten" to 10: that is no match
    p = write("job/train.log",
              "10.42.7.19:411:420 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
              "10.9.9.9<34567> with error 12, opcode 0, len 0, vendor err 129 (Recv)")
    d = diagnose_files([p], ruleset)
    assert "10.42.7.19" not in d["culprit"]["nodes"]


def test_ranks_timing_out_at_different_seqnums_name_the_one_behind(write, ruleset):
    wd = ("[rank{r}]:[E1206 18:44:13.275158817 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective "
          "operation timeout: WorkNCCL(SeqNum={s}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
          "ran for 600060 milliseconds before timing out.")
    p = write("job/train.log", *(wd.format(r=r, s=1580 if r != 5 else 1579) for r in range(8)))
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "nccl_timeout_hang" and d["culprit"]["ranks"] == [5]
    assert "lowest last completed" in d["confidence_reason"]
    # all in step: nobody is named
    p2 = write("job2/train.log", *(wd.format(r=r, s=1580) for r in range(8)))
    assert diagnose_files([p2], ruleset)["culprit"]["ranks"] == []


def test_a_link_local_or_cut_peer_address_names_no_node(write, ruleset):
    for peer in ("fe80::1e34:daff:fe5a:8b2c%ib0", "10.0.0.", "127.0.0.1"):
        p = write(f"job-{len(peer)}/train.log",
                  f"gpu-3:411:420 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
                  f"{peer}<34567> with error 12, opcode 0, len 0, vendor err 129 (Recv)")
        d = diagnose_files([p], ruleset)
        assert d["culprit"]["nodes"] == [] and "gpu-3" not in d["culprit"]["nodes"], peer


def test_a_redacted_host_name_is_no_node_but_its_rank_stays(write, ruleset):
    for host in ("xxxxxxxx", "XXX.XXX.XXX.XXX", "XXXX-XX"):
        p = write(f"job-{len(host)}/mpirun.log",
                  f"mpirun noticed that process rank 1 with PID 20315 on node {host} exited on signal 9 (Killed).")
        d = diagnose_files([p], ruleset)
        assert d["culprit"]["nodes"] == [] and d["culprit"]["ranks"] == [1], host


def test_a_peer_with_a_port_a_placeholder_or_a_docker_gateway_is_no_node(write, ruleset):
    ib = ("gpu-3:411:420 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
          "{}<34567> with error 12, opcode 0, len 0, vendor err 129 (Recv)")
    for peer in ("NODE7_IP", "INFINIBAND-IP", "x.x.x.x", "172.17.0.1", "172.18.0.1"):
        d = diagnose_files([write(f"job-{peer}/train.log", ib.format(peer))], ruleset)
        assert d["culprit"]["nodes"] == [], peer
    # a real private address is still a node (172.16/12 hosts are common), and an uppercase host stays one
    d = diagnose_files([write("job-mapped/train.log", ib.format("::ffff:10.3.0.48"))], ruleset)
    assert d["culprit"]["nodes"] == ["10.3.0.48"]  # an IPv4-mapped address is the IPv4 host
    for peer in ("172.18.4.21", "SHIPYARD01"):
        d = diagnose_files([write(f"job-{peer}/train.log", ib.format(peer))], ruleset)
        assert d["culprit"]["nodes"] == [peer], peer
    # UCX prints the peer as ip:port: the node is the address, not `address:port`
    ucx = ("[1722990401.208990] [trn-b07:69399:0]           sock.c:116  UCX  ERROR connect(fd=34, "
           "dest_addr=10.31.4.77:35892) failed: Connection timed out")
    d = diagnose_files([write("ucx/train.log", ucx)], ruleset)
    assert d["culprit"]["nodes"] == ["10.31.4.77"]


def test_a_peer_that_is_the_printers_own_host_blames_nobody(write, ruleset):
    p = write("job/train.log",
              "trn-a11:5120:5188 [1] misc/socket.cc:538 NCCL WARN Net : Connection closed by remote peer "
              "trn-a11.cluster.internal<47861>")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "network_socket_rendezvous"
    assert d["culprit"]["nodes"] == [] and d["affected"]["nodes"] == ["trn-a11"]


def test_a_worker_known_only_by_its_local_rank_is_the_culprit(write, ruleset):
    p = write("job/train.log",
              "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 4101 closing signal SIGTERM",
              "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 2 (pid: 4102) "
              "of binary: /usr/bin/python")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "host_oom"
    assert d["culprit"]["local_ranks"] == [2] and d["culprit"]["ranks"] == [] and d["culprit"]["nodes"] == []


def test_an_ignored_exception_at_shutdown_is_not_a_failure(write, ruleset):
    p = write("job/train.log", "Training finished.", "Exception ignored in: <function Pool.__del__ at 0x7f5b2c1d3e20>",
              "Traceback (most recent call last):", '  File "/usr/lib/python3.10/multiprocessing/pool.py", line 268',
              "AttributeError: 'NoneType' object has no attribute 'warn'")
    assert diagnose_files([p], ruleset)["outcome"] == "healthy"
    # a real traceback far below still counts
    q = write("job2/train.log", "Exception ignored in: <function Pool.__del__ at 0x7f5b2c1d3e20>",
              *[f"step {i}" for i in range(40)], "Traceback (most recent call last):", "KeyError: 'labels'")
    assert diagnose_files([q], ruleset)["outcome"] == "user_code_error"


def test_a_nan_warning_the_run_went_on_past_is_not_the_cause(write, ruleset):
    p = write("job/train.log", "[rank0]: iteration 100: loss = nan",
              "[rank0]: {'loss': 1.9312, 'grad_norm': 0.83, 'epoch': 0.12}")
    assert diagnose_files([p], ruleset)["outcome"] == "healthy"
    # no progress after it: the NaN stands
    q = write("job2/train.log", "[rank0]: {'loss': 1.9312, 'grad_norm': 0.83, 'epoch': 0.12}",
              "[rank0]: iteration 100: loss = nan")
    assert diagnose_files([q], ruleset)["outcome"] == "numerical_nan"


def test_the_only_host_a_log_names_is_not_blamed_for_a_network_fault_it_reports(write, ruleset):
    # one node's lines of a many-node job: the refused peer is elsewhere; r11i6n2 only noticed
    p = write("job/train.log",
              "r11i6n2:1234:1300 [0] NCCL INFO Bootstrap : Using ib0:10.148.3.10<0>",
              "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:825, unhandled system error, NCCL version 2.7.8")
    d = diagnose_files([p], ruleset)
    assert d["culprit"]["nodes"] == []


def test_host_memory_exhaustion_without_a_host_is_placed_on_the_only_host_lines_or_messages_name(write, ruleset):
    p = write("job/train.log", "alice@cpu-n12:~/run$ sbatch train.sh",
              "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=77.batch. Some of your processes may "
              "have been killed by the cgroup out-of-memory handler.")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "host_oom" and d["culprit"]["nodes"] == ["cpu-n12"]
    assert d["confidence"] != "high" and "only host the logs name" in d["confidence_reason"]
    assert d["recommended_action"]["action"] not in ("drain_node", "restart_excluding")
    # a host named in a message counts: two hosts, none inferred for the line that names none
    q = write("job2/train.log", "alice@cpu-n12:~/run$ sbatch train.sh",
              "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=78.batch. Some of your processes may "
              "have been killed by the cgroup out-of-memory handler.",
              "srun: error: cpu-n13: task 3: Out Of Memory")
    assert diagnose_files([q], ruleset)["culprit"]["nodes"] == ["cpu-n13"]


def test_a_node_failure_its_printer_reports_of_itself_is_placed_on_the_only_host(write, ruleset):
    p = write("job/raylet.txt", "(base) ray@ip-10-2-3-4:/tmp/ray/session_latest/logs$ tail raylet.out",
              "[2024-05-01 10:00:00,001 C 811 811] (raylet) node_manager.cc:1001: [Timeout] Exiting because this "
              "node manager has mistakenly been marked as dead by the GCS: GCS failed to check the health of this "
              "node for 5 times.")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "node_failure" and d["culprit"]["nodes"] == ["ip-10-2-3-4"]
    assert d["confidence"] != "high" and "only host the logs name" in d["confidence_reason"]


def test_a_hardware_line_without_a_host_is_placed_on_the_jobs_only_host_at_reduced_confidence(write, ruleset):
    p = write("job/train.log", "gpu-a-07:1234:1300 [0] NCCL INFO Bootstrap : Using ib0:10.1.0.7<0>",
              "[rank1]: RuntimeError: CUDA error: uncorrectable ECC error encountered")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "gpu_hardware" and d["culprit"]["nodes"] == ["gpu-a-07"]
    assert d["confidence"] != "high" and "only host the logs name" in d["confidence_reason"]


def test_a_fault_that_spreads_node_after_node_is_systemic_not_the_first_nodes(write, ruleset):
    # a health check failing on node after node for an hour: the first two are not "the" culprit
    lines = [f"[2025-07-04T0{h}:{m:02d}:23.932] update_node: node cpu-dy-{n} reason set to: Scheduler health check failed"
             for h, m, n in [(0, 54, 8), (0, 54, 10), (1, 0, 22), (1, 1, 11), (1, 14, 1), (2, 10, 12)]]
    d = diagnose_files([write("slurmctld.log", *lines)], ruleset)
    assert d["outcome"] == "node_failure" and d["culprit"] == NOBODY
    assert "not in one place" in d["confidence_reason"]
    # the same reason on one node of a job that shows six is that node's
    d = diagnose_files([write("one/slurmctld.log", lines[2], *[f"cpu-dy-{n}: step 3 started" for n in (8, 10, 11, 1, 12)])], ruleset)
    assert d["culprit"]["nodes"] == ["cpu-dy-22"]


def test_a_workload_fault_that_names_only_its_gpu_names_that_gpu(write, ruleset):
    p = write("train.log", "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 564.00 MiB. "
              "GPU 1 has a total capacity of 22.20 GiB of which 203.12 MiB is free.")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "cuda_oom" and d["culprit"]["gpus"] == [1] and d["culprit"]["nodes"] == []
    assert d["recommended_action"]["action"] not in ("drain_node", "reset_gpu")
    # a machine fault naming a GPU index on no known host names no culprit
    p = write("other/train.log", "gpu-a-1:11:12 [0] NCCL INFO Bootstrap : Using ib0:10.0.0.1<0>",
              "gpu-a-2:11:12 [0] NCCL INFO Bootstrap : Using ib0:10.0.0.2<0>",
              "Detected 2 volatile double-bit ECC error(s) in GPU 3.")
    d = diagnose_files([p], ruleset)
    assert d["culprit"]["gpus"] == [] and d["culprit"]["nodes"] == []


TORCHRUN_SUMMARY = (
    "============================================================",
    "train.py FAILED",
    "------------------------------------------------------------",
    "Failures:",
    "  <NO_OTHER_FAILURES>",
    "------------------------------------------------------------",
    "Root Cause (first observed failure):",
    "[0]:",
    "  time      : 2025-04-02_07:14:09",
    "  host      : gpu-node-3.cluster",
    "  rank      : 13 (local_rank: 5)",
    "  exitcode  : -9 (pid: 48213)",
    "  error_file: <N/A>",
    "  traceback : Signal 9 (SIGKILL) received by PID 48213",
    "============================================================",
)


def test_a_torchrun_summary_entry_gives_its_host_and_rank_to_its_field_lines(write, ruleset):
    d = diagnose_files([write("job/train.log", *TORCHRUN_SUMMARY)], ruleset)
    assert d["culprit"]["nodes"] == ["gpu-node-3.cluster"] and d["culprit"]["ranks"] == [13]


def test_a_summary_host_far_above_a_field_line_is_not_its_host(write, ruleset):
    lines = list(TORCHRUN_SUMMARY)
    lines[10:10] = [f"  step {i} loss 2.{i:03d}" for i in range(8)]  # the host line is now 8+ lines above
    d = diagnose_files([write("job/train.log", *lines)], ruleset)
    assert "gpu-node-3.cluster" not in d["culprit"]["nodes"]


DESCRIBE_NODE = (
    "Name:               gpu-pool-b-91xz",
    "Roles:              <none>",
    "Labels:             beta.kubernetes.io/arch=amd64",
    "                    kubernetes.io/hostname=gpu-pool-b-91xz",
    "                    kubernetes.io/os=linux",
    "Taints:             node.kubernetes.io/unreachable:NoSchedule",
    "Conditions:",
    "  Type             Status    LastHeartbeatTime                 LastTransitionTime                Reason"
    "              Message",
    "  ----             ------    -----------------                 ------------------                ------"
    "              -------",
    "  MemoryPressure   Unknown   Tue, 04 Mar 2025 02:11:40 +0000   Tue, 04 Mar 2025 02:12:25 +0000   "
    "NodeStatusUnknown   Kubelet stopped posting node status.",
    "  Ready            Unknown   Tue, 04 Mar 2025 02:11:40 +0000   Tue, 04 Mar 2025 02:12:25 +0000   "
    "NodeStatusUnknown   Kubelet stopped posting node status.",
)


def test_kubectl_describe_node_conditions_are_the_described_nodes(write, ruleset):
    d = diagnose_files([write("describe.txt", *DESCRIBE_NODE)], ruleset)
    assert d["outcome"] == "node_failure" and d["culprit"]["nodes"] == ["gpu-pool-b-91xz"]


def test_a_pods_node_line_heads_its_events_not_an_earlier_nodes_description(write, ruleset):
    pod = ("Name:             trainer-worker-2",
           "Namespace:        team-a",
           "Node:             gpu-pool-b-40aa/10.8.3.17",
           "Events:",
           "  Warning  NodeNotReady  2m  node-controller  Node is not ready")
    d = diagnose_files([write("describe.txt", *DESCRIBE_NODE[:4], "", *pod)], ruleset)
    assert d["outcome"] == "node_failure" and d["culprit"]["nodes"] == ["gpu-pool-b-40aa"]


def test_a_log_quoted_in_a_reply_reads_as_the_log(write, ruleset):
    lines = ("gpu-node-7: [Tue Mar  4 02:11:40 2025] NVRM: Xid (PCI:0000:3b:00): 79, pid=51234, name=python, "
             "GPU has fallen off the bus.",
             "gpu-node-2: [Tue Mar  4 02:21:44 2025] python[8812]: step 4100 loss 1.93",
             watchdog(0, "02:21:44"), watchdog(5, "02:21:45"))
    plain = diagnose_files([write("plain/train.log", *lines)], ruleset)
    assert plain["outcome"] == "gpu_hardware" and plain["culprit"]["nodes"] == ["gpu-node-7"]
    for quote in ("> ", ">> ", "> > "):
        d = diagnose_files([write(f"q{len(quote)}/train.log", *(quote + x for x in lines))], ruleset)
        assert (d["outcome"], d["culprit"]) == (plain["outcome"], plain["culprit"]), quote


def test_a_sigkill_among_the_other_failures_is_the_agents_teardown_not_an_oom(write, ruleset):
    # rank 2 raised first; torchrun then stopped the others: SIGTERM, SIGKILL 30 s later for rank 0
    summary = ("train.py FAILED", "-" * 60, "Failures:", "[1]:", "  time      : 2025-04-02_07:14:39",
               "  host      : gpu-node-3", "  rank      : 0 (local_rank: 0)", "  exitcode  : -9 (pid: 48210)",
               "  error_file: <N/A>", "  traceback : Signal 9 (SIGKILL) received by PID 48210", "-" * 60,
               "Root Cause (first observed failure):", "[0]:", "  time      : 2025-04-02_07:14:09",
               "  host      : gpu-node-3", "  rank      : 2 (local_rank: 2)", "  exitcode  : 1 (pid: 48212)",
               "  error_file: <N/A>",
               "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
               "=" * 60)
    d = diagnose_files([write("job/train.log", *summary)], ruleset)
    assert d["outcome"] != "host_oom" and 0 not in d["culprit"]["ranks"]
    # the same SIGKILL as the root-cause entry is read as it always was
    root = [*summary[:3], "  <NO_OTHER_FAILURES>", *summary[10:16], *summary[7:10], "=" * 60]
    d = diagnose_files([write("job2/train.log", *root)], ruleset)
    assert d["outcome"] == "host_oom" and d["culprit"]["ranks"] == [2]


def test_a_ras_report_names_the_dead_process_node_through_the_bootstrap_addresses(write, ruleset, tmp_path):
    for n, node in enumerate(["trn-d01", "trn-d02", "trn-d03"]):
        write(f"{node}/train.log", f"{node}:4011:4011 [0] NCCL INFO Bootstrap : Using ib0:10.60.2.{40 + n}<0>",
              *[watchdog(r, "05:00:00", 48211) for r in range(8 * n, 8 * n + 8) if node != "trn-d02"])
    write("ncclras.txt", "Errors", "======", "", "DEAD",
          "  1 job process is considered dead (unreachable via the RAS network)",
          "  Process 218843 on node 10.60.2.41 managing GPUs 0,1,2,3,4,5,6,7")
    d = diagnose_files([tmp_path], ruleset)
    assert d["outcome"] == "nccl_timeout_hang"
    assert d["culprit"]["nodes"] == ["trn-d02"]
    assert "trn-d01" in d["affected"]["nodes"] and "trn-d03" in d["affected"]["nodes"]


def test_the_one_rank_in_another_collective_at_the_same_seqnum_is_out_of_step(write, ruleset):
    wd = ("[rank{r}]:[E ProcessGroupNCCL.cpp:563] [Rank {r}] Watchdog caught collective operation timeout: "
          "WorkNCCL(SeqNum=912, OpType={op}, NumelIn=4096, NumelOut=4096, Timeout(ms)=600000) ran for 600071 "
          "milliseconds before timing out.")
    # rank 0 printed nothing (cut out of the excerpt); rank 3 waits in a BROADCAST the others never called
    p = write("job/train.log", *(wd.format(r=r, op="BROADCAST" if r == 3 else "ALLREDUCE") for r in (1, 2, 3)))
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "nccl_timeout_hang" and not d["ambiguous"]
    assert d["culprit"]["ranks"] == [3] and d["confidence"] == "medium"
    assert "another collective at the same SeqNum" in d["confidence_reason"]
    assert sorted(d["affected"]["ranks"]) == [1, 2]
    # one against one says nothing about which side took the other path
    q = write("job2/train.log", *(wd.format(r=r, op="BROADCAST" if r == 3 else "ALLREDUCE") for r in (2, 3)))
    assert 3 not in diagnose_files([q], ruleset)["culprit"]["ranks"]
    # SeqNums count per process group: a sub-group's work at the same number is no mismatch
    sub = ("[rank{r}]:[E ProcessGroupNCCL.cpp:616] [PG ID 2 PG GUID 5(tp) Rank {pr}] Watchdog caught collective "
           "operation timeout: WorkNCCL(SeqNum=912, OpType=ALLGATHER, NumelIn=1, NumelOut=8, Timeout(ms)=600000) "
           "ran for 600031 milliseconds before timing out.")
    lines = [wd.format(r=r, op="ALLREDUCE") for r in (0, 1, 2)] + [sub.format(r=3, pr=1)]
    assert diagnose_files([write("job3/train.log", *lines)], ruleset)["culprit"]["ranks"] == []


def test_the_one_rank_past_the_collective_the_others_wait_in_is_out_of_step(write, ruleset):
    wd = ("[rank{r}]:[E0307 10:00:00.1 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation "
          "timeout: WorkNCCL(SeqNum={s}, OpType={op}, NumelIn=64, NumelOut=64, Timeout(ms)=600000) ran for "
          "600042 milliseconds before timing out.")
    # ranks 1 and 2 wait in BROADCAST 700; rank 0 is already in an _ALLGATHER_BASE at 702: it left them,
    # they are not behind it (the two in step are not the laggards)
    lines = [wd.format(r=0, s=702, op="_ALLGATHER_BASE")] + [wd.format(r=r, s=700, op="BROADCAST") for r in (1, 2)]
    d = diagnose_files([write("job/train.log", *lines)], ruleset)
    assert d["outcome"] == "nccl_timeout_hang" and not d["ambiguous"]
    assert d["culprit"]["ranks"] == [0] and d["confidence"] == "medium"
    assert "past the collective the others wait in" in d["confidence_reason"]
    assert sorted(d["affected"]["ranks"]) == [1, 2]
    # the same op further on is no other code path: two behind one names nobody
    same = [wd.format(r=0, s=702, op="BROADCAST")] + [wd.format(r=r, s=700, op="BROADCAST") for r in (1, 2)]
    assert diagnose_files([write("job2/train.log", *same)], ruleset)["culprit"]["ranks"] == []
    # one against one says nothing about which side left: the one behind is still named (the laggard)
    pair = [wd.format(r=0, s=702, op="_ALLGATHER_BASE"), wd.format(r=1, s=700, op="BROADCAST")]
    assert diagnose_files([write("job3/train.log", *pair)], ruleset)["culprit"]["ranks"] == [1]


def test_the_rank_that_never_enqueued_the_collective_the_others_wait_in_is_behind(write, ruleset):
    pr = ("[rank{r}]:[E1003 18:37:01.833621509 ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank {r}] Timeout at "
          "NCCL work: 6463, last enqueued NCCL work: {e}, last completed NCCL work: 6462.")
    dump = ("[rank{r}]:[E1003 18:37:02.1 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID 0(default_pg) Rank {r}] Received a "
            "dump signal due to a collective timeout from  rank 0 and we will try our best to dump the debug info. "
            "Last enqueued NCCL work: 6462, last completed NCCL work: 6462.")
    lines = [pr.format(r=r, e=6463) for r in (0, 1, 2)] + [dump.format(r=3)]
    d = diagnose_files([write("job/train.log", *lines)], ruleset)
    assert d["outcome"] == "nccl_timeout_hang" and d["culprit"]["ranks"] == [3]
    assert "last enqueued" in d["confidence_reason"]
    # everyone enqueued and completed alike: nobody is behind
    even = [pr.format(r=r, e=6463) for r in (0, 1, 2, 3)]
    assert diagnose_files([write("job2/train.log", *even)], ruleset)["culprit"]["ranks"] == []


def test_a_peer_address_is_the_ec2_node_whose_default_host_name_spells_it(write, ruleset, tmp_path):
    write("ip-10-1-33-7/train.log", "ip-10-1-33-7:1200:1200 [0] NCCL INFO cudaDriverVersion 12040")
    write("ip-10-1-40-9/train.log",
          "ip-10-1-40-9:2210:2290 [3] misc/socket.cc:538 NCCL WARN Net : Call to recv from 10.1.33.7<41907> failed : "
          "Connection reset by peer")
    d = diagnose_files([tmp_path], ruleset)
    assert d["culprit"]["nodes"] == ["ip-10-1-33-7"] and "implicated peer could not" not in d["confidence_reason"]


def test_kubectl_describe_node_name_row_places_conditions_when_the_labels_were_cut(write, ruleset):
    lines = [DESCRIBE_NODE[0], DESCRIBE_NODE[1], *DESCRIBE_NODE[6:]]  # `Name:`, `Roles:`, then Conditions
    d = diagnose_files([write("describe.txt", *lines)], ruleset)
    assert d["outcome"] == "node_failure" and d["culprit"]["nodes"] == ["gpu-pool-b-91xz"]
    # a pod's `Name:` over lines that are no node condition places nothing
    pod = ["Name:         trainer-worker-0", "Namespace:    ml",
           "  Warning  Evicted  2m  kubelet  The node was low on resource: memory. Threshold quantity: 100Mi, "
           "available: 51200Ki. Container pytorch was using 30Gi, request is 8Gi."]
    assert "trainer-worker-0" not in diagnose_files([write("pod.txt", *pod)], ruleset)["culprit"]["nodes"]


RAY_ACTOR_NODE_DIED = (
    "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
    "\tclass_name: RayTrainWorker",
    "\tactor_id: 9f1c2d3e4b5a69788796a5b401000000",
    "\tpid: 48122",
    "\tnamespace: 3e1f0a2b-7c4d-4e5f-8a9b-0c1d2e3f4a5b",
    "\tip: 10.31.4.77",
    "The actor died because its node has died. Node Id: 5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f",
)


def test_ray_actor_death_names_the_dead_node_by_the_ip_its_context_gives_not_by_its_id(write, ruleset):
    d = diagnose_files([write("driver.log", *RAY_ACTOR_NODE_DIED)], ruleset)
    assert d["outcome"] == "node_failure" and d["culprit"]["nodes"] == ["10.31.4.77"]
    # without the `ip:` row the node id is all there is
    lines = [ln for ln in RAY_ACTOR_NODE_DIED if "ip:" not in ln]
    d = diagnose_files([write("driver2.log", *lines)], ruleset)
    assert d["culprit"]["nodes"] == ["5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f"]


def test_ray_actor_whose_worker_process_died_names_the_node_its_ip_row_gives(write, ruleset):
    lines = [*RAY_ACTOR_NODE_DIED[:-1],
             "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
             "detail: Worker unexpectedly exits with a connection error code 2. End of file."]
    d = diagnose_files([write("driver.log", *lines)], ruleset)
    assert d["outcome"] == "unknown" and d["culprit"]["nodes"] == ["10.31.4.77"]
    assert d["recommended_action"]["action"] not in ("drain_node", "reset_gpu", "restart_excluding")
    # without the `ip:` row nothing says where the worker was
    d = diagnose_files([write("driver2.log", *[ln for ln in lines if "ip:" not in ln])], ruleset)
    assert d["outcome"] == "unknown" and d["culprit"]["nodes"] == []


def test_a_pod_that_found_no_free_gpu_is_a_setup_problem_until_the_same_file_shows_it_trained(write, ruleset):
    pending = "  Warning  FailedScheduling  3m  default-scheduler  0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    d = diagnose_files([write("pending/describe.txt", "Status:       Pending", pending)], ruleset)
    assert d["outcome"] == "config_error" and d["culprit"]["nodes"] == []
    # it waited, then ran: the wait was no failure
    d = diagnose_files([write("ran/pod.log", pending, "[rank0]: step 1200 | loss: 2.113 | lr 3e-4")], ruleset)
    assert d["outcome"] == "healthy"


MPIRUN_FIRST_FAILED = (
    "--------------------------------------------------------------------------",
    "mpirun detected that one or more processes exited with non-zero status, thus causing",
    "the job to be terminated. The first process to do so was:",
    "",
    "  Process name: [[61204,1],2]",
    "  Exit code:    1",
    "--------------------------------------------------------------------------",
)


def test_mpiruns_first_failed_process_names_the_rank_when_the_cause_names_nobody(write, ruleset):
    lines = ["Traceback (most recent call last):", '  File "train.py", line 12, in <module>',
             "KeyError: 'labels'", *MPIRUN_FIRST_FAILED]
    d = diagnose_files([write("mpirun.log", *lines)], ruleset)
    assert d["outcome"] == "user_code_error" and d["culprit"]["ranks"] == [2]
    assert "first process to fail" in d["confidence_reason"] and d["confidence"] != "high"
    # a cause that names its rank keeps it
    tagged = ["[1,5]<stderr>:Traceback (most recent call last):", '[1,5]<stderr>:  File "train.py", line 12',
              "[1,5]<stderr>:KeyError: 'labels'", *MPIRUN_FIRST_FAILED]
    assert diagnose_files([write("mpirun2.log", *tagged)], ruleset)["culprit"]["ranks"] == [5]


def _torchrun_summary(root_rank, root_exit, other=(5, -15)):
    """A ChildFailedError summary as torchrun >= 1.11 prints it: `Failures:` first, then `Root Cause`."""
    entry = lambda i, rank, code: [f"[{i}]:", "  time      : 2025-03-02_10:41:07", "  host      : trn-a-12",  # noqa: E731
                                   f"  rank      : {rank} (local_rank: {rank})", f"  exitcode  : {code} (pid: {4100 + rank})",
                                   "  error_file: <N/A>"]
    return ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", "=" * 40, "train.py FAILED",
            "-" * 40, "Failures:", *entry(1, *other), "-" * 40, "Root Cause (first observed failure):",
            *entry(0, root_rank, root_exit), "=" * 40]


def test_torchruns_first_failure_names_the_worker_when_the_cause_names_nobody(write, ruleset):
    cause = ["Traceback (most recent call last):", '  File "train.py", line 40, in <module>',
             "KeyError: 'input_ids'"]
    agent = "E0302 10:41:07.512000 4099 torch/distributed/elastic/multiprocessing/api.py:869] "
    # the agent's own line: the earliest failure of its node, known by local rank only
    d = diagnose_files([write("a/train.log", *cause, agent + "failed (exitcode: 1) local_rank: 3 (pid: 4103) "
                              "of binary: /usr/bin/python3")], ruleset)
    assert d["outcome"] == "user_code_error" and d["culprit"] == {**NOBODY, "local_ranks": [3]}
    assert "first process to fail" in d["confidence_reason"] and d["confidence"] != "high"
    # the summary's Root Cause entry names the global rank; the entry under Failures is not it
    d = diagnose_files([write("b/train.log", *cause, *_torchrun_summary(2, 1, other=(6, 1)))], ruleset)
    assert d["culprit"] == {**NOBODY, "ranks": [2]}
    # a pasted excerpt cut after the root cause's rank row still names it (the job's cause unknown)
    cut = _torchrun_summary(1, 1)[:-3]
    assert cut[-1] == "  rank      : 1 (local_rank: 1)"
    d = diagnose_files([write("c/train.log", *cut)], ruleset)
    assert d["culprit"]["ranks"] == [1]
    # torch 1.9/1.10 put `Root Cause:` first, `Other Failures:` after, fields unpadded
    old = ["Root Cause:", "[0]:", "  time: 2021-08-11_07:13:52", "  rank: 4 (local_rank: 0)", "  exitcode: 1 (pid: 911)",
           "Other Failures:", "[1]:", "  rank: 5 (local_rank: 1)", "  exitcode: 1 (pid: 912)"]
    assert diagnose_files([write("d/train.log", *cause, *old)], ruleset)["culprit"]["ranks"] == [4]


def test_torchruns_first_failure_adds_the_rank_to_a_cause_that_names_only_its_gpu(write, ruleset):
    """A CUDA OOM printed without a rank tag names the GPU index it ran on; torchrun's Root Cause names
    the rank. Both are the same process: the rank is added, the GPU kept, the confidence the OOM's own."""
    oom = ["Traceback (most recent call last):", '  File "train.py", line 51, in forward',
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 96.00 MiB. GPU 2 has a total capacity of "
           "79.15 GiB of which 12.50 MiB is free. Process 7712 has 79.13 GiB memory in use."]
    d = diagnose_files([write("oom/train.log", *oom, *_torchrun_summary(2, 1))], ruleset)
    assert d["outcome"] == "cuda_oom" and d["culprit"] == {**NOBODY, "ranks": [2], "gpus": [2]}
    assert d["confidence"] == "high"
    # without the launcher's report: the GPU alone, as before
    d = diagnose_files([write("oom2/train.log", *oom)], ruleset)
    assert d["culprit"] == {**NOBODY, "gpus": [2]}
    # an agent line that knows only a local rank adds nothing (the GPU index already says as much)
    agent = ("E0302 10:41:07.512000 4099 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
             "local_rank: 3 (pid: 4103) of binary: /usr/bin/python3")
    d = diagnose_files([write("oom3/train.log", *oom, agent)], ruleset)
    assert d["culprit"] == {**NOBODY, "gpus": [2]}


def test_paddles_aborted_trainer_names_the_rank_and_is_no_health(write, ruleset):
    launch = ["INFO 2021-05-24 17:17:14,611 launch_utils.py:307] terminate all the procs",
              "ERROR 2021-05-24 17:17:14,611 launch_utils.py:545] ABORT!!! Out of all 4 trainers, the trainer "
              "process with rank=[{}] was aborted. Please check its log."]
    # the console alone (the trainer's error is in its workerlog): a failure, cause unknown, by rank
    d = diagnose_files([write("p1/console.log", launch[0], launch[1].format(3))], ruleset)
    assert d["outcome"] == "unknown" and d["culprit"] == {**NOBODY, "ranks": [3]}
    # with the cause in the same log, the cause decides and the launcher names its rank
    cause = ["Traceback (most recent call last):", "KeyError: 'image'"]
    d = diagnose_files([write("p2/console.log", *cause, launch[0], launch[1].format(1))], ruleset)
    assert d["outcome"] == "user_code_error" and d["culprit"]["ranks"] == [1]
    # two trainers at one poll name nobody
    d = diagnose_files([write("p3/console.log", *cause, launch[0], launch[1].format("1, 2"))], ruleset)
    assert d["outcome"] == "user_code_error" and d["culprit"] == NOBODY


def test_composers_crashed_rank_names_the_rank_and_is_no_health(write, ruleset):
    line = "ERROR:composer.cli.launcher:Rank {} crashed with exit code {}."
    # the launcher's console alone: a failure, cause unknown, by rank
    d = diagnose_files([write("c1/console.log", "Building trainer...", line.format(2, -6))], ruleset)
    assert d["outcome"] == "unknown" and d["culprit"] == {**NOBODY, "ranks": [2]}
    # with the cause in the log, the cause decides and the launcher names its rank
    cause = ["Traceback (most recent call last):", "KeyError: 'image'"]
    d = diagnose_files([write("c2/console.log", *cause, line.format(1, 1))], ruleset)
    assert d["outcome"] == "user_code_error" and d["culprit"]["ranks"] == [1]
    # a rank stopped by SIGTERM is not read
    d = diagnose_files([write("c3/console.log", *cause, line.format(1, -15))], ruleset)
    assert d["culprit"] == NOBODY


def test_mp_spawns_first_dead_process_names_its_local_rank(write, ruleset):
    spawn = ["Traceback (most recent call last):", "torch.multiprocessing.spawn.ProcessRaisedException: ", "",
             "-- Process 1 terminated with the following error:", "Traceback (most recent call last):",
             '  File "train.py", line 88, in main', "KeyError: 'pixel_values'"]
    d = diagnose_files([write("spawn/train.log", *spawn)], ruleset)
    assert d["outcome"] == "user_code_error" and d["culprit"] == {**NOBODY, "local_ranks": [1]}


def test_torchruns_first_failure_is_no_culprit_when_it_is_a_victim(write, ruleset):
    cause = ["Traceback (most recent call last):", "KeyError: 'input_ids'"]
    agent = "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: {}) local_rank: {} (pid: 77{}) of binary: x"
    # SIGTERM / SIGABRT exits are teardown victims: they name nobody
    for code in (-15, -6):
        d = diagnose_files([write(f"s{code}/train.log", *cause, agent.format(code, 2, 1))], ruleset)
        assert d["culprit"] == NOBODY, code
    # two nodes' agents each report their own first failure: which one was first is not said
    two = [f"gpu-a-{n}: " + agent.format(1, lr, n) for n, lr in ((1, 0), (2, 3))]
    assert diagnose_files([write("two/train.log", *cause, *two)], ruleset)["culprit"] == NOBODY
    # in a hang the first worker to exit is the first to time out: a victim
    hang = [watchdog(r, "03:00:00") for r in range(4)] + [agent.format(1, 0, 9)]
    d = diagnose_files([write("hang/train.log", *hang)], ruleset)
    assert d["outcome"] == "nccl_timeout_hang" and d["culprit"]["local_ranks"] == []


def test_a_hardware_fault_naming_a_gpu_index_names_it_only_where_no_host_is_in_sight(write, ruleset):
    diag = "Error: Found 7 faulty memory elements on GPU 2"
    # one machine's pasted diag output: no host anywhere, so the GPU index is that machine's
    d = diagnose_files([write("a/dcgmi.txt", "Diagnostic | Result", diag)], ruleset)
    assert d["outcome"] == "gpu_hardware" and d["culprit"] == {**NOBODY, "gpus": [2]}
    # lines from two hosts: GPU 2 of which node is not said, so nobody
    d = diagnose_files([write("b/run.log", "gpu-a-1:311:311 [0] NCCL INFO Bootstrap : Using eth0:10.4.0.11<0>",
                              "gpu-a-2:417:417 [0] NCCL INFO Bootstrap : Using eth0:10.4.0.12<0>", diag)], ruleset)
    assert d["outcome"] == "gpu_hardware" and d["culprit"]["gpus"] == [] and d["culprit"]["nodes"] == []
    # one host named: the GPU on that host, as before
    d = diagnose_files([write("c/run.log", "gpu-a-1:311:311 [0] NCCL INFO Bootstrap : Using eth0:10.4.0.11<0>",
                              diag)], ruleset)
    assert d["culprit"]["nodes"] == ["gpu-a-1"]


def test_hydras_bad_termination_banner_names_the_process_its_signal_row_speaks_of(write, ruleset):
    bar = "=" * 83
    banner = [bar, "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES", "=   RANK 5 PID 40213 RUNNING AT hpc-n07",
              "=   KILLED BY SIGNAL: 11 (Segmentation fault)", bar]
    d = diagnose_files([write("a/run.out", *banner)], ruleset)
    assert d["outcome"] == "segfault_native"
    assert d["culprit"]["nodes"] == ["hpc-n07"] and d["culprit"]["ranks"] == [5]
    # the signal row cut from its banner names nobody
    d = diagnose_files([write("b/run.out", bar, "=   KILLED BY SIGNAL: 11 (Segmentation fault)", bar)], ruleset)
    assert d["outcome"] == "segfault_native" and d["culprit"] == NOBODY


def test_a_peer_health_retry_the_run_survived_is_set_aside_but_alone_names_the_task(write, ruleset):
    retry = "WARNING:tensorflow:/job:worker/replica:0/task:5 seems down, retrying 1/3"
    d = diagnose_files([write("ok/worker.log", retry, "Epoch 1/10 step 200 - loss: 0.4312")], ruleset)
    assert d["outcome"] == "healthy" and d["culprit"]["ranks"] == []
    d = diagnose_files([write("bad/worker.log", retry)], ruleset)
    assert d["outcome"] == "network_socket_rendezvous" and d["culprit"]["ranks"] == [5]


def test_a_missing_data_file_before_training_is_a_wrong_path_after_it_storage(write, ruleset):
    # The rule's `at_startup`: the same FileNotFoundError on a data file means a path that was never
    # there when no file of the job shows a training step, and data that went away when one does.
    missing = "[rank2]: FileNotFoundError: [Errno 2] No such file or directory: '/data/shards/train-00017.parquet'"
    d = diagnose_files([write("a/train.log", "[rank2]: Traceback (most recent call last):", missing)], ruleset)
    assert d["outcome"] == "config_error" and "before training started" in d["root_cause"]
    assert d["recommended_action"]["action"] == "fix_and_resubmit"
    trained = ["[rank0]: step 1200 | loss: 2.113 | lr 3e-4", "[rank2]: Traceback (most recent call last):", missing]
    d = diagnose_files([write("b/train.log", *trained)], ruleset)
    assert d["outcome"] == "storage_io" and "mid-run" in d["root_cause"]
    # progress printed by another file of the job counts too
    d = diagnose_files([write("c/rank0.log", "[rank0]: step 1200 | loss: 2.113"),
                        write("c/rank2.log", missing)], ruleset)
    assert d["outcome"] == "storage_io"


def test_store_noise_after_clean_exits_is_a_completed_run_a_failed_exit_is_not(write, ruleset):
    # Workers that finished tear the c10d store down with them; peers still shutting down print
    # connection resets. With the launcher saying every worker exited cleanly, that is a completed run.
    noise = ["gpu-b08: [rank9]:[W1102 08:14:52.118 TCPStore.cpp:106] [c10d] sendBytes failed on "
             "SocketImpl(fd=88, addr=[::]:41133, remote=[gpu-b07]:29500): Connection reset by peer",
             "gpu-b08: Exception raised from recvBytes at /pytorch/torch/csrc/distributed/c10d/Utils.hpp:679 "
             "(most recent call first):"]
    clean = [f"gpu-b0{n}: [2025-11-02 08:14:51,30{n}] [INFO] [launch.py:367:main] Process 77120{n} exits successfully."
             for n in (7, 8)]
    d = diagnose_files([write("a/log.txt", *clean, *noise)], ruleset)
    assert d["outcome"] == "healthy" and d["culprit"] == NOBODY
    failed = [clean[0], "gpu-b08: [2025-11-02 08:14:51,400] [INFO] [launch.py:335:sigkill_handler] Killing subprocess 771208",
              "gpu-b08: [2025-11-02 08:14:51,401] [ERROR] [launch.py:341:sigkill_handler] ['/usr/bin/python3', '-u', "
              "'train.py', '--local_rank=1'] exits with return code = 1", *noise]
    assert diagnose_files([write("b/log.txt", *failed)], ruleset)["outcome"] != "healthy"


def test_a_time_limit_after_a_fault_is_how_the_job_ended_not_why(write, ruleset):
    ib = ("gpu-a-51:73076:73185 [4] transport/net_ib.cc:1238 NCCL WARN NET/IB : Got completion from peer "
          "10.3.0.48<37948> with error 12, opcode 2, len 1, vendor err 129")
    limit = "slurmstepd: error: *** JOB 416593 ON gpu-a-50 CANCELLED AT 2025-01-27T14:51:17 DUE TO TIME LIMIT ***"
    # the fabric error came first and the job sat until its wall time: the error is the cause
    d = diagnose_files([write("a/slurm-416593.out", "[rank0]: step 100 loss: 2.31", ib, limit)], ruleset)
    assert d["outcome"] == "network_ib"
    # the same error printed after the limit's SIGTERM is teardown noise of the kill
    d = diagnose_files([write("b/slurm-416593.out", "[rank0]: step 100 loss: 2.31", limit, ib)], ruleset)
    assert d["outcome"] == "scheduler_timelimit"
    # in another file with no times nothing orders them: the limit stands
    d = diagnose_files([write("c/slurm-416593.out", limit), write("c/rank4.log", ib)], ruleset)
    assert d["outcome"] == "scheduler_timelimit"


def test_torchrun_names_the_worker_that_exited_on_its_own_not_those_it_stopped(write, ruleset):
    lines = ["W0801 13:23:17.366000 32974 torch/distributed/elastic/multiprocessing/api.py:900] Sending process "
             f"3305{n} closing signal SIGTERM" for n in (1, 2, 3)]
    lines.append("E0801 13:23:20.000000 32974 torch/distributed/elastic/multiprocessing/api.py:874] failed "
                 "(exitcode: 1) local_rank: 3 (pid: 33054) of binary: /opt/conda/bin/python3.10")
    d = diagnose_files([write("train.log", *lines)], ruleset)
    assert d["outcome"] == "unknown" and d["culprit"] == {**NOBODY, "local_ranks": [3]}
    assert d["recommended_action"]["action"] == "human_review"

def test_a_stall_report_listing_the_ready_ranks_names_the_rank_left_out(write, ruleset):
    # Horovod before 0.13.6 listed who HAD submitted the tensor; the rank missing from the list is the suspect.
    stall = ("Stalled ops: HorovodAllreduce_grads_3 [ready ranks: 0, 1, 3, 4, 5], "
             "HorovodAllreduce_grads_4 [ready ranks: 0, 1, 3, 4, 5]")
    seen = [f"[1,{r}]<stderr>:INFO:tensorflow:Done running local_init_op." for r in (0, 1, 2, 3, 4, 5)]
    d = diagnose_files([write("hvd.log", *seen, stall)], ruleset)
    # rank 2 logged (it is up) but never reached the collective: it is the one the others wait on
    assert d["outcome"] == "nccl_timeout_hang" and not d["ambiguous"]
    assert d["culprit"]["ranks"] == [2]
    # a rank that printed nothing at all may be on a lost node: named as a candidate, not chosen
    d = diagnose_files([write("hvd2.log", *seen[:2], *seen[3:], stall)], ruleset)
    assert d["outcome"] == "nccl_timeout_hang" and d["ambiguous"] and d["culprit"]["ranks"] == []
    assert any(c["culprit"]["ranks"] == [2] for c in d["candidates"])
    # everyone ready in the list names no one
    d = diagnose_files([write("hvd3.log", *seen, stall.replace("0, 1, 3", "0, 1, 2, 3"))], ruleset)
    assert d["culprit"]["ranks"] == []


def test_work_numbers_of_different_process_groups_are_not_compared(write, ruleset):
    # SeqNums count per process group: rank 3's timeout in its small tensor-parallel group (work 40) is not
    # "behind" the default group's work 1580 the others timed out at.
    wd = ("[rank{r}]:[E1206 18:44:13.275158817 ProcessGroupNCCL.cpp:607] [PG ID {pg} PG GUID {pg}({name}) Rank {g}] "
          "Watchdog caught collective operation timeout: WorkNCCL(SeqNum={s}, OpType=ALLREDUCE, NumelIn=1, "
          "NumelOut=1, Timeout(ms)=600000) ran for 600060 milliseconds before timing out.")
    lines = [wd.format(r=r, pg=0, name="default_pg", g=r, s=1580) for r in (0, 1, 2)]
    lines.append(wd.format(r=3, pg=2, name="tp", g=1, s=40))
    d = diagnose_files([write("train.log", *lines)], ruleset)
    assert d["outcome"] == "nccl_timeout_hang" and d["culprit"]["ranks"] == []
    # within one group the one behind is still named
    lines.append(wd.format(r=2, pg=2, name="tp", g=0, s=41))
    d = diagnose_files([write("train2.log", *lines)], ruleset)
    assert d["culprit"]["ranks"] == [3]


def test_an_exception_inside_a_signal_handler_is_how_the_job_ended_not_why(write, ruleset):
    # Ctrl-C: the launcher's own handler then failed (a NameError in sigkill_handler). The interrupt decides.
    stop = ["KeyboardInterrupt",
            "Traceback (most recent call last):",
            '  File "/opt/conda/lib/python3.9/site-packages/deepspeed/launcher/runner.py", line 511, in sigkill_handler',
            "    kill_cmd.append(str(pid))",
            "NameError: free variable 'kill_cmd' referenced before assignment in enclosing scope"]
    d = diagnose_files([write("ds.log", *stop)], ruleset)
    assert d["outcome"] == "scheduler_preemption_cancel" and d["culprit"] == NOBODY
    # the same exception raised by the training code (no handler frame) is the user's bug
    bug = [stop[1], '  File "/work/train.py", line 88, in step', "    kill_cmd.append(str(pid))", stop[4]]
    assert diagnose_files([write("train.log", *bug)], ruleset)["outcome"] == "user_code_error"


def test_the_one_node_whose_srun_tasks_exited_on_their_own_is_where_an_unplaced_cause_failed(write, ruleset):
    lines = ["Traceback (most recent call last):",
             '  File "/opt/env/lib/python3.10/site-packages/torch/__init__.py", line 237, in <module>',
             "ImportError: /opt/env/lib/python3.10/site-packages/torch/lib/libtorch_cuda.so: undefined symbol: ncclDevCommDestroy",
             "srun: error: i51: task 0: Exited with exit code 1",
             "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
             "srun: error: i60: task 1: Terminated"]
    d = diagnose_files([write("job/slurm.out", *lines)], ruleset)
    assert d["outcome"] == "config_error" and d["culprit"]["nodes"] == ["i51"]
    assert d["confidence"] != "high"        # where it failed first, from the launcher, not from the line
    # two nodes' tasks exiting on their own: no one place
    both = lines[:4] + ["srun: error: i60: task 1: Exited with exit code 1"]
    d = diagnose_files([write("job2/slurm.out", *both)], ruleset)
    assert d["outcome"] == "config_error" and d["culprit"] == NOBODY


def test_no_free_swap_is_an_oom_report_but_not_after_a_page_allocation_failure(write, ruleset):
    # The `Free swap  = 0kB` row of the kernel's memory report alone: the node ran out of memory. The same
    # report under warn_alloc's `page allocation failure` header is one failed (often high-order) allocation.
    p = write("messages", "Mar 10 01:33:03 cpu-3-7 kernel: Free swap  = 0kB")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "host_oom" and d["culprit"] == {**NOBODY, "nodes": ["cpu-3-7"]}
    q = write("messages-2",
              "Mar 10 01:33:02 cpu-3-7 kernel: kworker/0:1: page allocation failure: order:4, mode:0x40cc0(GFP_KERNEL), nodemask=(null)",
              "Mar 10 01:33:03 cpu-3-7 kernel: Free swap  = 0kB")
    assert diagnose_files([q], ruleset)["outcome"] != "host_oom"


def test_mpich_exit_code_is_the_wait_status_of_the_rank_on_the_banner_node(write, ruleset):
    banner = ["=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES", "=   PID 4242 RUNNING AT hpc-n07"]
    p = write("mpi.out", *banner, "=   EXIT CODE: 9", "=   CLEANING UP REMAINING PROCESSES")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "host_oom" and d["culprit"]["nodes"] == ["hpc-n07"]
    q = write("mpi-2.out", *banner, "=   EXIT CODE: 139", "=   CLEANING UP REMAINING PROCESSES")
    assert diagnose_files([q], ruleset)["outcome"] == "segfault_native"
    r = write("mpi-3.out", *banner, "=   EXIT CODE: 1", "=   CLEANING UP REMAINING PROCESSES")
    assert diagnose_files([r], ruleset)["outcome"] == "unknown"


def test_a_lost_rendezvous_heartbeat_is_a_lost_node_unless_a_root_says_more(write, ruleset):
    hb = ("WARNING:torch.distributed.elastic.rendezvous.dynamic_rendezvous:The node 'gpu-n12_1234_0' has failed to"
          " send a keep-alive heartbeat to the rendezvous 'job' due to an error of type RendezvousConnectionError.")
    p = write("agent.log", hb, hb)
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "node_failure" and d["culprit"] == NOBODY
    q = write("agent-2.log", "Mar 10 01:33:03 gpu-n11 kernel: Out of memory: Killed process 7815 (python) total-vm:45371652kB, anon-rss:31360488kB", hb)
    assert diagnose_files([q], ruleset)["outcome"] == "host_oom"
    r = write("agent-3.log", hb, "step 1201 | loss: 2.113 | lr 3e-4")  # the run went on: a blip it survived
    assert diagnose_files([r], ruleset)["outcome"] != "node_failure"
    slow = hb.replace("RendezvousConnectionError", "RendezvousTimeoutError")  # a slow store, not a lost one
    assert diagnose_files([write("agent-4.log", slow)], ruleset)["outcome"] != "node_failure"


def test_deepspeed_missing_zero_partitions_is_a_checkpoint_fault_unless_the_file_shows_training_after(write, ruleset):
    warn = ("[2022-09-13 10:01:22,412] [WARNING] [engine.py:2824:_get_all_zero_checkpoints] The following zero "
            "checkpoints paths are missing: ['/ckpt/global_step500/zero_pp_rank_8_mp_rank_00_optim_states.pt']")
    d = diagnose_files([write("resume/rank0.log", warn)], ruleset)
    assert d["outcome"] == "checkpoint" and d["culprit"]["nodes"] == [] and d["culprit"]["ranks"] == []
    # loaded weights only and trained on: DeepSpeed's fallback, no failure
    d = diagnose_files([write("finetune/rank0.log", warn, "[rank0]: step 10 | loss: 2.113 | lr 3e-4")], ruleset)
    assert d["outcome"] == "healthy"


def test_pals_report_blames_the_sigkilled_rank_not_the_ones_torn_down_with_sigterm(write, ruleset):
    d = diagnose_files([write("job/out.log",
                              "x1000c1s2b0n0-hsn0.hsn.cm.example.gov: rank 12 died from signal 9",
                              "x1000c1s0b0n0-hsn0.hsn.cm.example.gov: rank  1 died from signal 15")], ruleset)
    assert d["outcome"] == "unknown"
    assert d["culprit"]["ranks"] == [12]
    assert d["culprit"]["nodes"] == ["x1000c1s2b0n0-hsn0.hsn.cm.example.gov"]
    # only SIGTERM teardown lines: a failure, but nobody to blame
    d = diagnose_files([write("job2/out.log",
                              "x1000c1s0b0n0-hsn0.hsn.cm.example.gov: rank 1 died from signal 15",
                              "x1000c1s1b0n0-hsn0.hsn.cm.example.gov: rank 5 died from signal 15")], ruleset)
    assert d["outcome"] == "unknown" and d["culprit"]["ranks"] == [] and d["culprit"]["nodes"] == []


def test_a_store_connect_retry_followed_by_training_is_recovered(write, ruleset):
    # torchrun's start-up warning (IPv6 localhost tried first) is retried by c10d; steps after it say the
    # connection was made. Without progress after it, the same line stays a rendezvous problem.
    warn = ("[W socket.cpp:663] [c10d] The client socket has failed to connect to [localhost]:29500 "
            "(errno: 99 - Cannot assign requested address).")
    p = write("train.log", warn, "{'loss': 2.3145, 'grad_norm': 1.25, 'learning_rate': 2e-05, 'epoch': 0.1}",
              "{'loss': 1.9876, 'grad_norm': 1.01, 'learning_rate': 1.9e-05, 'epoch': 0.2}")
    assert diagnose_files([p], ruleset)["outcome"] == "healthy"
    q = write("train2.log", warn)
    assert diagnose_files([q], ruleset)["outcome"] == "network_socket_rendezvous"


def test_a_checkpoint_write_that_failed_is_storage_only_when_a_line_says_the_storage_failed(write, ruleset):
    save = "[rank0]: RuntimeError: [enforce fail at inline_container.cc:858] . PytorchStreamWriter failed writing file data/5: file write failed"
    d = diagnose_files([write("job/train.log", save)], ruleset)
    assert d["outcome"] == "checkpoint" and d["culprit"]["nodes"] == []
    full = "tee: /scratch/run7/logs/train.log: No space left on device"
    d = diagnose_files([write("job2/train.log", save, full)], ruleset)
    assert d["outcome"] == "storage_io" and not d["ambiguous"]


def test_fabric_manager_without_nvswitches_is_no_nvlink_fault(write, ruleset):
    start = ["Sep 18 03:19:01 gpu-a nvidia-fabricmanager-start.sh[4753]: Detected Pre-NVL5 system",
             "Sep 18 03:19:01 gpu-a nvidia-fabricmanager-start.sh[4756]: request to query NVSwitch device information "
             "from NVSwitch driver failed with error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]",
             'Sep 18 03:19:01 gpu-a nvidia-fabricmanager-start.sh[4753]: "/usr/bin/nv-fabricmanager -c '
             '/usr/share/nvidia/nvswitch/fabricmanager.cfg" failed! Exit code: 1',
             "Sep 18 03:19:01 gpu-a systemd[1]: nvidia-fabricmanager.service: Control process exited, code=exited, "
             "status=1/FAILURE"]
    # no NVSwitch to manage: the start's failure lines are explained, nobody is blamed
    d = diagnose_files([write("nofm/syslog.log", *start)], ruleset)
    assert d["outcome"] == "healthy" and d["culprit"] == NOBODY
    # the same failure without that answer is a fabric manager fault on the node
    d = diagnose_files([write("fm/syslog.log", start[0], *start[2:])], ruleset)
    assert d["outcome"] == "nvlink" and d["culprit"]["nodes"] == ["gpu-a"]


def test_an_ib_device_nccl_skips_at_init_is_no_fault_and_no_blame(write, ruleset):
    # ncclIbInit opens every verbs device the host lists before it reads NCCL_IB_HCA and skips those it
    # cannot open: a container given some of the NICs prints this on every rank of a run that trains well
    skipped = ["gpu-c04:311:402 [0] misc/ibvwrap.cc:212 NCCL WARN Call to ibv_open_device failed",
               "gpu-c04:311:402 [0] transport/net_ib.cc:148 NCCL WARN NET/IB : Unable to open device mlx5_6",
               "gpu-c04:311:402 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.12.0.4<0>"]
    d = diagnose_files([write("ok/train.log", *skipped)], ruleset)
    assert d["outcome"] == "healthy" and d["culprit"] == NOBODY
    # a network fault printed later decides on its own line, not on the skipped device
    fault = "gpu-c04:311:405 [0] NCCL WARN NET/IB : Got completion from peer 10.12.0.9<51532> with error 12, opcode 0, len 0, vendor err 129"
    d = diagnose_files([write("bad/train.log", *skipped, fault)], ruleset)
    assert d["outcome"] == "network_ib"
    assert all(e["rule_id"] != "nccl.ib_device_unusable" for e in d["evidence"] if e.get("role") != "context")
    assert d["culprit"]["nodes"] != ["gpu-c04"]


def test_an_hccl_collective_that_failed_on_a_victim_rank_is_no_user_code_error(write, ruleset):
    # torch_npu raises a failed HcclAllreduce as a RuntimeError; the CANN report under it says why (a peer
    # did not send in time). The rank that raised is a victim: not a user-code fault, and nobody is blamed.
    lines = ["[rank1]:     work = group.allreduce([tensor], opts)",
             "[rank1]: RuntimeError: InnerRunOpApi:torch_npu/csrc/framework/OpParamMaker.cpp:281 OPS function "
             "error: HcclAllreduce, error code is 6",
             "[rank1]: [ERROR] 2025-04-08-18:07:20 (PID:1292363, Device:1, RankID:1) ERR01100 OPS call acl api failed."]
    d = diagnose_files([write("npu/train.log", *lines)], ruleset)
    assert d["outcome"] == "nccl_timeout_hang" and d["culprit"] == NOBODY
    d = diagnose_files([write("npu2/train.log", *lines, "[rank1]: EI0006: [PID: 1292363] 2025-04-08-18:07:20.444.436 "
                              "Getting socket times out. Reason: Remote Rank did not send the data in time.")], ruleset)
    assert d["outcome"] == "network_socket_rendezvous" and d["culprit"] == NOBODY


def test_old_mp_spawn_wrapper_defers_to_the_childs_exception(write, ruleset):
    # torch < 1.8 wrapped the child's traceback in a plain Exception whose message starts with a newline
    p = write("spawn/train.log", "Traceback (most recent call last):",
              '  File "/opt/conda/lib/python3.7/site-packages/torch/multiprocessing/spawn.py", line 118, in join',
              "    raise Exception(msg)", "Exception: ", "",
              "-- Process 1 terminated with the following error:", "Traceback (most recent call last):",
              '  File "/opt/conda/lib/python3.7/site-packages/torch/multiprocessing/spawn.py", line 19, in _wrap',
              "    fn(i, *args)",
              "FileNotFoundError: [Errno 2] No such file or directory: '/data/coco/annotations/instances_train2017.json'")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "config_error"  # the missing annotation file, not the wrapper
    assert any(e["rule_id"] == "pytorch.mp_spawn_raised_bare" and e["role"] == "teardown" for e in d["evidence"])
    assert not any(e["rule_id"] == "python.exception" for e in d["evidence"])


def test_mpi_that_could_not_initialise_is_a_launch_configuration_fault_naming_nobody(write, ruleset):
    p = write("mpi/out.log", "*** An error occurred in MPI_Init_thread", "*** on a NULL communicator",
              "*** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,",
              "***    and potentially your MPI job)",
              "[gpu-a-07:41233] Local abort before MPI_INIT completed completed successfully, but am not able to "
              "aggregate error messages, and not able to guarantee that all other processes were killed!")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "config_error" and d["culprit"]["nodes"] == []


def test_pmix_lock_noise_and_benign_xla_notices_are_not_failure_markers(write, ruleset):
    p = write("ok/run.log", "[gpu-c-03:77120] PMIX ERROR: ERROR in file gds_ds12_lock_pthread.c at line 168",
              "E0000 00:00:1725383433.302361    2049 gpu_timer.cc:114] Delay kernel timed out: measured time has "
              "sub-optimal accuracy. There may be a missing warmup execution, please investigate in Nsight Systems.",
              "step 100 loss 2.31")
    assert diagnose_files([p], ruleset)["outcome"] == "healthy"
    # an unbracketed glog/absl error line is a failure marker, not evidence of health
    q = write("bad/run.log", "E0120 08:28:09.425599  2049 pjrt_stream_executor_client.cc:2985] Execution of "
              "replica 0 failed: INTERNAL: Failed to execute XLA Runtime executable")
    assert diagnose_files([q], ruleset)["outcome"] == "unknown"


def test_a_slurm_error_line_is_a_failure_marker_but_the_chdir_fallback_is_not(write, ruleset):
    d = diagnose_files([write("a/slurm-1.out", "slurmstepd: error: Unable to create TMPDIR [/local/1234]: "
                              "Permission denied", "step 1 loss 2.3")], ruleset)
    assert d["outcome"] == "unknown" and d["culprit"] == NOBODY
    d = diagnose_files([write("b/slurm-2.out", "slurmstepd: error: couldn't chdir to `/workspace': No such file or "
                              "directory: going to /tmp instead", "step 1 loss 2.3", "step 2 loss 2.1")], ruleset)
    assert d["outcome"] == "healthy"
    d = diagnose_files([write("c/slurm-3.out", "srun: error: Task launch for 812.0 failed on node cn207: Job "
                              "credential expired")], ruleset)
    assert d["outcome"] == "node_failure" and d["culprit"]["nodes"] == ["cn207"]


def test_the_nccl_warning_xla_repeats_in_its_status_decides_like_the_warning_itself(write, ruleset):
    line = ("jaxlib.xla_extension.XlaRuntimeError: INTERNAL: external/xla/xla/service/gpu/nccl_utils.cc:297: NCCL "
            "operation ncclCommInitRank(&comm, nranks, id, rank) failed: internal error - please report this issue to "
            "the NCCL developers. Last NCCL warning(error) log entry (may be unrelated) 'Attribute busid of node nic "
            "not found'.")
    d = diagnose_files([write("jax/run.log", line)], ruleset)
    assert d["outcome"] == "config_error" and d["culprit"] == NOBODY


def test_a_collective_mismatch_report_blames_the_rank_that_left_the_common_path(write, ruleset):
    fp = "CollectiveFingerPrint(SequenceNumber={}, OpType={})"
    line = ("[rank{p}]: RuntimeError: Detected mismatch between collectives on ranks. Rank {p} is running collective: "
            "{a}, but Rank {o} is running collective: {b}.")
    # ranks 0 and 2..6 ran rank 1's collective (the check compares in rank order): rank 7 diverged
    d = diagnose_files([write("mm/train.log", line.format(p=1, o=7, a=fp.format(101, "ALLGATHER"),
                                                           b=fp.format(0, "REDUCE")))], ruleset)
    assert d["outcome"] == "user_code_error" and d["culprit"]["ranks"] == [7]
    # against rank 0 nothing says which of the two diverged: the printer stays the only one named
    d = diagnose_files([write("mm2/train.log", line.format(p=7, o=0, a=fp.format(0, "REDUCE"),
                                                            b=fp.format(101, "ALLGATHER")))], ruleset)
    assert d["outcome"] == "user_code_error" and 0 not in d["culprit"]["ranks"]


def test_a_config_error_that_training_went_on_after_does_not_hide_the_time_limit(write, ruleset):
    miss = "/var/spool/slurmd/job3108079/slurm_script: line 12: python: command not found"
    limit = "slurmstepd: error: *** JOB 3108079 ON nid006844 CANCELLED AT 2026-08-18T03:25:55 DUE TO TIME LIMIT ***"
    steps = [" iteration       10/ 5000 | lm loss: 4.243E+00 |", " iteration       20/ 5000 | lm loss: 4.101E+00 |"]
    d = diagnose_files([write("a/slurm.out", miss, *steps, limit)], ruleset)
    assert d["outcome"] == "scheduler_timelimit"
    # with no step after it, the error is what stopped the job and the limit only how it ended
    d = diagnose_files([write("b/slurm.out", *steps, miss, limit)], ruleset)
    assert d["outcome"] == "config_error"


def test_ucx_and_open_mpi_start_up_notes_that_runs_survive_are_not_their_cause(write, ruleset):
    absent = ("[1594407135.546337] [k69a05298:117  :0]          ib_md.c:1933 UCX  ERROR ibv_open_device(mlx5_9) "
              "failed: No such file or directory")
    d = diagnose_files([write("ok/run.log", absent, " iteration 10 | lm loss: 4.2E+00 |")], ruleset)
    assert d["outcome"] == "healthy"
    # any other UCX error is a failure marker
    d = diagnose_files([write("bad/run.log", absent.replace("ibv_open_device(mlx5_9) failed: No such file or directory",
                                                            "failed to allocate memory pool"))], ruleset)
    assert d["outcome"] == "unknown"
    limit = "slurmstepd: error: *** JOB 2610 ON cn-7 CANCELLED AT 2023-03-10T09:46:31 DUE TO TIME LIMIT ***"
    d = diagnose_files([write("lim/slurm.out", "A requested component was not found, or was unable to be opened.  This",
                              limit)], ruleset)
    assert d["outcome"] == "scheduler_timelimit"
    d = diagnose_files([write("none/slurm.out", "No components were able to be opened in the pml framework.")], ruleset)
    assert d["outcome"] == "config_error" and d["culprit"] == NOBODY


def test_a_bare_exception_raised_inside_checkpoint_code_is_a_checkpoint_fault(write, ruleset):
    # A bare AssertionError (or a racing makedirs' FileExistsError) under a resume or save says the checkpoint
    # could not be restored or written, not that the job's own program is wrong; a precise cause still decides.
    frames = ["[rank0]: Traceback (most recent call last):",
              '[rank0]:   File "/x/train.py", line 65, in <module>',
              '[rank0]:   File "/v/lib/python3.11/site-packages/mmengine/runner/_flexible_runner.py", line 1456, in resume',
              '[rank0]:   File "/v/lib/python3.11/site-packages/xtuner/engine/_strategy/deepspeed.py", line 60, in resume']
    d = diagnose_files([write("a/train.log", *frames, "[rank0]: AssertionError")], ruleset)
    assert d["outcome"] == "checkpoint" and d["culprit"]["ranks"] == [0] and not d["culprit"]["nodes"]
    d = diagnose_files([write("b/train.log", *frames, "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to "
                              "allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB")], ruleset)
    assert d["outcome"] == "cuda_oom"
    # the same exception outside checkpoint code stays the program's own
    d = diagnose_files([write("c/train.log", *frames[:2], '[rank0]:   File "/x/model.py", line 9, in forward',
                              "[rank0]: AssertionError")], ruleset)
    assert d["outcome"] == "user_code_error"


def test_a_ray_task_header_whose_cause_line_was_cut_is_the_tasks_own_error(write, ruleset):
    header = ("ray.exceptions.RayTaskError(RuntimeError): ray::RayTrainWorker._RayTrainWorker__execute() "
              "(pid=935, ip=10.2.0.7, repr=<ray.train._internal.worker_group.RayTrainWorker object at 0x7f07a62d33d0>)")
    frame = '  File "/home/ray/lib/python3.9/site-packages/ray/train/_internal/utils.py", line 129, in discard_return_wrapper'
    d = diagnose_files([write("a/log.txt", header, frame)], ruleset)
    assert d["outcome"] == "user_code_error" and d["culprit"] == NOBODY
    # the cause line, when in the excerpt, decides
    d = diagnose_files([write("b/log.txt", header, frame, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                              "20.00 MiB. GPU 0 has a total capacity of 15.77 GiB")], ruleset)
    assert d["outcome"] == "cuda_oom"


def test_nccl_proxy_noise_after_an_mlperf_success_is_a_completed_run(write, ruleset):
    stop = (' 0: :::MLLOG {"namespace": "", "time_ms": 1728664016176, "event_type": "INTERVAL_END", "key": "run_stop", '
            '"value": 0.92, "metadata": {"file": "/workspace/train.py", "lineno": 321, "status": "success"}}')
    noise = [f"{r}: GPU-9{r}:3087588:3089801 [0] proxy.cc:1497 NCCL WARN [Service thread] Could not receive type from "
             f"localRank 0, res=3, closed=0" for r in (0, 8)]
    assert diagnose_files([write("a/log.txt", *noise)], ruleset)["outcome"] == "unknown"
    d = diagnose_files([write("b/log.txt", stop, *noise)], ruleset)
    assert d["outcome"] == "healthy" and d["culprit"] == NOBODY


def test_a_failed_npu_stream_sync_defers_to_the_cann_report_of_why(write, ruleset):
    lines = ["RuntimeError: ACL stream synchronize failed.",
             "EI9999: Inner Error!",
             "EI9999: 2024-10-21-10:42:00.358.410  The error from device(chipId:3, dieId:0), serial number is 9, hccl "
             "fftsplus task timeout occurred during task execution, stream_id:5, sq_id:5, task_id:38827, stuck notify "
             "num:1, timeout:30min(default).[FUNC:ProcessStarsHcclFftsPlusTimeoutErrorInfo]"]
    d = diagnose_files([write("npu/log.txt", *lines)], ruleset)
    assert d["outcome"] == "nccl_timeout_hang" and d["culprit"] == NOBODY
    assert diagnose_files([write("npu2/log.txt", lines[0])], ruleset)["outcome"] == "unknown"


def test_a_launcher_not_found_that_ranks_printed_after_is_refuted(write, ruleset, tmp_path):
    # stderr and stdout of one Slurm job: the batch script's own python is missing (bash goes on), then srun's
    # labelled tasks run in their container; the steps are in the other file, so only the ranks' lines say so
    miss = "/var/spool/slurmd/job3108079/slurm_script: line 414: python: command not found"
    store = ("27: [rank27]:[W818 03:13:27.384322147 TCPStore.cpp:106] [c10d] sendBytes failed on SocketImpl(fd=68, "
             "addr=[nid006852]:33528, remote=[nid006844]:8888): Broken pipe")
    limit = "slurmstepd: error: *** JOB 3108079 ON nid006844 CANCELLED AT 2026-08-18T03:25:55 DUE TO TIME LIMIT ***"
    write("ran/job.err", miss, store, limit)
    write("ran/job.out", "31:  iteration      313/   18141 | lm loss: 4.243E+00 |")
    d = diagnose_files([tmp_path / "ran"], ruleset)
    assert d["outcome"] == "scheduler_timelimit" and d["culprit"] == NOBODY
    # no rank after it: nothing started, the missing launcher stays the cause
    d = diagnose_files([write("none/job.err", store, miss, limit)], ruleset)
    assert d["outcome"] == "config_error"


def test_a_plain_step_cancel_of_a_job_that_was_training_and_failed_nowhere_is_a_cancel(write, ruleset):
    steps = ["[ip-26-0-147-189:1]: iteration    10920/   25533 | lm loss: 1.397734E+00 |",
             "[ip-26-0-147-189:1]: iteration    10930/   25533 | lm loss: 1.410506E+00 |"]
    aborted = "srun: Job step aborted: Waiting up to 32 seconds for job step to finish."
    cancel = "slurmstepd: error: *** STEP 2610.0 ON ip-26-0-147-189 CANCELLED AT 2023-03-10T09:46:31 ***"
    d = diagnose_files([write("a/job.log", *steps, aborted, cancel, "srun: error: ip-26-0-147-189: task 1: Terminated")],
                       ruleset)
    assert d["outcome"] == "scheduler_preemption_cancel" and d["culprit"] == NOBODY
    # srun tearing the step down after a task of it failed: the same line, not a cancel
    failed = "srun: error: ip-26-0-147-190: task 9: Exited with exit code 1"
    d = diagnose_files([write("b/job.log", *steps, failed, "srun: Terminating StepId=2610.0", cancel)], ruleset)
    assert d["outcome"] != "scheduler_preemption_cancel"
    # a traceback in another file that cannot be ordered against it keeps it teardown
    write("c/job.log", *steps, aborted, cancel)
    write("c/job.err", "Traceback (most recent call last):", '  File "train.py", line 3, in <module>')
    d = diagnose_files([write("c/job.log", *steps, aborted, cancel).parent], ruleset)
    assert d["outcome"] != "scheduler_preemption_cancel"
    # nothing trained: nothing says the step was not torn down after a failure the log does not show
    d = diagnose_files([write("d/job.log", aborted, cancel)], ruleset)
    assert d["outcome"] == "unknown"
