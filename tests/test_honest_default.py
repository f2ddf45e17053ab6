"""With the scheduler's state unknown, `healthy` needs evidence of health: no readable line, a log
that could not be read whole, or a failure marker no rule explains is `unknown`, said why."""

import bz2
import gzip
import json
import lzma
import os

import pytest

from faultline.cli import EXIT_AMBIGUOUS, EXIT_FAILURE, EXIT_HEALTHY, EXIT_UNKNOWN, main
from faultline.collectors.files import FileReport, expand, read_blocks
from faultline.pipeline import diagnose_files

HEALTHY = ["[rank0]: step 10 loss 2.31", "[rank0]: step 20 loss 2.17", "[rank0]: saving checkpoint step 20"]
XID79 = "[Sun Jun  9 11:49:36 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=2451, GPU has fallen off the bus."


def applog(d):
    return next(c for c in d["coverage"] if c["source"] == "applog")


def test_a_clean_log_with_no_failure_marker_is_healthy(write, ruleset):
    d = diagnose_files([write("job/train.log", *HEALTHY)], ruleset)
    assert d["outcome"] == "healthy" and d["recommended_action"]["action"] == "no_action"


def test_empty_file_is_unknown_not_healthy(write, ruleset):
    d = diagnose_files([write("job/empty.log", data=b"")], ruleset)
    assert d["outcome"] == "unknown"
    assert applog(d)["status"] == "empty" and "file has no lines" in applog(d)["reason"]
    assert "no readable log line" in d["confidence_reason"]


def test_empty_folder_is_unknown_and_coverage_says_so(tmp_path, ruleset):
    (tmp_path / "job").mkdir()
    d = diagnose_files([tmp_path / "job"], ruleset)
    assert d["outcome"] == "unknown"
    assert applog(d)["status"] == "empty" and "folder holds no files" in applog(d)["reason"]


def test_binary_file_is_unknown_and_named_binary(write, ruleset):
    d = diagnose_files([write("job/core.log", data=b"\x7fELF\x02\x01\x01\x00" + os.urandom(200_000))], ruleset)
    assert d["outcome"] == "unknown"
    assert applog(d)["status"] == "error" and "binary data" in applog(d)["reason"]


def test_truncated_gzip_of_a_clean_log_is_unknown_not_healthy(write, ruleset):
    body = gzip.compress(("\n".join(HEALTHY * 2000) + "\n").encode())
    d = diagnose_files([write("job/train.log.gz", data=body[: len(body) // 2])], ruleset)
    assert d["outcome"] == "unknown"
    cov = applog(d)
    assert cov["status"] == "error" and "truncated archive" in cov["reason"] and cov["rows"] > 100
    assert "could not be read" in d["confidence_reason"]


@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress, lzma.compress], ids=["gz", "bz2", "xz"])
def test_truncated_archive_keeps_its_intact_part(write, ruleset, compress):
    # the fault sits early; the damage at the end must not throw the intact lines away
    text = "\n".join([XID79] + ["[rank3]: step %d loss 2.0" % i for i in range(100000)]) + "\n"  # bz2: several 900 kB blocks
    ext = {gzip.compress: "gz", bz2.compress: "bz2", lzma.compress: "xz"}[compress]
    body = compress(text.encode())
    p = write(f"gpu-07/dmesg.log.{ext}", data=body[: int(len(body) * 0.8)])
    rep = FileReport(str(p), "syslog", None, None)
    with pytest.raises((EOFError, OSError, ValueError)):
        got = [line for f in read_blocks(p, rep, block_bytes=1 << 16) for line in f["line"]]
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "gpu_hardware" and d["culprit"]["nodes"] == ["gpu-07"]


def test_concatenated_gzip_members_are_all_read(write):
    p = write("a.log.gz", data=gzip.compress(b"one\ntwo\n") + gzip.compress(b"three\n"))
    rep = FileReport(str(p), "applog", None, None)
    assert [x for f in read_blocks(p, rep) for x in f["line"]] == ["one", "two", "three"]


def test_a_traceback_with_no_known_cause_is_unknown_with_the_marker_as_evidence(write, ruleset):
    p = write("job/train.log", *HEALTHY, "[rank2]: Traceback (most recent call last):",
              '[rank2]:   File "/opt/train.py", line 118, in <module>')
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "unknown" and d["culprit"]["ranks"] == []
    assert d["evidence"] and d["evidence"][0]["rule_id"] == "generic.traceback_header"
    assert "failure markers" in d["confidence_reason"]


def test_an_error_level_line_alone_is_unknown(write, ruleset):
    p = write("job/train.log", *HEALTHY, "2025-02-03 11:12:13,456 - trainer - ERROR - worker 3 stopped responding")
    assert diagnose_files([p], ruleset)["outcome"] == "unknown"


def test_completed_state_still_wins_over_markers(write, ruleset):
    p = write("job/train.log", *HEALTHY, "ERROR:root:could not reach the metrics server")
    assert diagnose_files([p], ruleset, state="COMPLETED")["outcome"] == "healthy"


def test_a_known_cause_is_not_hidden_by_markers(write, ruleset):
    p = write("job/train.log", "[rank1]: Traceback (most recent call last):",
              "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "cuda_oom" and d["culprit"]["ranks"] == [1]


def test_folder_name_yields_to_the_slurm_id_the_lines_name(write, capsys):
    # `logs/015/` is a folder name, not a Slurm id: the time-limit line of job 55595933 is this job's
    p = write("015/log.txt", "Epoch 10:  41%|####      | 410/1000",
              "slurmstepd: error: *** STEP 55595933.0 ON maestro-3017 CANCELLED AT 2025-01-10T15:27:25 DUE TO TIME LIMIT ***")
    assert main(["diagnose", str(p.parent), "--format", "json"]) == EXIT_FAILURE
    d = json.loads(capsys.readouterr().out)
    assert d["outcome"] == "scheduler_timelimit" and d["job_id"] == "55595933"
    # an explicit --job-id is the user's word: the line about another job is not this job's evidence
    assert main(["diagnose", str(p.parent), "--format", "json", "--job-id", "777"]) == EXIT_HEALTHY
    assert json.loads(capsys.readouterr().out)["outcome"] == "healthy"


def test_exit_status_scheme(write, tmp_path, capsys):
    assert main(["diagnose", str(write("h/train.log", *HEALTHY))]) == EXIT_HEALTHY
    (tmp_path / "void").mkdir()
    assert main(["diagnose", str(tmp_path / "void")]) == EXIT_UNKNOWN
    assert main(["diagnose", str(write("f/train.log", XID79))]) == EXIT_FAILURE
    # two simultaneous, unrelated root causes on two nodes: a person must look
    a = write("amb/gpu-01/dmesg.log", XID79)
    write("amb/gpu-02/train.log", "[Sun Jun  9 11:49:37 2024] [rank9]: torch.OutOfMemoryError: CUDA out of memory.")
    code = main(["diagnose", str(a.parent.parent), "--format", "json"])
    d = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert code == (EXIT_AMBIGUOUS if d["ambiguous"] else EXIT_FAILURE)


def test_unreadable_entries_of_a_folder_are_reported_not_skipped(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "ok.log").write_text("x\n")
    os.mkfifo(job / "pipe.log")
    (job / "dangling.log").symlink_to(job / "missing-target")
    (job / "loop").symlink_to(job)  # a folder link back up: entered once
    files, problems = expand([job])
    assert [f.name for f in files] == ["ok.log"]
    reasons = {os.path.basename(r.path): r.reason for r in problems}
    assert "not a regular file" in reasons["pipe.log"] and "dangling" in reasons["dangling.log"]


def test_a_folder_tree_a_thousand_deep_is_walked(tmp_path, ruleset):
    d = tmp_path / "job"
    deep = str(d)
    os.mkdir(deep)
    for _ in range(1000):  # pathlib's own mkdir(parents=True) recurses: build it one level at a time
        deep += "/d"
        os.mkdir(deep)
    with open(deep + "/dmesg.log", "w") as fh:
        fh.write(XID79 + "\n")
    try:
        files, _ = expand([d])
        assert len(files) == 1
    finally:  # shutil.rmtree (pytest's cleanup) recurses too: take it down one level at a time
        os.remove(deep + "/dmesg.log")
        while deep != str(d):
            os.rmdir(deep)
            deep = deep.rsplit("/", 1)[0]
