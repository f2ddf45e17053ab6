"""Regression inputs for the defects a hostile-input review found (issue 10): each failed before its fix."""

import resource
import time

from faultline.pipeline import diagnose_files

OOM = "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


def test_defect1_a_printed_world_size_never_sizes_memory(write, ruleset):
    # world_size=2^31-1 once built a list of every rank: 23.8 GB and a kill. Now bounded.
    p = write("job/train.log",
              "RuntimeError: Timed out initializing process group in store based barrier on rank: 2, for key: "
              "store_based_barrier_key:1 (world_size=2147483647, worker_count=7, timeout=0:30:00)",
              "[rank2147483646]: [E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: "
              "WorkNCCL(SeqNum=4, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 milliseconds before timing out.")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    d = diagnose_files([p], ruleset)
    assert time.monotonic() - t0 < 60  # was minutes; a generous bound that only an unbounded list breaks
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 1500, grown_mb
    assert d["outcome"] == "nccl_timeout_hang"


def test_defect2_timestamps_outside_any_job_life_are_dropped_not_fatal(write, ruleset):
    p = write("job/train.log", f"9999-12-31T23:59:59-05:00 {OOM}", f"0000-01-01T00:00:00+05:00 {OOM}",
              f"0001-01-01T00:00:00+05:00 {OOM}")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "cuda_oom" and all(e["ts"] is None for e in d["evidence"])


def test_defect6_rule_tuples_are_the_same_objects_on_every_call(ruleset):
    # extract caches per-object work by identity; a fresh tuple per call grew that cache per diagnosis
    assert ruleset.log_rules is ruleset.log_rules and ruleset.job_rules is ruleset.job_rules


def test_defect7_a_carriage_return_ends_a_record(write, ruleset):
    # 160 kB of tqdm updates on one physical line, then the OOM: the 64 KiB line limit used to eat it
    bar = "".join(f"\r {i // 10}%|####      | {i}/1000 [00:{i % 60:02d}<00:10]" for i in range(4000))
    p = write("job/train.log", data=("[rank0]: start\n" + bar + "\r" + OOM + "\n").encode())
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "cuda_oom" and d["culprit"]["ranks"] == [3]
