"""Issue 10, defect 3 (decompression bombs) and the limits of faultline/limits.py: past a limit the text
read so far is kept and the coverage names the file and where it was cut; never a crash or a 5xx."""

import bz2
import gzip
import io
import lzma
import time

import pytest
from fastapi.testclient import TestClient

from faultline import limits
from faultline.limits import ReadLimits
from faultline.pipeline import collect_files, diagnose_files
from faultline.service.app import create_app
from faultline.service.settings import Settings

OOM = "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
COMPRESS = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}
MIB = 1 << 20


def bomb(kind: str, mib: int, head: str = OOM) -> bytes:
    """A few KB that inflate to `mib` MiB: one real line, then nothing but newlines."""
    return COMPRESS[kind]((head + "\n").encode() + b"\n" * (mib * MIB))


def applog(d: dict) -> dict:
    return next(c for c in d["coverage"] if c["source"] == "applog")


@pytest.mark.parametrize("kind", ["gz", "bz2", "xz"])
def test_defect3_a_decompression_bomb_is_cut_at_the_file_limit_and_says_where(write, ruleset, kind):
    p = write(f"job/train.log.{kind}", data=bomb(kind, 48))
    small = ReadLimits(file_bytes=4 * MIB, job_bytes=limits.CLI_READ.job_bytes, job_lines=limits.CLI_READ.job_lines)
    t0 = time.monotonic()
    d = diagnose_files([p], ruleset, read_limits=small)
    assert time.monotonic() - t0 < 30
    cov = applog(d)
    assert d["outcome"] == "cuda_oom"  # what came before the cut is kept
    assert cov["status"] == "error" and f"train.log.{kind}" in cov["reason"]
    assert f"cut after {4 * MIB} bytes" in cov["reason"] and "decompressed bytes per file" in cov["reason"]


def test_defect3_the_job_line_limit_cuts_one_file_and_names_the_files_it_never_read(write, ruleset):
    a = write("job/a.log", OOM, *[f"[rank0]: step {i}" for i in range(999)])
    b = write("job/b.log", "[rank1]: never read")
    lim = ReadLimits(file_bytes=MIB, job_bytes=MIB, job_lines=100)
    ev = collect_files([a, b], ruleset, read_limits=lim)
    rep = {r.path.rsplit("/", 1)[-1]: r for r in ev.files}
    assert rep["a.log"].lines == 100 and "cut after line 100" in rep["a.log"].reason
    assert rep["b.log"].lines == 0 and rep["b.log"].reason.startswith("not read: the job's limit of 100 lines")
    assert ev.stats["lines"].sum() == 100


def test_defect3_the_job_byte_limit_counts_plain_and_decompressed_text(write, ruleset):
    a = write("job/a.log", "x" * 1000)
    b = write("job/b.log.gz", data=gzip.compress(b"y" * 5000 + b"\n"))
    ev = collect_files([a, b], ruleset, read_limits=ReadLimits(file_bytes=MIB, job_bytes=3000, job_lines=10**6))
    rep = {r.path.rsplit("/", 1)[-1]: r for r in ev.files}
    assert rep["a.log"].cut_at is None and rep["a.log"].status == "ok"
    assert rep["b.log.gz"].bytes == 3000 - 1001 and "job's limit of bytes of text" in rep["b.log.gz"].reason


def test_defect3_a_file_exactly_at_the_limit_is_not_cut(write, ruleset):
    p = write("job/a.log.gz", data=gzip.compress(b"z" * 99 + b"\n"))
    ev = collect_files([p], ruleset, read_limits=ReadLimits(file_bytes=100, job_bytes=100, job_lines=10))
    assert ev.files[0].cut_at is None and ev.files[0].status == "ok"


def test_defect3_the_service_cuts_an_uploaded_bomb_and_answers_200(ruleset, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no data/faultline.yaml: inline only
    app = create_app(Settings(tmp_dir=tmp_path, max_decompressed_mb=2, max_lines=10**8), ruleset)
    with TestClient(app, base_url="http://localhost") as client:
        r = client.post("/v1/diagnose", files={"files": ("node-a/train.log.gz", bomb("gz", 64))},
                        data={"state": "FAILED"})
        assert r.status_code == 200, r.text
        cov = applog(r.json())
        assert r.json()["outcome"] == "cuda_oom"
        assert "train.log.gz" in cov["reason"] and f"cut after {2 * MIB} bytes" in cov["reason"]


def test_defect3_the_service_line_limit_names_the_upload_it_did_not_read(ruleset, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = create_app(Settings(tmp_dir=tmp_path, max_lines=1000), ruleset)
    with TestClient(app, base_url="http://localhost") as client:
        r = client.post("/v1/diagnose", files=[("files", ("a.log", ("\n" * 3_000).encode())),
                                                ("files", ("b.log", OOM.encode()))])
        assert r.status_code == 200, r.text
        reason = applog(r.json())["reason"]
        assert "a.log: error (cut after line 1000" in reason and "b.log: error (not read" in reason


def test_service_read_limits_come_from_its_settings():
    s = Settings(max_decompressed_mb=3, max_lines=7)
    assert s.read_limits == ReadLimits(file_bytes=3 * MIB, job_bytes=3 * MIB, job_lines=7)
    assert Settings().read_limits.job_lines == limits.SERVICE_MAX_LINES
    with pytest.raises(ValueError):
        Settings(max_lines=0)
