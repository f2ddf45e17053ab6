"""The benchmark suite's smoke mode runs end to end and reports every stage with sane numbers.

No timing assertions: only that each stage ran, counted the lines it was given, and that the
baselines saw the same lines as the engine.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("rg") is None,
                    reason="ripgrep not installed (Debian: apt-get install -y ripgrep): the benchmark's baseline")
def test_bench_smoke(tmp_path):
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--scenarios", "smoke", "--repeat", "1",
                           "--out", str(out), "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=900)  # a hang guard, not a speed check
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout
    rows = {r["stage"]: r for r in json.loads(out.read_text())["rows"]}
    expected = {"ingest", "extract", "diagnose", "e2e", "single", "single_cli", "service", "python_loop", "metrics"}
    if shutil.which("rg"):
        expected |= {"ripgrep", "ripgrep_unicode"}
    assert expected <= set(rows), set(rows)
    for stage in expected:
        assert f"| {stage} " in table
    n = rows["ingest"]["lines"]
    assert n > 10_000
    for stage in ("extract", "diagnose", "e2e"):
        r = rows[stage]
        assert r["lines"] == n and r["bytes"] > 0
        assert r["median_s"] > 0 and r["lines_per_s"] > 0 and 0 < r["peak_rss"] < 8 << 30
        assert r["vs_py"] > 0
    assert rows["diagnose"]["diagnoses"] == 40
    assert rows["extract"]["symptoms"] > 0
    assert rows["metrics"]["lines"] > 1_000_000 and rows["metrics"]["symptoms"] > 0  # a fleet day of samples
    assert rows["single"]["lines"] == 20_000 and rows["single"]["outcome"] != "healthy"
    svc = rows["service"]  # the same job through a real `faultline serve`: same verdict as in-process
    assert svc["median_s"] > 0 and len(svc["runs_s"]) >= 20 and svc["p95_s"] >= svc["median_s"]
    assert svc["outcome"] == rows["single"]["outcome"] and svc["lines"] == 20_000 and svc["peak_rss"] > 0
    assert rows["python_loop"]["refused"] == 0 and rows["python_loop"]["lines"] > 0
    if "ripgrep" in rows:
        # the same patterns find the same lines: ripgrep's matching lines = lines with >= 1 symptom
        assert rows["ripgrep"]["matched_lines"] == rows["extract"]["matched_lines"]
        assert rows["extract"]["vs_rg"] > 0
    assert not list(tmp_path.glob("faultline-bench-*")), "scenario data was not cleaned up"


@pytest.mark.skipif(shutil.which("rg") is None, reason="ripgrep not installed: the bigfile stage's baseline")
def test_bench_bigfile_stage_smoke(tmp_path):
    """The bigfile stage on a 50,000-line log of its kind: the whole CLI process, ripgrep and the Python
    loop over the same file, and the CLI finds the injected fault (Xid 79 on gpu-node-005)."""
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--scenarios", "bigfile_smoke", "--repeat", "1",
                           "--bigfile-py-lines", "2000", "--out", str(out), "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=900)  # a hang guard, not a speed check
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["stage"]: r for r in json.loads(out.read_text())["rows"]}
    assert {"ripgrep", "python_loop", "diagnose_cli"} <= set(rows)
    cli = rows["diagnose_cli"]
    assert cli["outcome"] == "gpu_hardware" and cli["lines"] == 50_000 and cli["vs_rg"] > 0 and cli["vs_py"] > 0
    assert 0 < cli["peak_rss"] < 4 << 30 and cli["cpu_s"] > 0
    assert rows["ripgrep"]["matched_lines"] > 0 and rows["python_loop"]["lines"] == 2000  # the fault is at the end
    assert rows["python_loop"]["patterns"] == 36
