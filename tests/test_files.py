"""Bad input gets a verdict or a clear record, never a crash, and loses nothing else."""

import gzip
import os
import random

import polars as pl

from faultline.collectors.files import FileReport, read_blocks
from faultline.pipeline import collect_files, diagnose_files

OOM = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


def lines_of(path, **kw):
    rep = FileReport(str(path), "applog", None, None)
    frames = list(read_blocks(path, rep, **kw))
    return (pl.concat(frames)["line"].to_list() if frames else []), rep


def test_block_boundaries_do_not_change_lines(write):
    rnd = random.Random(7)
    text = [("x" * rnd.randint(0, 300)) + f" line {i}" for i in range(3000)]
    p = write("a.log", *text)
    whole, _ = lines_of(p)
    for block in (17, 1000, 4096):
        got, rep = lines_of(p, block_bytes=block, max_line=10_000)
        assert got == whole == text
        assert rep.truncated_lines == 0


def test_crlf_and_missing_final_newline(write):
    p = write("a.log", data=b"one\r\ntwo\r\nthree")
    assert lines_of(p)[0] == ["one", "two", "three"]


def test_fifty_megabyte_line_is_truncated_with_a_marker_and_the_rest_survives(write, ruleset):
    big = b"A" * (50 << 20)
    p = write("big.log", data=b"before\n" + big + b"\n" + OOM.encode() + b"\n")
    got, rep = lines_of(p, block_bytes=1 << 20)
    assert got[0] == "before" and got[2] == OOM
    assert got[1].startswith("A" * 1000) and "line truncated" in got[1] and len(got[1]) < 70_000
    assert rep.truncated_lines == 1
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "cuda_oom"
    assert "truncated" in " ".join(c["reason"] for c in d["coverage"])


def test_long_line_inside_one_block_is_truncated_too(write):
    p = write("a.log", "short", "B" * 200_000, "after")
    got, rep = lines_of(p)
    assert got[0] == "short" and got[2] == "after" and "line truncated" in got[1]
    assert rep.truncated_lines == 1


def test_invalid_utf8_is_replaced_and_counted(write, ruleset):
    p = write("bad.log", data=b"caf\xe9 \xff\xfe\n" + OOM.encode() + b"\n")
    got, rep = lines_of(p)
    assert got[0] == "caf\ufffd \ufffd\ufffd"
    assert rep.replaced_chars == 3
    assert diagnose_files([p], ruleset)["outcome"] == "cuda_oom"


def test_utf16_with_a_byte_order_mark_is_read_as_text(write, ruleset):
    """Windows PowerShell's `>` writes UTF-16 with a BOM: every other byte is NUL, yet it is a text log."""
    text = "step 1 ok\r\n" + OOM + "\r\n"
    for enc, name in (("utf-16", "ps.log"), ("utf-16-be", "be.log")):
        data = (b"\xfe\xff" if enc == "utf-16-be" else b"") + text.encode(enc)
        p = write(name, data=data)
        got, rep = lines_of(p, block_bytes=7)
        assert got == ["step 1 ok", OOM] and rep.replaced_chars == 0
        assert diagnose_files([p], ruleset)["outcome"] == "cuda_oom"
    gz = write("ps.log.gz", data=gzip.compress(text.encode("utf-16")))
    assert lines_of(gz)[0] == ["step 1 ok", OOM]


def test_random_bytes_empty_and_corrupt_files_are_recorded_not_fatal(write, ruleset, tmp_path):
    write("job/random.bin", data=os.urandom(300_000))
    write("job/empty.log", data=b"")
    write("job/broken.log.gz", data=b"\x1f\x8b\x08\x00garbage-not-gzip")
    write("job/good.log.gz", data=gzip.compress((OOM + "\n").encode()))
    ev = collect_files([tmp_path / "job", tmp_path / "does-not-exist"], ruleset)
    by_name = {os.path.basename(r.path): r for r in ev.files}
    assert by_name["empty.log"].status == "empty"
    assert by_name["broken.log.gz"].status == "error" and by_name["broken.log.gz"].reason
    assert by_name["does-not-exist"].status == "error"
    assert by_name["good.log.gz"].lines == 1
    d = diagnose_files([tmp_path / "job", tmp_path / "does-not-exist"], ruleset)
    assert d["outcome"] == "cuda_oom"
    applog = next(c for c in d["coverage"] if c["source"] == "applog")
    # Part of the applog could not be read: the source is incomplete, with the one good line counted.
    assert applog["status"] == "error" and applog["rows"] == 1
    assert "random.bin: error (BinaryInput" in applog["reason"]
    assert "broken.log.gz: error" in applog["reason"] and "empty.log: empty" in applog["reason"]


def test_only_garbage_gives_a_verdict(write, ruleset):
    p = write("noise.bin", data=os.urandom(100_000))
    d = diagnose_files([p], ruleset)
    assert d["outcome"] in ("healthy", "unknown")
    assert d["culprit"] == {"nodes": [], "ranks": [], "gpus": [], "gpu_pci": [], "local_ranks": []}


def test_arrow_line_splitter_gives_the_python_splitters_lines_and_counts(tmp_path, monkeypatch):
    """Big files are split by numpy/Arrow (collectors.files.ARROW_FROM); every guarantee of the Python
    path holds there too: \\r\\n, lone \\r, ANSI colours, U+FFFD counted, invalid bytes replaced (that
    block falls back), long lines cut at every block boundary."""
    from faultline.collectors import files as filecol

    rnd = random.Random(11)
    pieces = [b"hello", b"\n", b"\r\n", b"\r", b"\x1b[31mred\x1b[0m", "\u00e9\u2713".encode(), "\ufffd".encode(),
              b"gpu-1:12:34 [3] NCCL INFO x", b"\n\n", b"a" * 70, b"\xff", b"\xc3", b"[rank3]: loss 2.0"]
    for k in range(60):
        data = b"".join(rnd.choice(pieces) for _ in range(rnd.randrange(1, 500)))
        if k % 4 == 0:
            data += b"x" * rnd.randrange(0, 5000) + rnd.choice([b"", b"\n", b"\r"])
        p = tmp_path / f"f{k}.log"
        p.write_bytes(data)
        kw = {"block_bytes": rnd.choice([64, 333, 4096, 1 << 20]), "max_line": rnd.choice([40, 100, 1 << 16])}
        monkeypatch.setattr(filecol, "ARROW_FROM", 1 << 60)
        want = lines_of(p, **kw)
        monkeypatch.setattr(filecol, "ARROW_FROM", 0)
        got = lines_of(p, **kw)
        assert got[0] == want[0]
        assert (got[1].bytes, got[1].truncated_lines, got[1].replaced_chars) == \
            (want[1].bytes, want[1].truncated_lines, want[1].replaced_chars)


def test_a_log_pasted_in_inline_code_reads_as_the_log(write, ruleset):
    # Markdown's backticks around every pasted line (issue and forum posts) say nothing about the failure.
    from faultline.pipeline import diagnose_files
    p = write("pasted.txt", "`[rank1]: Traceback (most recent call last):`",
              '`  File "train.py", line 8, in <module>`',
              "`[rank1]: ValueError: expected 3 channels, got 4`")
    d = diagnose_files([p], ruleset)
    assert d["outcome"] == "user_code_error" and d["culprit"]["ranks"] == [1]
