"""Phase 5, report: evidence selection, root-cause sentence, recommended action, coverage.

Selection is vectorized over all jobs; only the final shaping into one JSON object per
job walks the (already tiny) per-job results.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone

import polars as pl

from faultline.rules.extract import KEY
from faultline.taxonomy import NODE_ACTIONS

EVIDENCE_COLS = ["rule_id", "symptom", "role", "source", "node", "rank", "gpu", "ts", "file", "seq", "line"]
_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class ReportConfig:
    max_drain: int = 2  # never drain more than this many nodes for one job
    evidence_per_job: int = 6
    max_line_chars: int = 400


def select_evidence(refined: pl.DataFrame, verdict: pl.DataFrame, cfg: ReportConfig) -> pl.DataFrame:
    """The few lines that decide each job: the winning cause first (one per node, earliest),
    then what confirms it, then what the victims printed. Returns key + list of structs."""
    active = refined.filter(pl.col("superseded_by").is_null() & (pl.col("role") != "context"))
    win = verdict.select(*KEY, win_outcome="outcome", win_role="role")
    rows = active.join(win, on=KEY).with_columns(
        kind=pl.when((pl.col("outcome") == pl.col("win_outcome")) & (pl.col("role") == pl.col("win_role"))).then(0)
        .when((pl.col("outcome") == pl.col("win_outcome")) & (pl.col("role") == "confirmation")).then(1)
        .when(pl.col("role").is_in(["root", "confirmation"])).then(2)
        .when(pl.col("role") == "cascade").then(3).otherwise(4))
    rows = rows.sort([*KEY, "kind", "ts", "file", "seq"], nulls_last=True)
    # One line per (kind, node, symptom) keeps 64 identical timeouts from crowding out the cause.
    rows = rows.unique(subset=[*KEY, "kind", "node", "symptom"], keep="first", maintain_order=True)
    rows = rows.with_columns(n=pl.int_range(pl.len()).over(KEY)).filter(pl.col("n") < cfg.evidence_per_job)
    rows = rows.with_columns(line=pl.col("line").str.slice(0, cfg.max_line_chars))
    return rows.group_by(KEY, maintain_order=True).agg(
        evidence=pl.struct(EVIDENCE_COLS), first_summary=pl.col("summary").first(),
        first_captures=pl.col("captures").first(), first_rule=pl.col("rule_id").first())


def candidate_lists(refined: pl.DataFrame, cand: pl.DataFrame) -> pl.DataFrame:
    """For ambiguous jobs: each competing cause with its nodes and its first line."""
    amb = cand.filter(pl.col("ambiguous") & ((pl.col("rank_in_job") == 1) | pl.col("close")))
    first_line = (refined.filter(pl.col("superseded_by").is_null())
                  .sort([*KEY, "ts", "file", "seq"], nulls_last=True)
                  .group_by([*KEY, "outcome", "role"], maintain_order=True)
                  .agg(pl.struct(EVIDENCE_COLS).first().alias("first")))
    amb = amb.join(first_line, on=[*KEY, "outcome", "role"], how="left")
    return amb.sort([*KEY, "rank_in_job"]).group_by(KEY, maintain_order=True).agg(
        candidates=pl.struct("outcome", "domain", "nodes", pl.col("p").alias("priority"), "first"))


def _fill(template: str, captures: dict, fallback: str) -> str:
    if not template:
        return fallback
    return _FIELD.sub(lambda m: str(captures.get(m.group(1)) if captures.get(m.group(1)) is not None else "?"),
                      template)


def _evidence_row(e: dict) -> dict:
    ts = e.get("ts")
    return {"rule_id": e["rule_id"], "symptom": e["symptom"], "role": e["role"], "source": e["source"],
            "node": e["node"], "rank": e["rank"], "gpu": e["gpu"],
            "ts": ts.isoformat().replace("+00:00", "Z") if ts else None,
            "file": e["file"], "line_no": (e["seq"] + 1) if e["seq"] is not None else None, "line": e["line"]}


def _action(v: dict, cfg: ReportConfig) -> dict:
    nodes = v["culprit"]["nodes"]
    if v["ambiguous"]:
        return {"action": "human_review", "targets": [], "reason": "more than one cause fits; see candidates"}
    if v["outcome"] == "healthy":
        return {"action": "no_action", "targets": [], "reason": "nothing points to a failure"}
    if v["outcome"] == "unknown":
        return {"action": "human_review", "targets": [], "reason": "failed, but no rule names a cause"}
    action = v["_rule_action"] or ("restart" if v["domain"] in ("network", "hardware", "infrastructure") else "fix_and_resubmit")
    if action in NODE_ACTIONS:
        if v["domain"] in ("workload", "software", "scheduler") or not nodes:
            action = "fix_and_resubmit" if v["domain"] in ("workload", "software") else "restart"
        elif len(nodes) > cfg.max_drain:
            return {"action": "human_review", "targets": nodes,
                    "reason": f"{len(nodes)} culprit nodes exceeds the limit of {cfg.max_drain} per job"}
        elif v["confidence"] == "low":
            return {"action": "human_review", "targets": nodes, "reason": "low confidence: confirm before draining"}
    targets = nodes if action in NODE_ACTIONS else []
    reasons = {
        "drain_node": "hardware or fabric fault on the culprit node(s)",
        "reset_gpu": "GPU fault that a reset clears",
        "restart_excluding": "restart without the culprit node(s)",
        "fix_and_resubmit": "the job itself must change (workload, code or configuration)",
        "restart": "transient or external cause: a restart is expected to succeed",
        "no_action": "nothing to repair",
        "human_review": "the rule asks for a person to look",
    }
    return {"action": action, "targets": targets, "reason": reasons[action]}


def _root_cause(v: dict, row: dict, inferred: list[int]) -> str:
    caps = json.loads(row.get("first_captures") or "{}") if row else {}
    caps = {**caps, "node": (v["culprit"]["nodes"] or [None])[0], "rank": (v["culprit"]["ranks"] or [None])[0]}
    sentence = _fill(row.get("first_summary") or "", caps, "") if row else ""
    if not sentence:
        sentence = {"healthy": "No failure signature: the job looks healthy.",
                    "unknown": "The job failed, but no rule matched a cause."}.get(
            v["outcome"], f"{v['outcome'].replace('_', ' ')} (rule {v.get('_rule_id')})")
    where = []
    if v["culprit"]["nodes"]:
        where.append("node " + ", ".join(v["culprit"]["nodes"]))
    if v["culprit"]["ranks"]:
        where.append("rank " + ", ".join(map(str, v["culprit"]["ranks"])))
    if v["culprit"]["local_ranks"]:
        where.append("local rank " + ", ".join(map(str, v["culprit"]["local_ranks"])))
    if v["culprit"]["gpu_pci"]:
        where.append("GPU " + ", ".join(v["culprit"]["gpu_pci"]))
    silent = ", ".join(map(str, inferred))
    if v["_inference"] == "silent_seen":
        sentence += f"; rank {silent} is the only rank that did not report the timeout"
    elif v["_inference"] == "silent_unseen":
        sentence += f"; rank {silent} printed nothing at all: a hang there or a lost node"
    elif v["_inference"] == "laggard":
        sentence += "; the culprit lags: lowest last completed (or last enqueued) collective"
    elif v["_inference"] == "odd_op":
        sentence += f"; rank {silent} was in another collective at the same SeqNum: out of step (desync)"
    elif v["_inference"] == "ahead":
        sentence += f"; rank {silent} had gone past that collective into another one: out of step (desync)"
    elif where and not v["ambiguous"]:
        sentence += f" (culprit: {'; '.join(where)})"
    return sentence[0].upper() + sentence[1:] if sentence else sentence


def build_diagnoses(verdict: pl.DataFrame, refined: pl.DataFrame, cand: pl.DataFrame, stats: pl.DataFrame,
                    coverage: pl.DataFrame, ruleset_meta: dict, cfg: ReportConfig = ReportConfig(),
                    diagnosed_at: str | None = None) -> list[dict]:
    ev = select_evidence(refined, verdict, cfg)
    cl = candidate_lists(refined, cand)
    seen = (stats.group_by(KEY).agg(all_nodes=pl.col("node").drop_nulls().unique().sort(),
                                    all_ranks=pl.col("rank").drop_nulls().unique().sort()))
    sym_nodes = (refined.group_by(KEY).agg(sym_nodes=pl.col("node").drop_nulls().unique().sort(),
                                           sym_ranks=pl.col("rank").drop_nulls().unique().sort()))
    cov = coverage.group_by(KEY, maintain_order=True).agg(coverage=pl.struct("source", "status", "rows", "reason"))
    table = (verdict.join(ev, on=KEY, how="left").join(cl, on=KEY, how="left").join(seen, on=KEY, how="left")
             .join(sym_nodes, on=KEY, how="left").join(cov, on=KEY, how="left").sort(KEY))
    diagnosed_at = diagnosed_at or datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    out = []
    for row in table.iter_rows(named=True):  # shaping the final, per-job JSON objects
        culprit = {"nodes": row["culprit_nodes"], "ranks": row["culprit_ranks"], "gpus": row["culprit_gpus"],
                   "gpu_pci": row["culprit_gpu_pci"], "local_ranks": row["culprit_local_ranks"]}
        if row["ambiguous"]:
            # Unsure of the cause; sure of the place only if every candidate names the same node(s).
            places = {tuple(c["nodes"] or ()) for c in row["candidates"] or []}
            agreed = list(places.pop()) if len(places) == 1 and row["inference"] != "silent_unseen" else []
            culprit = {"nodes": agreed, "ranks": [], "gpus": [], "gpu_pci": [], "local_ranks": []}
        nodes = sorted(set(row["all_nodes"] or []) | set(row["sym_nodes"] or []))
        ranks = sorted(set(row["all_ranks"] or []) | set(row["sym_ranks"] or []))
        v = {
            "cluster": row["cluster"], "job_id": row["job_id"], "attempt": row["attempt"],
            "outcome": row["outcome"], "domain": row["domain"] or "unknown",
            "root_cause": "", "culprit": culprit,
            "affected": {"nodes": [n for n in nodes if n not in culprit["nodes"]],
                         "ranks": [r for r in ranks if r not in culprit["ranks"]]},
            "ambiguous": bool(row["ambiguous"]),
            "candidates": [],
            "confidence": row["confidence"],
            "confidence_reason": row["confidence_reason"],
            "evidence": [_evidence_row(e) for e in (row["evidence"] or [])],
            "_rule_action": row["action"], "_rule_id": row["rule_id"], "_inference": row["inference"],
        }
        if row["ambiguous"]:
            v["candidates"] = [{
                "outcome": c["outcome"], "domain": c["domain"],
                "culprit": {"nodes": c["nodes"] or [], "ranks": [], "gpus": [], "gpu_pci": [], "local_ranks": []},
                "priority": c["priority"],
                "evidence": [_evidence_row(c["first"])] if c["first"] else [],
            } for c in (row["candidates"] or [])]
            if row["inference"] == "silent_unseen":
                v["candidates"] = [
                    {"outcome": "nccl_timeout_hang", "domain": "unknown",
                     "culprit": {"nodes": [], "ranks": row["culprit_ranks"], "gpus": [], "gpu_pci": [], "local_ranks": []},
                     "priority": None, "evidence": v["evidence"][:1]},
                    {"outcome": "node_failure", "domain": "infrastructure",
                     "culprit": {"nodes": [], "ranks": row["culprit_ranks"], "gpus": [], "gpu_pci": [], "local_ranks": []},
                     "priority": None, "evidence": []},
                ]
        v["root_cause"] = _root_cause(v, {"first_summary": row["first_summary"], "first_captures": row["first_captures"]}
                                      if row["first_rule"] else {}, row["culprit_ranks"])
        v["recommended_action"] = _action(v, cfg)
        for k in ("_rule_action", "_rule_id", "_inference"):
            v.pop(k)
        v["coverage"] = row["coverage"] or []
        v["ruleset"] = ruleset_meta
        v["diagnosed_at"] = diagnosed_at
        out.append(v)
    return out
