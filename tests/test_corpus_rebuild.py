"""corpus/rebuild.py: committed-file cases rebuilt from a git mirror and checked against their digests."""

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "corpus" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


rebuild = _load("rebuild")
build_manifest = _load("build_manifest")

LONG = b"".join(b"step %d loss 1.0\n" % i for i in range(200)) + b"RuntimeError: CUDA error: an illegal memory access\n"
BOOK = (b"# Logbook\n\nintro\n\n## 2024-01-02 NCCL hang\n\nIt hung:\n\n```\nwatchdog timeout\n```\n\n"
        b"### details\n\nmore\n\n## 2024-01-03 all fine\n\nok\n")
ERR = b"Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory.\n"
OUT = b"epoch 1\n"


def _sha(b: bytes) -> dict:
    return {"bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()}


def _mirror(tmp_path: Path) -> tuple[Path, str]:
    """A clone named OWNER+REPO under a mirrors folder, with one commit of known files."""
    repo = tmp_path / "mirrors" / "someone+logs"
    (repo / "run").mkdir(parents=True)
    (repo / "run" / "train.err").write_bytes(ERR)
    (repo / "run" / "train.out").write_bytes(OUT)
    (repo / "run" / "long.log").write_bytes(LONG)
    (repo / "notes.md").write_bytes(BOOK)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-qm", "logs"]):
        subprocess.run(["git", "-C", str(repo), *cmd], check=True, env=env, capture_output=True)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    return tmp_path / "mirrors", commit


def _case(cid, commit, path, files, digests, **extra):
    return {"id": cid, "split": "dev", "source_url": f"https://github.com/someone/logs/blob/{commit}/{path}",
            "commit": commit, "title": "t", "ecosystem": "pytorch", "outcome_category": "cuda_oom",
            "confidence_of_label": "high", "multi_node": False, "root_cause": "r", "files": files,
            "digests": digests, **extra}


def test_cut_and_section_are_pure():
    assert rebuild.cut(b"a\nb\nc\nd\n", 1, 2) == b"a\n[... cut ...]\nc\nd\n"
    part = rebuild.section(BOOK, "2024-01-02-nccl-hang")                     # by its anchor
    assert part.startswith(b"## 2024-01-02 NCCL hang\n") and b"### details" in part and b"all fine" not in part
    assert rebuild.section(BOOK, "## 2024-01-03 all fine") == b"## 2024-01-03 all fine\n\nok\n"
    assert rebuild.section(BOOK, "no such heading") is None
    assert rebuild.apply(LONG, {"lines": [2, 3]}) == b"step 1 loss 1.0\nstep 2 loss 1.0\n"


def test_rebuild_writes_cases_checks_digests_and_reports_a_mismatch(tmp_path, capsys):
    mirrors, commit = _mirror(tmp_path)
    cut = rebuild.cut(LONG, 5, 3)
    cases = [
        _case("F-001", commit, "run/train.err", ["train.err", "train.out"],
              {"train.err": _sha(ERR), "train.out": _sha(OUT)}),                       # whole + file beside it
        _case("F-002", commit, "run/long.log", ["log.txt"], {"log.txt": _sha(cut)},
              extract={"log.txt": {"head": 5, "tail": 3}}),                             # a recorded cut
        _case("F-003", commit, "notes.md#2024-01-02-nccl-hang", ["log.txt"],
              {"log.txt": _sha(rebuild.section(BOOK, "2024-01-02-nccl-hang"))}),        # a logbook entry
        _case("F-004", commit, "run/long.log", ["log.txt"], {"log.txt": _sha(b"not what is there\n")}),
        _case("FA-005", commit, "run/gone.log", ["log.txt"], {"log.txt": _sha(b"x\n")}, split="test"),
    ]
    manifest = tmp_path / "cases.yaml"
    manifest.write_text(yaml.safe_dump({"cases": cases}, sort_keys=False))
    out = tmp_path / "out"
    assert rebuild.main([str(mirrors), str(out), "--manifest", str(manifest)]) == 1

    assert (out / "f" / "F-001" / "train.err").read_bytes() == ERR
    assert (out / "f" / "F-001" / "train.out").read_bytes() == OUT
    assert (out / "f" / "F-002" / "log.txt").read_bytes() == cut
    assert (out / "f" / "F-003" / "log.txt").read_bytes().startswith(b"## 2024-01-02 NCCL hang")
    truth = yaml.safe_load((out / "f" / "F-001" / "truth.yaml").read_text())
    assert truth["outcome_category"] == "cuda_oom" and truth["commit"] == commit and "files" not in truth
    assert ("split" in truth) == (rebuild.split_of({"source_url": cases[0]["source_url"]}) != "dev")
    assert not (out / "fa" / "FA-005").exists()                  # a missing source leaves no half case

    report = json.loads((out / "rebuild-report.json").read_text())
    assert report["counts"] == {"exact": 3, "mismatch": 1, "missing": 1}
    assert report["cases"]["F-004"]["files"]["log.txt"].startswith("mismatch")
    assert report["cases"]["FA-005"]["files"]["log.txt"].startswith("missing")
    printed = capsys.readouterr().out
    assert "5 cases: 3 exact, 1 mismatch, 1 source missing" in printed and "F-004: log.txt mismatch" in printed


def test_search_finds_and_records_recipes_that_the_next_rebuild_uses(tmp_path):
    mirrors, commit = _mirror(tmp_path)
    cut = rebuild.cut(LONG, 7, 4)
    entry = rebuild.section(BOOK, "## 2024-01-03 all fine")
    block = b"watchdog timeout\n"
    cases = [_case("G-001", commit, "run/long.log", ["log.txt"], {"log.txt": _sha(cut)}),
             _case("G-002", commit, "notes.md", ["log.txt", "err.txt"],
                   {"log.txt": _sha(entry), "err.txt": _sha(ERR)}),
             _case("G-003", commit, "notes.md", ["log.txt"], {"log.txt": _sha(block)})]
    manifest = tmp_path / "cases.yaml"
    manifest.write_text(yaml.safe_dump({"cases": cases}, sort_keys=False))
    out = tmp_path / "out"
    assert rebuild.main([str(mirrors), str(out), "--manifest", str(manifest)]) == 1   # defaults miss
    assert rebuild.main([str(mirrors), str(out), "--manifest", str(manifest), "--search", "--record"]) == 0
    recorded = {c["id"]: c.get("extract") for c in yaml.safe_load(manifest.read_text())["cases"]}
    assert recorded["G-001"] == {"log.txt": {"head": 7, "tail": 4}}
    assert recorded["G-002"] == {"log.txt": {"section": "## 2024-01-03 all fine"},
                                 "err.txt": {"path": "run/train.err"}}
    assert recorded["G-003"] == {"log.txt": {"lines": [10, 10]}}
    again = tmp_path / "again"
    assert rebuild.main([str(mirrors), str(again), "--manifest", str(manifest)]) == 0   # no search now
    assert (again / "g" / "G-001" / "log.txt").read_bytes() == cut


def test_build_manifest_keeps_extract_recipes(tmp_path):
    case = tmp_path / "F-001"
    case.mkdir()
    (case / "log.txt").write_bytes(b"x\n")
    (case / "truth.yaml").write_text(yaml.safe_dump({"outcome_category": "cuda_oom", "source_url": "https://x/y"}))
    previous = [{"id": "F-001", "split": "dev", "extract": {"log.txt": {"head": 1, "tail": 1}}}]
    rows = build_manifest.manifest(tmp_path, previous)
    assert rows[0]["extract"] == {"log.txt": {"head": 1, "tail": 1}}
    assert "extract" not in build_manifest.manifest(tmp_path, None)[0]


if __name__ == "__main__":
    sys.exit(0)
