"""`faultline eval DIR`: verdicts against labelled cases (folders holding truth.yaml + logs).

Scores: outcome accuracy; culprit accuracy over cases whose truth names a culprit;
wrong blames (a confident culprit that is not the true one, a culprit on a healthy
job, or a node taken out of service where the truth blames no node); a confusion table.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

from faultline.pipeline import diagnose_files
from faultline.rules.model import Ruleset
from faultline.taxonomy import NODE_ACTIONS

TRUTH = "truth.yaml"


@dataclass
class CaseResult:
    case: str
    truth_outcome: str
    outcome: str
    ambiguous: bool
    confidence: str
    truth_culprit: str | None
    culprit: dict
    culprit_right: bool | None  # None: the truth names no culprit
    wrong_blame: bool
    action: str
    ecosystem: str = "-"
    split: str = "dev"

    @property
    def outcome_right(self) -> bool:
        return self.outcome == self.truth_outcome


_PCI = re.compile(r"\b(?:[0-9a-f]{4,8}:)?[0-9a-f]{2}:[0-9a-f]{2}(?:\.[0-7])?\b")


def _pci_key(addr: str) -> str:
    """`00000000:3B:00.0`, `0000:3b:00`, `3b:00.0` -> `3b:00` within domain `0000`: comparable."""
    parts = addr.lower().split(".")[0].split(":")
    domain = parts[0][-4:] if len(parts) == 3 else "0000"
    return f"{domain}:{parts[-2]}:{parts[-1]}"


def culprit_matches(truth: str, culprit: dict) -> bool:
    """Does the predicted culprit appear in the truth's culprit text (node name, rank, local rank, GPU)?"""
    text = truth.lower()
    for node in culprit.get("nodes") or []:
        n = node.lower().strip(".")
        if n and (n in text or n.split(".")[0] in text):
            return True
    # a task is a rank by another name: Slurm's task id is SLURM_PROCID, TF and JAX number processes as tasks;
    # torch_npu and HCCL print it as `RankID:3`; a truth quoting a line's `rank=0` means the same
    ranks = {int(x) for x in re.findall(r"\b(?:rank(?:_?id)?|task)\s*[:=]?\s*(\d+)", text)}
    local = {int(x) for x in re.findall(r"\blocal[ _]rank\s*[:=]?\s*(\d+)", text)}
    ranks |= local
    if ranks & set(culprit.get("ranks") or []) or local & set(culprit.get("local_ranks") or []):
        return True
    pci = {_pci_key(x) for x in _PCI.findall(text)}
    if pci & {_pci_key(x) for x in culprit.get("gpu_pci") or []}:
        return True
    # `GPU 1`, `GPU1`, `GPU:1` (TF's device name), `cuda:1` (a torch device); Ascend's `NPU 2`, `npu:2`,
    # `NPU device 1`
    gpus = {int(x) for x in re.findall(r"\b(?:gpu|cuda|npu)(?:\s+device)?\s*:?\s*(\d+)", text)}
    return bool(gpus & set(culprit.get("gpus") or []) and not culprit.get("nodes"))


def score_case(case: str, truth: dict, d: dict) -> CaseResult:
    t_out = truth.get("outcome_category") or truth.get("outcome")
    t_cul = truth.get("culprit")
    cul = d["culprit"]
    blamed = bool(cul["nodes"] or cul["ranks"] or cul["gpus"] or cul.get("gpu_pci") or cul.get("local_ranks"))
    confident = d["confidence"] in ("high", "medium")
    right = None if not t_cul else (blamed and culprit_matches(str(t_cul), cul))
    takes_node = d["recommended_action"]["action"] in NODE_ACTIONS
    # A rank-only verdict cannot be checked against a truth that names only a node (and vice versa):
    # a miss, not a wrong blame.
    text = str(t_cul or "").lower()
    truth_by_rank = re.search(r"\brank", text) is not None
    truth_by_rank_only = re.match(r"\W*(?:local[ _])?rank", text) is not None
    # likewise a node verdict against a truth that names only a GPU (`GPU 0000:0a:00.0`): the host of that
    # GPU is not in the truth, so naming a node is a miss, not a wrong blame
    truth_by_gpu_only = re.match(r"\W*(?:gpu|npu|cuda|device)\b", text) is not None and not re.search(r"\bnode\b|\bhost\b", text)
    comparable = ((bool(cul["ranks"]) and truth_by_rank) or (bool(cul["nodes"]) and not truth_by_rank_only
                                                            and not truth_by_gpu_only)
                  or (bool(cul.get("local_ranks")) and re.search(r"\blocal[ _]rank", text) is not None))
    wrong = blamed and (
        t_out == "healthy"
        or (bool(t_cul) and not right and confident and comparable)
        or (not t_cul and takes_node))
    return CaseResult(case, t_out, d["outcome"], d["ambiguous"], d["confidence"], t_cul, cul,
                      right, wrong, d["recommended_action"]["action"])


def case_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in Path(root).rglob(TRUTH))


TEST_SHARE = 30  # percent of sources held out as `test`


def split_of(truth: dict) -> str:
    """`dev` or `test`: the truth's own `split`, else fixed by its source, so every case of one thread
    or file falls on the same side and a case never moves (a hash of the source URL, not of the folder)."""
    if truth.get("split") in ("dev", "test"):
        return truth["split"]
    source = str(truth.get("source_url") or "").strip().lower().split("#")[0].rstrip("/")
    bucket = int(hashlib.sha256(source.encode()).hexdigest()[:8], 16) % 100
    return "test" if bucket < TEST_SHARE else "dev"


def read_truth(case: Path) -> tuple[dict | None, str | None]:
    """The case's truth, or why it cannot be used (unreadable YAML, no outcome)."""
    try:
        truth = yaml.safe_load((case / TRUTH).read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return None, f"{case / TRUTH}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if not isinstance(truth, dict) or not (truth.get("outcome_category") or truth.get("outcome")):
        return None, f"{case / TRUTH}: no outcome_category"
    return truth, None


def evaluate(root: Path, ruleset: Ruleset, split: str | None = None,
             problems: list[str] | None = None) -> list[CaseResult]:
    """Score every case under `root` (of one split, if given); cases whose truth cannot be read are
    left out and named in `problems`."""
    results = []
    for case in case_dirs(root):
        truth, why = read_truth(case)
        if truth is None:
            if problems is not None:
                problems.append(why)
            continue
        side = split_of(truth)
        if split and side != split:
            continue
        # The case's own job id when the truth gives one; never the folder name ("015" is not a Slurm id).
        job_id = str(truth.get("job_id") or f"case-{case.name}")
        # Nor a node: the corpus's folder name (`N-013`) is the harness's, and reads like an LSF host
        # (`n-62-20-2`). The case is read through a link named `case`, which names no host.
        with tempfile.TemporaryDirectory() as tmp:
            alias = Path(tmp) / "case"
            alias.symlink_to(case.resolve(), target_is_directory=True)
            d = diagnose_files([alias], ruleset, job_id=job_id, cluster="eval", state=truth.get("state", "UNKNOWN"))
        r = score_case(case.name, truth, d)
        r.ecosystem, r.split = str(truth.get("ecosystem") or "-"), side
        results.append(r)
    return results


def breakdown(results: list[CaseResult], by: str) -> list[str]:
    """Outcome / culprit / wrong-blame counts per value of `by` (ecosystem, truth_outcome)."""
    groups: dict[str, list[CaseResult]] = defaultdict(list)
    for r in results:
        groups[getattr(r, by)].append(r)
    lines = [f"{by:28} {'cases':>5} {'outcome':>8} {'culprit':>8} {'wrong':>5}"]
    for key in sorted(groups, key=lambda k: (-len(groups[k]), k)):
        g = groups[key]
        cul = [r for r in g if r.culprit_right is not None]
        lines.append(f"{key:28} {len(g):5} {sum(r.outcome_right for r in g):4}/{len(g):<3} "
                     f"{sum(bool(r.culprit_right) for r in cul):4}/{len(cul):<3} {sum(r.wrong_blame for r in g):5}")
    return lines


def summarize(results: list[CaseResult]) -> str:
    lines = [f"{'case':10} {'truth':28} {'verdict':28} {'conf':6} {'culprit':24} ok"]
    for r in results:
        cul = ",".join(r.culprit["nodes"]) or ",".join(f"r{x}" for x in r.culprit["ranks"]) or "-"
        mark = ("✓" if r.outcome_right else "✗") + ("" if r.culprit_right is None else (" c✓" if r.culprit_right else " c✗"))
        mark += " WRONG-BLAME" if r.wrong_blame else ""
        verdict = r.outcome + ("?" if r.ambiguous else "")
        lines.append(f"{r.case:10} {r.truth_outcome:28} {verdict:28} {r.confidence:6} {cul[:24]:24} {mark}")
    n = len(results)
    right = sum(r.outcome_right for r in results)
    with_cul = [r for r in results if r.culprit_right is not None]
    cul_right = sum(bool(r.culprit_right) for r in with_cul)
    wrong = sum(r.wrong_blame for r in results)
    lines.append("")
    lines.append(f"outcome accuracy: {right}/{n}" + (f" ({100 * right / n:.1f}%)" if n else ""))
    lines.append(f"culprit accuracy: {cul_right}/{len(with_cul)} (cases whose truth names a culprit)")
    lines.append(f"wrong blames: {wrong}")
    if len({r.ecosystem for r in results}) > 1:
        lines += ["", *breakdown(results, "ecosystem")]
    lines += ["", *breakdown(results, "truth_outcome")]
    conf = Counter((r.truth_outcome, r.outcome) for r in results if not r.outcome_right)
    if conf:
        lines.append("confusions (truth -> verdict):")
        for (t, v), k in sorted(conf.items()):
            lines.append(f"  {t} -> {v}: {k}")
    return "\n".join(lines)


def confusion_table(results: list[CaseResult]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for r in results:
        table.setdefault(r.truth_outcome, {}).setdefault(r.outcome, 0)
        table[r.truth_outcome][r.outcome] += 1
    return table


def fleet_scores(diagnoses: "pl.DataFrame", truth: "pl.DataFrame") -> dict:
    """Verdicts of the warehouse against a simulator's truth table, vectorized over all jobs.

    culprit right: some predicted culprit node is a true culprit node or hosts a true culprit rank (or,
    with no true nodes, a predicted rank is a true rank); wrong blame: a confident (high/medium) culprit node that is not a
    true culprit node, or any culprit on a job whose truth is healthy."""
    import polars as pl

    key = ["cluster", "job_id", "attempt"]
    # A culprit rank's node is the right place too (the simulator records it as culprit_rank_nodes).
    rank_nodes = (pl.col("culprit_rank_nodes") if "culprit_rank_nodes" in truth.columns
                  else pl.lit([], pl.List(pl.String)))
    t = truth.select(*key, t_outcome="outcome", t_nodes=pl.col("culprit_nodes").list.concat(rank_nodes).list.unique(),
                     t_ranks="culprit_ranks")
    j = diagnoses.select(*key, "outcome", "culprit_nodes", "culprit_ranks", "confidence", "ambiguous").join(
        t, on=key, how="inner")
    hit_node = pl.col("culprit_nodes").list.set_intersection("t_nodes").list.len() > 0
    hit_rank = pl.col("culprit_ranks").list.set_intersection("t_ranks").list.len() > 0
    has_truth = (pl.col("t_nodes").list.len() > 0) | (pl.col("t_ranks").list.len() > 0)
    confident = pl.col("confidence").is_in(["high", "medium"])
    blamed_nodes = pl.col("culprit_nodes").list.len() > 0
    j = j.with_columns(
        outcome_right=pl.col("outcome") == pl.col("t_outcome"),
        culprit_right=pl.when(has_truth).then(hit_node | ((pl.col("t_nodes").list.len() == 0) & hit_rank)),
        wrong_blame=(blamed_nodes & confident & ~pl.col("culprit_nodes").list.set_intersection("t_nodes")
                     .list.len().gt(0) & (pl.col("t_nodes").list.len() > 0))
        | ((pl.col("t_outcome") == "healthy") & (blamed_nodes | (pl.col("culprit_ranks").list.len() > 0))),
    )
    conf = (j.filter(~pl.col("outcome_right")).group_by("t_outcome", "outcome").len()
            .sort("len", descending=True))
    per_outcome = (j.group_by("t_outcome").agg(jobs=pl.len(), right=pl.col("outcome_right").sum())
                   .sort("jobs", descending=True))
    with_culprit = j.filter(pl.col("culprit_right").is_not_null())
    return {
        "jobs": j.height,
        "outcome_right": int(j["outcome_right"].sum()),
        "culprit_cases": with_culprit.height,
        "culprit_right": int(with_culprit["culprit_right"].sum()),
        "wrong_blames": int(j["wrong_blame"].sum()),
        "ambiguous": int(j["ambiguous"].sum()),
        "confusions": conf.rows(),
        "per_outcome": per_outcome.rows(),
        "wrong_blame_jobs": j.filter(pl.col("wrong_blame")).select(*key, "outcome", "t_outcome",
                                                                     "culprit_nodes", "t_nodes").rows(),
    }
