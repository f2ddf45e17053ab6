from faultline.evaluate import culprit_matches


def cul(**kw) -> dict:
    return {"nodes": [], "ranks": [], "gpus": [], "gpu_pci": [], "local_ranks": []} | kw


def test_a_node_named_in_the_truth_is_the_culprit():
    assert culprit_matches("node gpu-17 (its GPU 3)", cul(nodes=["gpu-17"]))
    assert not culprit_matches("node gpu-17", cul(nodes=["gpu-18"]))


def test_ranks_and_tasks_are_the_same_identity():
    assert culprit_matches("rank 5", cul(ranks=[5]))
    assert culprit_matches("task 7 (/job:worker/replica:0/task:7)", cul(ranks=[7]))
    assert culprit_matches("Slurm task 58 on nid002888", cul(ranks=[58]))
    assert not culprit_matches("task 7", cul(ranks=[8]))
    assert not culprit_matches("rank 12", cul(ranks=[1]))
    assert culprit_matches("Device:3 (RankID 3)", cul(ranks=[3])) and culprit_matches("rank_id: 4", cul(ranks=[4]))
    assert culprit_matches("process [0] (rank=0 in its error line)", cul(ranks=[0]))
    assert not culprit_matches("rank=2", cul(ranks=[0])) and culprit_matches("local_rank=1", cul(local_ranks=[1]))


def test_a_bare_gpu_index_counts_only_without_a_node():
    assert culprit_matches("GPU 2", cul(gpus=[2]))
    assert not culprit_matches("GPU 2", cul(gpus=[2], nodes=["node9"]))
    assert culprit_matches("GPU 0000:3b:00.0", cul(gpu_pci=["0000:3b:00"]))
    # Ascend's torch_npu names its devices `NPU 2` / `npu:2`
    assert culprit_matches("NPU 2", cul(gpus=[2])) and culprit_matches("NPU device 1", cul(gpus=[1]))
    assert not culprit_matches("NPU 2", cul(gpus=[1])) and not culprit_matches("inputs 2", cul(gpus=[2]))


def test_device_names_of_a_gpu_are_its_index():
    assert culprit_matches("GPU:1", cul(gpus=[1])) and culprit_matches("cuda:0", cul(gpus=[0]))
    assert culprit_matches("GPU1 of the job", cul(gpus=[1]))
    assert not culprit_matches("cuda:0", cul(gpus=[1])) and not culprit_matches("TPU:4", cul(gpus=[4]))


def test_a_node_verdict_against_a_truth_naming_only_a_gpu_is_a_miss_not_a_wrong_blame():
    from faultline.evaluate import score_case
    d = {"culprit": cul(nodes=["Ubuntu-Desktop"]), "confidence": "high", "outcome": "gpu_driver_xid_other",
         "ambiguous": False, "recommended_action": {"action": "drain_node"}}
    r = score_case("c", {"outcome_category": "gpu_driver_xid_other", "culprit": "GPU 0000:0a:00.0"}, d)
    assert r.culprit_right is False and not r.wrong_blame
    # a truth that names the node too is comparable: another node is a wrong blame
    r = score_case("c", {"outcome_category": "gpu_driver_xid_other", "culprit": "GPU 3 on node gpu-17"}, d)
    assert r.wrong_blame
