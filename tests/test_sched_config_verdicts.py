"""Scheduler and configuration verdicts across lines: the printer of a cancel, a time limit or a config
check is never the culprit, and a config error on every rank drains nothing."""

from faultline.pipeline import diagnose_files


def _drains(d: dict) -> bool:
    return d["recommended_action"]["action"] in ("drain_node", "reset_gpu", "restart_excluding")


def test_old_slurm_time_limit_banner_over_sigterm_teardown(write, ruleset):
    # Slurm 15.08 layout (node last); the ranks then print what SIGTERM does to them.
    p = write("slurm-88412.out",
              "[rank: 0] Received SIGTERM: 15",
              "W0602 11:40:10.000000 140 torch/distributed/elastic/agent/server/api.py:704] Received Signals.SIGTERM "
              "death signal, shutting down workers",
              "slurmstepd: error: *** JOB 88412 CANCELLED AT 2015-06-02T11:40:09 DUE TO TIME LIMIT on tesla07 ***")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "scheduler_timelimit", d
    assert d["culprit"]["nodes"] == [] and not _drains(d)


def test_sigterm_alone_reads_as_an_outside_stop(write, ruleset):
    # torchrun's agent being told to stop: someone stopped the job from outside (a cancel, a preemption, a
    # pod deletion). With nothing else in the logs that is the verdict, at low confidence and blaming nobody.
    p = write("train.log",
              "W0510 07:30:01.123000 140 torch/distributed/elastic/agent/server/api.py:704] Received Signals.SIGTERM "
              "death signal, shutting down workers",
              "torch.distributed.elastic.multiprocessing.api.SignalException: Process 3432 got signal: 15")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "scheduler_preemption_cancel", d
    assert d["confidence"] == "low" and d["culprit"]["nodes"] == [] and not _drains(d)


def test_sigterm_after_a_task_exited_is_srun_teardown(write, ruleset):
    # srun reported a task exiting on its own before the others were SIGTERMed: its own teardown, the cause
    # is that task's (not shown), not an outside stop.
    p = write("slurm-66120.out",
              "srun: error: gpu-b07: task 0: Exited with exit code 1",
              "srun: Terminating StepId=66120.0",
              "W0510 07:30:01.123000 140 torch/distributed/elastic/agent/server/api.py:704] Received Signals.SIGTERM "
              "death signal, shutting down workers",
              "/var/spool/slurmd/job66120/slurm_script: line 9: 4410 Terminated              srun python train.py")
    assert diagnose_files([p], ruleset)["outcome"] == "unknown"


def test_sigterm_after_an_error_is_not_a_cancel(write, ruleset):
    p = write("train.log",
              "[rank1]: ValueError: expected 4 channels, got 3",
              "W0510 07:30:01.123000 140 torch/distributed/elastic/agent/server/api.py:704] Received Signals.SIGTERM "
              "death signal, shutting down workers",
              "Terminated")
    assert diagnose_files([p], ruleset)["outcome"] == "user_code_error"


def test_task_failure_banner_is_teardown_not_a_cancel(write, ruleset):
    p = write("slurm-7781.out",
              "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total "
              "capacity of 79.10 GiB of which 1.02 GiB is free.",
              "[2026-02-03T04:05:06.789] error: *** STEP 7781.0 ON gpu-b-22 CANCELLED AT 2026-02-03T04:05:06 DUE TO "
              "TASK FAILURE ***")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "cuda_oom", d
    # the rank that ran out of memory, not the node that printed the banner
    assert d["culprit"]["ranks"] == [3] and "gpu-b-22" not in d["culprit"]["nodes"]


def test_submitit_tells_time_out_from_preemption(write, ruleset):
    timed = write("a/4471923_0_log.err",
                  "submitit INFO (2024-03-09 11:00:02,117) - Job has timed out. Ran 2871 minutes out of requested "
                  "2880 minutes.",
                  "submitit WARNING (2024-03-09 11:00:02,118) - Caught signal SIGUSR2 on learnfair0412: this job is "
                  "timed-out.",
                  "submitit INFO (2024-03-09 11:00:04,001) - Requeued job 4471923 (2 remaining timeouts)")
    pre = write("b/4471924_0_log.err",
                "submitit INFO (2024-03-09 11:00:02,117) - Job has not timed out. Ran 31 minutes out of requested "
                "2880 minutes.",
                "submitit WARNING (2024-03-09 11:00:02,118) - Caught signal SIGUSR2 on learnfair0412: this job is "
                "preempted.")
    assert diagnose_files([timed], ruleset)["outcome"] == "scheduler_timelimit"
    d = diagnose_files([pre], ruleset)
    assert d["outcome"] == "scheduler_preemption_cancel" and d["culprit"]["nodes"] == []


def test_lightning_requeue_alone_is_a_requeue_and_the_banner_still_decides(write, ruleset):
    alone = write("a/train.log",
                  "INFO:lightning.pytorch.trainer.connectors.signal_connector:Handling auto-requeue signal: 10",
                  "INFO:lightning.pytorch.trainer.connectors.signal_connector:requeing job 4471923...",
                  "INFO:lightning.pytorch.trainer.connectors.signal_connector:Requeued SLURM job: 4471923")
    d = diagnose_files([alone], ruleset)
    assert d["outcome"] == "scheduler_preemption_cancel" and d["confidence"] != "high"
    banner = write("b/train.log",
                   "INFO:lightning.pytorch.trainer.connectors.signal_connector:Handling auto-requeue signal: 10",
                   "slurmstepd: error: *** STEP 4471923.0 ON gpu3 CANCELLED AT 2025-01-10T15:27:25 DUE TO TIME LIMIT ***")
    assert diagnose_files([banner], ruleset)["outcome"] == "scheduler_timelimit"


def test_pasted_sacct_rows_read_the_job_row_not_the_steps(write, ruleset):
    p = write("report.txt",
              "JobID           JobName  Partition    Account  AllocCPUS      State ExitCode",
              "------------ ---------- ---------- ---------- ---------- ---------- --------",
              "8812045        pretrain        gpu   proj-llm        256    TIMEOUT      0:0",
              "8812045.batch      batch              proj-llm         32  CANCELLED     0:15",
              "8812045.0         python              proj-llm        256  CANCELLED     0:15")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "scheduler_timelimit" and not d["ambiguous"], d
    # a row about another job is not this job's record
    other = diagnose_files([p], ruleset, job_id="8812046")
    assert other["outcome"] != "scheduler_timelimit"


def test_spot_reclaim_names_no_node(write, ruleset):
    p = write("events.txt",
              "49m  Warning  SpotInterrupted  node/ip-10-4-7-19.ec2.internal  Spot interruption warning was triggered",
              "49m  Warning  TerminatingOnInterruption  node/ip-10-4-7-19.ec2.internal  Interruption triggered "
              "termination for the Node",
              "pod trainer-worker-1 container pytorch: State: Terminated, Reason: Error, Exit Code: 143, Restart Count: 0")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "scheduler_preemption_cancel"
    assert d["culprit"]["nodes"] == [] and not _drains(d)


def test_config_error_on_every_rank_blames_no_rank(write, ruleset):
    lines = [f"[rank{r}]: AssertionError: Check batch related parameters. train_batch_size is not equal to "
             f"micro_batch_per_gpu * gradient_acc_step * world_size 64 != 4 * 2 * 16" for r in range(8)]
    d = diagnose_files([write("train.log", *lines)], ruleset)
    assert d["outcome"] == "config_error"
    assert d["culprit"]["ranks"] == [] and not _drains(d)


def test_hydra_override_error_is_config_but_a_plain_value_error_is_user_code(write, ruleset):
    hydra = write("a/train.log",
                  "Could not override 'trainer.devices'.",
                  "To append to your config use +trainer.devices=8",
                  "Key 'devices' is not in struct",
                  "    full_key: trainer.devices",
                  "    object_type=dict",
                  "",
                  "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.")
    assert diagnose_files([hydra], ruleset)["outcome"] == "config_error"
    plain = write("b/train.log", "Traceback (most recent call last):", '  File "train.py", line 9, in <module>',
                  "ValueError: expected 3 channels, got 4")
    assert diagnose_files([plain], ruleset)["outcome"] == "user_code_error"
    enum = write("c/train.log", "Traceback (most recent call last):",
                 "ValueError: step is not a valid IntervalStrategy, please select one of ['no', 'steps', 'epoch']")
    assert diagnose_files([enum], ruleset)["outcome"] == "config_error"


def test_megatron_layout_error_on_rank0_is_config_not_a_node(write, ruleset):
    p = write("train.log",
              "[rank0]: AssertionError: world size (12) is not divisible by total_model_size (total_model_size=8)",
              "E0101 00:00:01.000000 140 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
              "local_rank: 0 (pid: 4242) of binary: /usr/bin/python")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "config_error" and not _drains(d)


def test_ctrl_c_alone_is_a_cancel_but_not_over_a_hang(write, ruleset):
    alone = write("a/train.log", "Traceback (most recent call last):", '  File "train.py", line 88, in <module>',
                  "KeyboardInterrupt")
    d = diagnose_files([alone], ruleset)
    assert d["outcome"] == "scheduler_preemption_cancel" and d["culprit"]["nodes"] == []
    hung = write("b/train.log",
                 "[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: "
                 "WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600004 "
                 "milliseconds before timing out.",
                 "[rank0]:[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog caught collective operation timeout: "
                 "WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600010 "
                 "milliseconds before timing out.",
                 "Traceback (most recent call last):", "KeyboardInterrupt")
    assert diagnose_files([hung], ruleset)["outcome"] == "nccl_timeout_hang"
