"""Write corpus/real-cases.yaml from a folder of labelled real-log cases (case/truth.yaml + logs).

The logs themselves are third-party text from public threads and logbooks and are not committed
(corpus/README.md says why); the manifest keeps, per case, where the log is (source_url, commit), the
label, and the split, so the set can be rebuilt and re-scored by anyone with the sources.

    python corpus/build_manifest.py /path/to/cases > corpus/real-cases.yaml
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from faultline.evaluate import case_dirs, read_truth, split_of

FIELDS = ("source_url", "commit", "title", "ecosystem", "outcome_category", "culprit", "confidence_of_label",
          "multi_node", "state", "root_cause", "notes")


def manifest(root: Path) -> list[dict]:
    rows = []
    for case in case_dirs(root):
        truth, why = read_truth(case)
        if truth is None:
            print(f"left out: {why}", file=sys.stderr)
            continue
        row = {"id": case.name, "split": split_of(truth)}
        row |= {k: truth[k] for k in FIELDS if truth.get(k) is not None}
        row["files"] = sorted(p.name for p in case.iterdir() if p.name != "truth.yaml")
        rows.append(row)
    return rows


if __name__ == "__main__":
    yaml.safe_dump({"cases": manifest(Path(sys.argv[1]))}, sys.stdout, sort_keys=False, allow_unicode=True, width=110)
