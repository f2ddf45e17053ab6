"""corpus/build_manifest.py and the committed manifest it writes."""

import hashlib
import importlib.util
from pathlib import Path

import yaml

from faultline.taxonomy import OUTCOMES

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("build_manifest", ROOT / "corpus" / "build_manifest.py")
build_manifest = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_manifest)


def _case(root: Path, name: str, text: bytes, **truth):
    d = root / name
    d.mkdir(parents=True)
    (d / "log.txt").write_bytes(text)
    (d / "truth.yaml").write_text(yaml.safe_dump({"outcome_category": "cuda_oom", "source_url": f"https://x/{name}",
                                                  **truth}))


def test_manifest_records_digests_and_keeps_cases_missing_from_the_folder(tmp_path):
    _case(tmp_path, "A-002", b"CUDA out of memory\n")
    _case(tmp_path, "A-001", b"\xff\xfe not utf-8\n", culprit="rank 3")
    previous = [{"id": "A-001", "split": "dev", "outcome_category": "healthy"},
                {"id": "A-000", "split": "test", "outcome_category": "unknown"}]
    rows = build_manifest.manifest(tmp_path, previous)
    assert [r["id"] for r in rows] == ["A-000", "A-001", "A-002"]
    a1 = rows[1]
    assert a1["outcome_category"] == "cuda_oom" and a1["culprit"] == "rank 3"   # the folder's label wins
    assert a1["digests"]["log.txt"] == {"bytes": 13, "sha256": hashlib.sha256(b"\xff\xfe not utf-8\n").hexdigest()}
    assert rows[0] == previous[1]                                                 # kept as it was


def test_committed_manifest_is_well_formed():
    cases = yaml.safe_load((ROOT / "corpus" / "real-cases.yaml").read_text())["cases"]
    ids = [c["id"] for c in cases]
    assert len(ids) == len(set(ids)) and len(cases) >= 250
    for c in cases:
        assert c["split"] in ("dev", "test") and c["source_url"].startswith("http"), c["id"]
        assert c["outcome_category"] in OUTCOMES, c["id"]
        assert c["files"], c["id"]
        for name, dg in (c.get("digests") or {}).items():
            assert name in c["files"] and len(dg["sha256"]) == 64, c["id"]
