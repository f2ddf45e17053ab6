"""Scheduler and orchestrator end-of-job texts across rules: which one decides, and who is blamed."""

import pytest

from faultline.pipeline import diagnose_files


def test_k8s_sigkill_with_reason_error_is_not_read_as_host_oom(tmp_path, write, ruleset):
    # Exit code 137 without Reason OOMKilled: a kill after the grace period, a liveness probe. The
    # generic "137 is most often OOM" reading must not take these Kubernetes lines.
    write("describe.txt", "    Last State:     Terminated", "      Reason:       Error",
          "      Exit Code:    137")
    write("collector.log", "pod team-a/w-2 container pytorch: State: Terminated, Reason: Error, Exit Code: 137, "
          "Restart Count: 0")
    d = diagnose_files([tmp_path], ruleset)
    assert d["outcome"] == "unknown", d
    assert {e["rule_id"] for e in d["evidence"]} & {"k8s.sigkill_not_oom", "k8s.exit_code_signal"}


def test_k8s_oomkilled_still_decides_over_the_exit_code(tmp_path, write, ruleset):
    write("describe.txt", "    State:          Terminated", "      Reason:       OOMKilled",
          "      Exit Code:    137")
    assert diagnose_files([tmp_path], ruleset)["outcome"] == "host_oom"


# (file, lines, outcome, culprit nodes): which line decides, and whom it names
LAUNCH_TEXTS = {
    "srun prolog failure blames the named node, not the printer": (
        "gpu001/slurm-88.out",
        ["step 10 loss 2.1", "srun: error: Task launch for StepId=88.0 failed on node gpu007: Job prolog failed",
         "srun: error: Application launch failed: Job prolog failed"],
        "node_failure", ["gpu007"]),
    "flux node failure names the lost host": (
        "flux-job.err",
        ["step 100 loss 2.1",
         "88.204s: job.exception f2Ssd5N3 type=node-failure severity=0 node failure on gpu-n12 (shell rank 3)",
         "flux-job: task(s) exited with exit code 1"],
        "node_failure", ["gpu-n12"]),
    "flux first task exit defers to the python error": (
        "flux-job.err",
        ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>', "KeyError: 'lr'",
         "flux-shell[0]: FATAL: doom: python: task rank 5 on host gpu-n17 exited (Exit 1) and "
         "exit-timeout=30s has expired"],
        "user_code_error", []),
    "k8s admission failure for lost GPUs blames the described pod's node": (
        "describe.txt",
        ["Name:         trainer-worker-3", "Node:         gpu-node-7/10.0.0.7", "Status:       Failed",
         "Reason:       UnexpectedAdmissionError",
         "Message:      Pod Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. "
         "Requested: 8, Available: 7, which is unexpected"],
        "node_failure", ["gpu-node-7"]),
}


@pytest.mark.parametrize("name", LAUNCH_TEXTS)
def test_launcher_end_of_job_texts(name, tmp_path, write, ruleset):
    path, lines, outcome, nodes = LAUNCH_TEXTS[name]
    write(path, *lines)
    d = diagnose_files([tmp_path], ruleset)
    assert d["outcome"] == outcome, d
    assert d["culprit"]["nodes"] == nodes


def test_htcondor_eviction_is_preemption_and_reconnect_failure_names_the_node(tmp_path, write, ruleset):
    write("a/job.log", "004 (4242.000.000) 2025-03-01 12:00:00 Job was evicted.", "\t(0) CPU times")
    d = diagnose_files([tmp_path / "a"], ruleset)
    assert d["outcome"] == "scheduler_preemption_cancel", d
    write("b/job.log", "024 (4242.000.000) 2025-03-01 12:40:00 Job reconnection failed",
          "    Job disconnected too long: JobLeaseDuration (2400 seconds) expired",
          "    Can not reconnect to slot1_2@gpu-n7.example.org, rescheduling job")
    d = diagnose_files([tmp_path / "b"], ruleset)
    assert d["outcome"] == "node_failure", d
    assert d["culprit"]["nodes"] == ["gpu-n7"]


def test_k8s_runtime_and_cni_errors_in_describe_take_the_pods_node(tmp_path, write, ruleset):
    write("a/describe.txt", "Name:         trainer-worker-3", "Node:         gpu-node-7/10.0.0.7",
          "    State:          Terminated", "      Reason:       StartError",
          "      Message:      failed to create containerd task: failed to create shim task: OCI runtime create "
          "failed: runc create failed: unable to start container process: error during container init: error "
          "running hook #0: error running hook: exit status 1, stdout: , stderr: nvidia-container-cli: "
          "initialization error: nvml error: driver/library version mismatch: unknown")
    d = diagnose_files([tmp_path / "a"], ruleset)
    assert d["culprit"]["nodes"] == ["gpu-node-7"], d
    write("b/describe.txt", "Name:         trainer-worker-3", "Node:         gpu-node-8/10.0.0.8", "Events:",
          "  Warning  NetworkNotReady  2m  kubelet  network is not ready: container runtime network not ready: "
          "NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not "
          "initialized")
    d = diagnose_files([tmp_path / "b"], ruleset)
    assert d["outcome"] == "node_failure", d
    assert d["culprit"]["nodes"] == ["gpu-node-8"]


def test_an_outage_the_same_file_sees_end_is_set_aside_but_a_later_one_stays(tmp_path, write, ruleset):
    # resolved_by: `nfs: server X OK` after `not responding` (same server, same file) ends the outage.
    write("a/gpu007/dmesg.log",
          "[Mon Dec  1 10:00:00 2026] nfs: server nfs01 not responding, still trying",
          "[Mon Dec  1 10:00:10 2026] nfs: server nfs01 OK")
    assert diagnose_files([tmp_path / "a"], ruleset)["outcome"] == "healthy"
    # Another server's recovery does not end it, nor does a recovery before a new outage.
    write("b/gpu007/dmesg.log",
          "[Mon Dec  1 10:00:00 2026] nfs: server nfs01 not responding, still trying",
          "[Mon Dec  1 10:00:10 2026] nfs: server nfs02 OK")
    assert diagnose_files([tmp_path / "b"], ruleset)["outcome"] == "storage_io"
    write("c/gpu007/dmesg.log",
          "[Mon Dec  1 10:00:00 2026] nfs: server nfs01 not responding, still trying",
          "[Mon Dec  1 10:00:10 2026] nfs: server nfs01 OK",
          "[Mon Dec  1 10:05:00 2026] nfs: server nfs01 not responding, timed out")
    d = diagnose_files([tmp_path / "c"], ruleset)
    assert d["outcome"] == "storage_io", d
    assert "timed out" in d["root_cause"]
    write("d/gpu007/dmesg.log",
          "[Mon Dec  1 10:00:00 2026] Lustre: scratch-OST0004-osc-ffff9a1c: Connection to scratch-OST0004 "
          "(at 10.40.2.14@o2ib) was lost; in progress operations using this service will wait for recovery "
          "to complete",
          "[Mon Dec  1 10:00:40 2026] Lustre: scratch-OST0004-osc-ffff9a1c: Connection restored to "
          "10.40.2.14@o2ib (at 10.40.2.14@o2ib)")
    assert diagnose_files([tmp_path / "d"], ruleset)["outcome"] == "healthy"


def test_resolved_by_names_only_captures_of_the_rule(tmp_path):
    import textwrap

    import pytest

    from faultline.rules.loader import RulesetError, load_ruleset
    pack = tmp_path / "p"
    pack.mkdir()
    (pack / "r.yaml").write_text(textwrap.dedent("""
        rules:
          - id: p.outage
            title: t
            status: stable
            description: d
            match: {log: {literals: ["down now"], regex: 'server (?P<server>\\\\S+) down now'}}
            emits: {symptom: s_down, role: root, domain: infrastructure, implicates: none, outcome: storage_io,
                    summary: x}
            resolved_by: {symptoms: [s_up], same: [host]}
            tests: {match: ["server a down now"]}
        """))
    with pytest.raises(RulesetError, match="resolved_by.same"):
        load_ruleset([pack])


def test_node_problem_detector_condition_in_describe_node_takes_the_node(tmp_path, write, ruleset):
    write("node.txt", "Name:               gpu-node-7", "Conditions:",
          "  Type             Status  LastHeartbeatTime                 LastTransitionTime                "
          "Reason      Message",
          "  KernelDeadlock   True    Mon, 01 Dec 2026 10:00:00 +0000   Mon, 01 Dec 2026 10:01:00 +0000   "
          "DockerHung  kernel: INFO: task docker:20744 blocked for more than 120 seconds.")
    d = diagnose_files([tmp_path], ruleset)
    assert d["outcome"] == "node_failure", d
    assert d["culprit"]["nodes"] == ["gpu-node-7"]


def test_a_retried_start_up_event_does_not_outrank_the_jobs_later_cause(tmp_path, write, ruleset):
    # FailedCreatePodSandBox is retried by the kubelet: a confirmation, so the pod's later CUDA OOM decides.
    write("events.txt", "2m  Warning  FailedCreatePodSandBox  pod/w-0  Failed to create pod sandbox: rpc error: code = "
          "Unknown desc = failed to setup network for sandbox \"5f2c\": plugin type=\"calico\" failed (add): "
          "error getting ClusterInformation: connection is unauthorized: Unauthorized")
    write("w-0.log", "step 10 loss 2.1",
          "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
          "79.15 GiB of which 1.02 GiB is free.")
    assert diagnose_files([tmp_path], ruleset)["outcome"] == "cuda_oom"


def test_htcondor_eviction_then_a_memory_hold_is_the_memory_hold(tmp_path, write, ruleset):
    write("job.log", "004 (4242.000.000) 2025-03-01 12:00:00 Job was evicted.", "\t(0) CPU times",
          "001 (4242.000.000) 2025-03-01 12:05:00 Job executing on host: <10.0.0.8:9618>",
          "012 (4242.000.000) 2025-03-01 13:00:00 Job was held.",
          "\tJob has gone over cgroup memory limit of 16384 megabytes. Peak usage: 17012 megabytes.")
    assert diagnose_files([tmp_path], ruleset)["outcome"] == "host_oom"
