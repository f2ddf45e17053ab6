from datetime import datetime, timezone

import polars as pl
import pytest

from faultline.collectors.files import hints
from faultline.logparse import identity_exprs, parse_lines, progress_lines, who_spoke, year_hint


def one(line: str, **kw) -> dict:
    return parse_lines(pl.DataFrame({"line": [line]}), year=2024, **kw).row(0, named=True)


def utc(*a) -> datetime:
    return datetime(*a, tzinfo=timezone.utc)


@pytest.mark.parametrize("line,node,rank,local_rank,gpu", [
    ("[rank3]: Traceback (most recent call last):", None, 3, None, None),
    ("[default5]:[rank13]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] x", None, 13, 5, None),
    ("12: [default3]:I0510 07:28:04.417845 1398 distributed_c10d.py:337] Waiting", None, None, 3, None),
    ("worker-1: RuntimeError: CUDA out of memory.", "worker-1", None, None, None),
    # pdsh's prefix with an HPC machine's rack-position name (cabinet 5, row 2, node 11; a Cray EX xname)
    ("c05r2n11: RuntimeError: : HIP out of memory. Tried to allocate 576.00 MiB (GPU 3;", "c05r2n11", None, None, None),
    ("x1000c0s0b0n0: [rank4]: Traceback (most recent call last):", "x1000c0s0b0n0", 4, None, None),
    ("e4m3: fp8 format", None, None, None, None),
    ("[hgx-b17] [rank8]: RuntimeError: CUDA error: system not yet initialized", "hgx-b17", 8, None, None),
    ("RuntimeError: CUDA out of memory.", None, None, None, None),
    ("[1,5]<stderr>:[gpu-h01:41222:0:41222] Caught signal 11 (Segmentation fault)", "gpu-h01", 5, None, None),
    # horovodrun (gloo): the index is the worker's rank, with or without its timestamp
    ("[3]<stderr>:RuntimeError: boom", None, 3, None, None),
    ("Mon Mar  4 10:11:12 2024[12]<stdout>:epoch 1", None, 12, None, None),
    ("[3] <stderr>: not a tag", None, None, None, None),
    ("(RayWorkerWrapper pid=4471, ip=10.0.5.12) torch.OutOfMemoryError: CUDA out of memory.", "10.0.5.12", None,
     None, None),
    ("Traceback: something", None, None, None, None),
    ("gpu-17:34050:34121 [3] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : port error",
     "gpu-17", None, None, 3),
    ("[n125-011-039:288505:0:296459] Caught signal 11 (Segmentation fault: address not mapped)",
     "n125-011-039", None, None, None),
    ("[E ProcessGroupNCCL.cpp:916] [Rank 1] NCCL watchdog thread terminated with exception", None, 1, None, None),
    ("what():  [PG ID 0 PG GUID 0(default_pg) Rank 3] Process group watchdog thread terminated", None, 3, None, None),
    ("[PG 3 Rank 1] Watchdog caught collective operation timeout", None, None, None, None),
    ("[PG ID 0 PG GUID 0 Rank 5] Watchdog caught collective operation timeout", None, 5, None, None),
    ("Jun  9 11:49:36 dgx-a100-07 kernel: NVRM: Xid (PCI:0000:3b:00): 79", "dgx-a100-07", None, None, None),
    ("gpu-q-13: torch.cuda.OutOfMemoryError: CUDA out of memory.", "gpu-q-13", None, None, None),
    # pdsh with a hostfile of addresses; an address that is not a host, or a version number, is not one
    ("10.20.3.41: [rank4]: FileNotFoundError: [Errno 2] No such file", "10.20.3.41", 4, None, None),
    ("127.0.0.1: [rank0]: hello", None, 0, None, None),
    ("1.2.3: RuntimeError: x", None, None, None, None),
    ("10.20.3.41:29500: connect failed", None, None, None, None),
    # pdsh relaying torchrun output: any host name (with a digit) before `[rankN]:` is the node
    ("v100x16-2: [rank8]: FileNotFoundError: [Errno 2] No such file", "v100x16-2", 8, None, None),
    ("tiger-a3.cluster.local: [rank1]: hello", "tiger-a3.cluster.local", 1, None, None),
    ("train2.py: [rank0]: hello", None, 0, None, None),
    ("v100x16-2: torch.cuda.OutOfMemoryError", None, None, None, None),
    ("Error: [rank3]: x", None, 3, None, None),
    # grep -r output: the file's name before the syslog line
    ("messages:Jun 17 20:18:08 ip-10-0-3-7 kernel: INFO: task python:881 blocked", "ip-10-0-3-7", None, None, None),
    ("/var/log/syslog:2024-06-09T11:49:36+0000 gpu-a-3 kernel: NVRM: Xid", "gpu-a-3", None, None, None),
    ("[pod/llama-worker-3/pytorch] [rank24]: hello", "llama-worker-3", 24, None, None),
    ("plain line with no prefix at all", None, None, None, None),
    ("2023-07-26 09:59:13.215 | INFO | utils.train:__init__:41 -", None, None, None, None),
])
def test_prefixes(line, node, rank, local_rank, gpu):
    r = one(line)
    assert (r["node"], r["rank"], r["local_rank"], r["gpu"]) == (node, rank, local_rank, gpu)


_TS_CASES = [
    ("[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] x", utc(2024, 3, 21, 2, 7, 8, 408271)),
    ("W1026 03:51:31.222000 2521679 site-packages/torch/distributed/elastic/api.py:908] x",
     utc(2024, 10, 26, 3, 51, 31, 222000)),
    ("Jun  9 11:49:36 host1 kernel: x", utc(2024, 6, 9, 11, 49, 36)),
    ("2024-06-09T11:49:36.5+02:00 host1 kernel: x", utc(2024, 6, 9, 9, 49, 36, 500000)),
    ("[Sun Jun  9 11:49:36 2024] Out of memory: Killed process 7815", utc(2024, 6, 9, 11, 49, 36)),
    ("2023-07-26 09:59:13,215 - INFO - x", utc(2023, 7, 26, 9, 59, 13, 215000)),
    ("2024-01-02T03:04:05.123456789Z [rank0]: hello", utc(2024, 1, 2, 3, 4, 5, 123456)),
    ("[1718000000.5] foo", utc(2024, 6, 10, 6, 13, 20, 500000)),
    ("[ 1234.567890] NVRM: Xid: monotonic seconds since boot carry no wall clock", None),
    ("epoch 10 step 5: loss 2.0", None),
]


@pytest.mark.parametrize("line,ts", _TS_CASES)
def test_timestamps(line, ts):
    assert one(line)["ts"] == ts


def test_line_times_are_detail_exprs_times():
    """The collector reads the times of symptom lines with line_times (each format parsed only where its regex
    matches): the same values as detail_exprs' one expression, for every format, mixed in one column with
    lines of no time, a garbled year, offsets, and a line two formats could read (the first one wins)."""
    from faultline.logparse import detail_exprs, line_times

    lines = [ln for ln, _ in _TS_CASES] + [
        "Jun  9 11:49:36 host1 kernel: [rank0]:[E321 02:07:08.408271257 x.cpp:1] both", "0000-01-01T00:00:00Z x",
        "9999-12-31T23:59:59-05:00 x", "Feb 30 10:00:00 host1 kernel: no such day", "", "[1718000000] x",
        "2024-06-09T11:49:36+0530 gpu-a-3 kernel: x", "I0101 00:00:00.5 1 f.cc:1] x"]
    frame = pl.DataFrame({"line": lines * 3})
    for year in (2019, 2024):
        want = frame.select(detail_exprs(year)["ts"]).to_series()
        got = line_times(frame["line"], year)
        assert got.to_list() == want.to_list() and got.dtype == want.dtype
        assert 10 < got.drop_nulls().len() < len(lines) * 3
    assert line_times(pl.Series("line", [], dtype=pl.String), 2024).len() == 0


def test_file_level_hints_fill_gaps_but_lines_win():
    assert one("plain", file_node="node-a", file_rank=4)["node"] == "node-a"
    assert one("plain", file_node="node-a", file_rank=4)["rank"] == 4
    assert one("gpu-9:1:2 [0] NCCL INFO x", file_node="node-a")["node"] == "gpu-9"


@pytest.mark.parametrize("path,source,node,rank", [
    ("logs/node-a.log", "applog", "node-a", None),
    ("logs/gpu017/dmesg.txt", "syslog", "gpu017", None),
    ("logs/rank3.out", "applog", None, 3),
    ("job/worker-12/train_rank_7.log.gz", "applog", "worker-12", 7),
    ("slurm-4711.out", "applog", None, None),
    ("case/log.txt", "applog", None, None),
    ("case/case2_h20.txt", "applog", None, None),
    ("x/node07/kern.log", "syslog", "node07", None),
    ("big100.log", "applog", None, None),  # digits alone do not make a host name
    ("notes.log", "applog", None, None),
    ("gpu-r2-14.dmesg", "syslog", "gpu-r2-14", None),
    ("ip-10-0-0-7.log", "applog", "ip-10-0-0-7", None),
    ("case/node.txt", "applog", None, None),  # a host word alone is no host's name
    ("case/workers.log", "applog", None, None),
])
def test_file_name_hints(path, source, node, rank):
    from pathlib import Path
    assert hints(Path(path)) == (source, node, rank)


def test_year_hint_takes_the_common_full_year():
    s = pl.Series(["2023-07-26 09:59:13 a", "2023-07-26 10:00:00 b", "[Sun Jun  9 11:49:36 2024] c", "x"])
    assert year_hint(s) == 2023
    assert year_hint(pl.Series(["no dates here"])) is None


def test_ray_prefix_forms_and_terminal_colours(write, ruleset):
    from faultline.pipeline import diagnose_files

    lines = pl.DataFrame({"line": ["(RayTrainWorker pid=4471, ip=10.0.5.12) step 1", "(pid=4471, ip=10.0.5.13) x",
                                   "(raylet, ip=10.0.5.14) y", "(MapBatches(fn) pid=12, ip=10.0.5.15) z"]})
    assert lines.with_columns(**identity_exprs())["node"].to_list() == ["10.0.5.12", "10.0.5.13", "10.0.5.14",
                                                                        "10.0.5.15"]
    # Ray colours its prefixes: the colour codes are read away before the prefix is
    p = write("job/driver.log", data=b"\x1b[36m(RayTrainWorker pid=4471, ip=10.0.5.12)\x1b[0m "
              b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "cuda_oom" and d["culprit"]["nodes"] == ["10.0.5.12"]
    assert "\x1b" not in d["evidence"][0]["line"]


def test_ucx_openmpi_and_prompt_prefixes_name_the_node():
    lines = pl.DataFrame({"line": ["[1712345678.123456] [gpu-a-07:12345:0]    ucp_worker.c:1234 UCX  ERROR x",
                                   "[gpu-a-08:123  :async]  ib_iface.c:12 UCX ERROR y",
                                   "[node01:12345] *** Process received signal ***",
                                   "[ProcessGroupNCCL.cpp:1234] not a host",
                                   # CANN / torch_npu's `[PID: N]` field: a process id, no host
                                   "[PID: 389] 2026-05-01-10:59:14.702.326 Device_Absent/Abnormal(EL0001): x",
                                   "alice@dgx-b200-12:~/run$ torchrun train.py",
                                   # srun --label before UCX's older [host:pid:idx:tid]: the node, not a rank
                                   "3: [gpu-c-11:4410:2:4471] Caught signal 11 (Segmentation fault)"]})
    got = lines.with_columns(**identity_exprs())
    assert got["node"].to_list() == ["gpu-a-07", "gpu-a-08", "node01", None, None, "dgx-b200-12",
                                       "gpu-c-11"]
    assert got["rank"].to_list()[-1] is None


def test_a_field_label_in_brackets_is_no_host_and_lightnings_rank_tag_is_a_rank():
    lines = pl.DataFrame({"line": ["[rank: 0] Seed set to 42", "[rank: 3] Global seed set to 1234",
                                   "[gpu: 1] whatever", "[gpu-a-07:4412] *** Process received signal ***"]})
    got = who_spoke(lines)
    assert got["node"].to_list() == [None, None, None, "gpu-a-07"]
    assert got["rank"].to_list() == [0, 3, None, None]


def test_slurmstepd_program_name_names_the_node():
    """Multiple-slurmd builds print `slurmstepd-<NodeName>: `; the plain `slurmstepd: ` names nobody, and
    the name later in a line is not a prefix."""
    lines = pl.DataFrame({"line": ["slurmstepd-fn2-0002: error: Detected 1 oom-kill event(s) in StepId=7.batch.",
                                   "[2024-03-01T10:00:00.123] slurmstepd-cpu-a7: error: *** STEP 9.0 ON cpu-a7 ***",
                                   "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=7.batch.",
                                   "see slurmstepd-cpu-a7: for details"]})
    assert lines.with_columns(**identity_exprs())["node"].to_list() == ["fn2-0002", "cpu-a7", None, None]


def test_xla_dist_relay_prefix_names_the_client_vm():
    """torch_xla's xla_dist: `date time clientip [ordinal] message`; the ordinal is no rank."""
    lines = pl.DataFrame({"line": ["2021-03-04 05:06:07 10.164.0.12 [2] RuntimeError: Resource exhausted",
                                   "2021-03-04 05:06:07 INFO [2] not an address",
                                   "2021-03-04 05:06:07,123 10.164.0.12 [2] a logging line with millis"]})
    got = lines.with_columns(**identity_exprs())
    assert got["node"].to_list() == ["10.164.0.12", None, None] and got["rank"].to_list() == [None] * 3


def test_who_spoke_per_distinct_prefix_equals_the_full_parse_of_every_line():
    """`who_spoke` parses each distinct prefix once where the prefix settles node and rank; lines whose
    rest could still say something (a torchrun rank, a c10d rank, an NCCL host later on) are parsed whole."""
    from faultline.logparse import who_spoke

    lines = [
        "gpu-node-001:21508:21555 [3] NCCL INFO Channel 13/0 : 11[3] -> 12[4] via P2P/IPC/read",
        "[default3]:gpu-node-001:21508:21555 [3] NCCL INFO Trees [0] 12/-1/-1->11->10",
        "gpu-node-001:21508:21555 [3] NCCL INFO [rank5]: something",
        "gpu-node-001:21508:21555 [3] NCCL INFO [PG 0 Rank 7] watchdog",
        "[default3]:[rank11]:[I1201 10:00:00.1 train.py:4] step 3 loss 2.1",
        "[default3]: iteration 5 | lm loss: 2.0 |",
        "[default3]: progress 10% [00:01<00:02] from other-host:12:34 [1] NCCL INFO",
        "[default3]:[Rank 4] Watchdog caught collective operation timeout",
        "[rank2]:[hgx-b17] hello",
        "[worker3]:x", "[worker3] x", "[trainer2]:[rank9]:[rank10]: y",
        "2024-01-01T10:12:13 [3] NCCL INFO odd host", "Jan:12:13 [3] x", "n1:5:6 [0] ok",
        "Jun  9 11:49:36 dgx-a100-07 kernel: NVRM: Xid 79", "[1,5]<stderr>:[gpu-h01:41222:0:41222] Caught signal",
        "[2]<stderr>:terminate called", "[default1]:[2]<stderr>:x",
        "user@gpu-3:~/run$ python train.py", "(pid=4471, ip=10.0.5.12) x", "", "[", "]:", "gpu-1:1:2 [3] ",
        "slurmstepd-gpu-3: error: x", "2021-03-04 05:06:07 10.164.0.12 [2] x",
    ]
    df = pl.DataFrame({"line": lines * 3})
    assert who_spoke(df).equals(df.select(**identity_exprs()))


def test_progress_lines_are_finite_losses_in_each_printers_form():
    lines = pl.DataFrame({"line": [
        " iteration      100/ 1000 | lm loss: 2.110E+00 |",
        "{'loss': 1.9312, 'grad_norm': 3.1, 'learning_rate': 1e-05, 'epoch': 0.1}",
        "(TaskRunner pid=5257) step:6 - actor/pg_loss:np.float64(-0.0619) - critic/score/mean:0.5",
        "Epoch 3: loss=tensor(0.8812)",
        "loss: nan",                                   # not finite: not progress
        "Loss is Infinity, stopping training",
        "loss scale: 65536.0, skipped",                 # a loss scale is not a loss
    ]})
    got = progress_lines(lines)["line"].to_list()
    assert got == lines["line"].to_list()[:4]
