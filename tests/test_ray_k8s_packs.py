"""Ray and Kubernetes operator packs across lines: who is blamed when the printer is not the culprit."""

from faultline.pipeline import diagnose_files

NODE_A_ID = "3f9c0d1e2a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9012"


def gcs_dead(node_id: str, ip: str, ts: str = "2025-03-02 14:21:07,512") -> str:
    return (f"{ts}\tWARNING worker.py:2058 -- The node with node id: {node_id} and address: {ip} and node "
            f"name: {ip} has been marked dead because the detector has missed too many heartbeats from it.")


def actor_died(node_id: str) -> list[str]:
    return ["ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
            "\tclass_name: RayTrainWorker",
            f"The actor died because its node has died. Node Id: {node_id}",
            "\tthe actor's node was terminated unexpectedly: health check failed due to missing too many heartbeats"]


def test_gcs_names_the_dead_node_not_the_driver(tmp_path, write, ruleset):
    write("driver.log",
          "(RayTrainWorker pid=3101, ip=10.42.7.19) [rank1]: step 100 loss 2.1",
          "(RayTrainWorker pid=3007, ip=10.42.7.20) [rank0]: step 100 loss 2.1",
          gcs_dead(NODE_A_ID, "10.42.7.19"), *actor_died(NODE_A_ID),
          "ray.train.base_trainer.TrainingFailedError: The Ray Train run failed. Please inspect the previous "
          "error messages for a cause.")
    d = diagnose_files([tmp_path], ruleset)
    assert d["outcome"] == "node_failure", d
    assert d["culprit"]["nodes"] == ["10.42.7.19"]
    assert d["confidence"] == "high"


def test_actor_node_died_resolves_the_node_id_through_a_line_pairing_id_and_ip(tmp_path, write, ruleset):
    # Two corroborations of one node loss: a task's NodeDiedError pairs the id with the IP, the actor's
    # error names the id only. Both must point at one node, not at the IP and a hex id.
    write("driver.log",
          "ray.exceptions.NodeDiedError: Task failed because the node it was running on is dead or unavailable. "
          f"Node IP: 10.42.7.19, node ID: {NODE_A_ID}. This can happen if the node was preempted.",
          *actor_died(NODE_A_ID))
    d = diagnose_files([tmp_path], ruleset)
    assert d["outcome"] == "node_failure"
    assert d["culprit"]["nodes"] == ["10.42.7.19"]


def test_unmapped_node_id_is_named_as_is_never_the_printer(tmp_path, write, ruleset):
    write("driver.log", "(RayTrainWorker pid=3101, ip=10.42.7.19) [rank1]: step 100 loss 2.1",
          *actor_died("9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d"))
    d = diagnose_files([tmp_path], ruleset)
    assert d["outcome"] == "node_failure"
    assert "10.42.7.19" not in d["culprit"]["nodes"]
    assert d["confidence"] == "low"


def test_preempted_node_is_not_a_node_failure(tmp_path, write, ruleset):
    lines = actor_died(NODE_A_ID)
    lines[-1] = "\tthe actor's node was preempted: spot instance reclaimed"
    write("driver.log", *lines)
    d = diagnose_files([tmp_path], ruleset)
    assert d["outcome"] == "scheduler_preemption_cancel"
    assert d["culprit"]["nodes"] == []


def test_memory_monitor_kill_blames_the_named_node_as_workload(tmp_path, write, ruleset):
    write("driver.log",
          "(RayTrainWorker pid=3007, ip=10.42.7.20) [rank0]: step 100 loss 2.1",
          "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
          "Memory on the node (IP: 10.42.7.21, ID: 6e2f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b) where "
          "the task (task ID: 5a1b2c3d, name=RayTrainWorker.train, pid=3007, memory used=18.25GB) was running was "
          "59.80GB / 62.50GB (0.956823), which exceeds the memory usage threshold of 0.95.")
    d = diagnose_files([tmp_path], ruleset)
    assert d["outcome"] == "host_oom"
    assert d["domain"] == "workload"
    assert d["culprit"]["nodes"] == ["10.42.7.21"]
    assert d["recommended_action"]["action"] == "fix_and_resubmit"


def test_operator_failed_condition_defers_to_the_pod_state(tmp_path, write, ruleset):
    write("describe.txt",
          "    Message:               PyTorchJob llama3-sft is failed because 1 Worker replica(s) failed.",
          "    Reason:                PyTorchJobFailed",
          "    Last State:     Terminated",
          "      Reason:       OOMKilled",
          "      Exit Code:    137")
    d = diagnose_files([tmp_path], ruleset)
    assert d["outcome"] == "host_oom", d


def test_operator_failed_condition_alone_is_no_cause(tmp_path, write, ruleset):
    write("describe.txt",
          "    Message:               PyTorchJob llama3-sft is failed because 1 Worker replica(s) failed.")
    d = diagnose_files([tmp_path], ruleset)
    assert d["outcome"] == "unknown"
    assert d["culprit"]["nodes"] == []
