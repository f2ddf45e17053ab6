"""`faultline demo`: diagnose built-in failure scenarios end to end and show the verdicts.

The scenarios are written to disk as the log files real jobs leave behind, then read
back through the same collector and engine as `faultline diagnose`.
"""

from __future__ import annotations

import json
from pathlib import Path

from faultline.pipeline import diagnose_files
from faultline.render import render
from faultline.rules.model import Ruleset
from faultline.scenarios import all_scenarios


def _culprit_text(d: dict) -> str:
    c = d["culprit"]
    return ", ".join(c["nodes"]) or ", ".join(f"rank {r}" for r in c["ranks"]) or "-"


def run_demo(ruleset: Ruleset, data_dir: Path, show: str | None = "xid79-gpu-off-bus") -> int:
    root = data_dir / "demo" / "jobs"
    out = data_dir / "demo" / "diagnoses.jsonl"
    root.mkdir(parents=True, exist_ok=True)
    rows, right = [], 0
    with out.open("w", encoding="utf-8") as fh:
        for sc in all_scenarios():
            job = sc.write(root)
            d = diagnose_files([job], ruleset, job_id=sc.name, cluster="demo", state=sc.state)
            fh.write(json.dumps(d, default=str) + "\n")
            ok = d["outcome"] == sc.expect_outcome and _culprit_text(d) == (", ".join(sc.expect_culprit) or "-")
            right += ok
            rows.append((sc, d, ok))
    print(f"faultline demo: {len(rows)} jobs diagnosed with ruleset {ruleset.version} "
          f"({len(ruleset.rules)} rules)\n")
    print(f"  {'job':20} {'verdict':22} {'culprit':14} {'conf':7} {'action':17} expected")
    for sc, d, ok in rows:
        verdict = d["outcome"] + ("?" if d["ambiguous"] else "")
        print(f"  {sc.name:20} {verdict:22} {_culprit_text(d):14} {d['confidence']:7} "
              f"{d['recommended_action']['action']:17} {'ok' if ok else 'MISMATCH: ' + sc.expect_outcome}")
    print(f"\n  {right}/{len(rows)} verdicts match the injected faults")
    if show:
        d = next(d for sc, d, _ in rows if sc.name == show)
        print(f"\nOne verdict in full ({show}):\n")
        print(render(d))
    print(f"\nDiagnoses (JSON lines): {out}\nJob logs: {root}")
    return 0 if right == len(rows) else 1
