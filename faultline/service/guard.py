"""The action guard between a verdict and a recovery system's action (docs/service.md, "Acting on a verdict").

`recommended_action` of a session's attribution is `human_review` unless the verdict is unambiguous, of
high confidence, and (for actions that take hardware out of service: drain_node, reset_gpu,
restart_excluding) within fleet budgets: at most `per_cluster_hour` nodes per cluster in any hour, at
most `per_job` nodes of one job, never more than `max_fraction` of the job's nodes. When a check fails
the action says which and why, and keeps the engine's targets for the person who reviews.

Approved node actions are recorded in the session store's DuckDB (`drains`: cluster, job, node,
session, time), so budgets hold across restarts and every client. A node approved again for the same
session is not counted twice (re-attributing a session never spends more budget).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from faultline.taxonomy import NODE_ACTIONS


@dataclass(frozen=True)
class Budgets:
    per_cluster_hour: int = 4
    per_job: int = 2
    max_fraction: float = 0.25
    min_confidence: str = "high"


def _review(engine: dict, why: str, checks: list[dict]) -> dict:
    return {"action": "human_review", "targets": engine.get("targets") or [],
            "reason": f"{why}; the engine proposed {engine.get('action')}",
            "guard": {"approved": False, "engine_action": engine, "checks": checks}}


class ActionGuard:
    def __init__(self, store, budgets: Budgets = Budgets()):
        self.store, self.budgets = store, budgets

    def __call__(self, d: dict, nodes: list[str], session_id: str, n: int, final: bool) -> dict:
        engine = d.get("recommended_action") or {"action": "human_review", "targets": [], "reason": ""}
        b = self.budgets
        checks: list[dict] = []
        if engine["action"] in ("human_review", "no_action"):
            return {**engine, "guard": {"approved": engine["action"] == "no_action", "engine_action": engine,
                                        "checks": checks}}
        checks.append({"check": "unambiguous", "ok": not d.get("ambiguous")})
        if d.get("ambiguous"):
            return _review(engine, "the verdict is ambiguous", checks)
        checks.append({"check": "confidence", "ok": d.get("confidence") == b.min_confidence,
                       "value": d.get("confidence"), "needs": b.min_confidence})
        if d.get("confidence") != b.min_confidence:
            return _review(engine, f"confidence is {d.get('confidence')}, an automatic action needs {b.min_confidence}",
                           checks)
        if engine["action"] not in NODE_ACTIONS:
            return {**engine, "guard": {"approved": True, "engine_action": engine, "checks": checks}}
        targets = sorted(set(engine.get("targets") or []))
        job_nodes = set(nodes) | set(d.get("culprit", {}).get("nodes") or []) | set(d.get("affected", {}).get("nodes") or [])
        checks.append({"check": "per_job", "ok": len(targets) <= b.per_job, "value": len(targets), "limit": b.per_job})
        if len(targets) > b.per_job:
            return _review(engine, f"{len(targets)} nodes exceed the budget of {b.per_job} per job", checks)
        fraction = len(targets) / max(1, len(job_nodes))
        checks.append({"check": "fraction_of_job", "ok": fraction <= b.max_fraction, "value": round(fraction, 3),
                       "limit": b.max_fraction, "job_nodes": len(job_nodes)})
        if fraction > b.max_fraction:
            return _review(engine, f"{len(targets)} of the job's {len(job_nodes)} node(s) is over the budget of "
                                   f"{b.max_fraction:g} of a job's nodes", checks)
        ok, used = self.store.spend_drains(d["cluster"], d["job_id"], session_id, targets, engine["action"],
                                           b.per_cluster_hour, timedelta(hours=1))
        checks.append({"check": "per_cluster_hour", "ok": ok, "value": used, "limit": b.per_cluster_hour})
        if not ok:
            return _review(engine, f"cluster {d['cluster']} already had {used} node action(s) in the last hour; "
                                   f"the budget is {b.per_cluster_hour}", checks)
        return {**engine, "guard": {"approved": True, "engine_action": engine, "checks": checks}}
