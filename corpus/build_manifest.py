"""Write corpus/real-cases.yaml from a folder of labelled real-log cases (case/truth.yaml + logs).

The logs themselves are third-party text from public threads and logbooks and are not committed
(corpus/README.md says why); the manifest keeps, per case, where the log is (source_url, commit), the
label, and the split, so the set can be rebuilt and re-scored by anyone with the sources.

    python corpus/build_manifest.py /path/to/cases [corpus/real-cases.yaml] > new.yaml

Each file's size and sha256 are recorded, so a copy rebuilt from the sources can be checked byte for byte.
Given the current manifest, its cases that are not in the folder are kept as they are: a folder that
holds only part of the set (a machine that lost the copy, a partial restore) does not shrink the manifest;
and each case's `extract` recipe (how corpus/rebuild.py cuts it from its repository) is kept.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import yaml

from faultline.evaluate import case_dirs, read_truth, split_of

FIELDS = ("source_url", "commit", "title", "ecosystem", "outcome_category", "culprit", "confidence_of_label",
          "multi_node", "state", "root_cause", "notes")


def digest(path: Path) -> dict:
    data = path.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def manifest(root: Path, previous: list[dict] | None = None) -> list[dict]:
    rows = []
    kept = {r["id"]: r for r in previous or []}
    for case in case_dirs(root):
        truth, why = read_truth(case)
        if truth is None:
            print(f"left out: {why}", file=sys.stderr)
            continue
        row = {"id": case.name, "split": split_of(truth)}
        row |= {k: truth[k] for k in FIELDS if truth.get(k) is not None}
        files = sorted(p for p in case.iterdir() if p.name != "truth.yaml")
        row["files"] = [p.name for p in files]
        row["digests"] = {p.name: digest(p) for p in files}
        # How a committed file's copy is cut from its source (corpus/rebuild.py) is not in the folder:
        # keep the previous manifest's recipe, or the next rebuild would have to search for it again.
        if kept.get(case.name, {}).get("extract"):
            row["extract"] = kept[case.name]["extract"]
        rows.append(row)
    seen = {r["id"] for r in rows}
    rows += [r for r in previous or [] if r["id"] not in seen]
    return sorted(rows, key=lambda r: r["id"])


if __name__ == "__main__":
    old = yaml.safe_load(Path(sys.argv[2]).read_text())["cases"] if len(sys.argv) > 2 else None
    yaml.safe_dump({"cases": manifest(Path(sys.argv[1]), old)}, sys.stdout, sort_keys=False, allow_unicode=True, width=110)
