"""What an operator does now: the drain/reset list and the failure rate with its denominator.

Pure Polars over the `diagnoses` frame (one verdict per job attempt: see `trends.current`), the
`jobs` table (the denominator) and `node_events` (whether a blamed node was drained since).
"""

from __future__ import annotations

import polars as pl

from faultline.report.trends import _ROLE_RANK, parse_evidence
from faultline.taxonomy import FAILED_STATES
from faultline.warehouse.schema import JOB_KEY, TABLES

NODE_ACTIONS = ("drain_node", "reset_gpu")  # strongest first
ACTION_COLUMNS = {"cluster": pl.String, "node": pl.String, "action": pl.String, "why": pl.String,
                  "outcomes": pl.List(pl.String), "jobs": pl.Int64, "job_ids": pl.List(pl.String),
                  "drain_node": pl.Int64, "reset_gpu": pl.Int64, "evidence": pl.String,
                  "first_seen": TABLES["diagnoses"]["end_time"], "last_seen": TABLES["diagnoses"]["end_time"],
                  "drained_at": TABLES["node_events"]["ts"], "state": pl.String}


def actions(diagnoses: pl.DataFrame, node_events: pl.DataFrame | None = None) -> pl.DataFrame:
    """The drain/reset list: one row per (cluster, node) that confident verdicts recommend draining or
    resetting, the strongest action first: why (the latest root cause), outcomes, jobs (and their ids),
    how often each action was recommended, the evidence line that blames the node (latest job), first
    and last seen, and from `node_events` whether the node was drained since it was first blamed
    (`state`: drained / back in service / not drained / no node events)."""
    d = diagnoses.filter(pl.col("action").is_in(list(NODE_ACTIONS)) & ~pl.col("ambiguous").fill_null(False))
    if d.height == 0:
        return pl.DataFrame(schema=ACTION_COLUMNS)
    rows = (d.select(*JOB_KEY, "outcome", "root_cause", "action", "evidence",
                     end_time=pl.coalesce(pl.col("end_time"), pl.col("diagnosed_at")),
                     node=pl.col("action_targets").list.unique())
            .explode("node").drop_nulls("node"))
    ev = parse_evidence(rows.unique(JOB_KEY).select(*JOB_KEY, "evidence")).rename({"node": "ev_node"})
    pick = (rows.select(*JOB_KEY, "node").join(ev, on=JOB_KEY, how="inner")
            .with_columns(score=pl.when(pl.col("ev_node") == pl.col("node")).then(0).otherwise(10)
                          + pl.col("role").replace_strict(_ROLE_RANK, default=5, return_dtype=pl.Int32))
            .sort([*JOB_KEY, "node", "score", "i"]).unique([*JOB_KEY, "node"], keep="first")
            .select(*JOB_KEY, "node", ev_line="line"))
    rows = rows.join(pick, on=[*JOB_KEY, "node"], how="left").sort(["end_time", "job_id", "attempt"])
    rank = pl.col("action").replace_strict({a: i for i, a in enumerate(NODE_ACTIONS)}, return_dtype=pl.Int32)
    out = (rows.group_by(["cluster", "node"])
           .agg(action=pl.col("action").sort_by(rank).first(), why=pl.col("root_cause").last(),
                outcomes=pl.col("outcome").unique().sort(), jobs=pl.len(), job_ids=pl.col("job_id"),
                drain_node=(pl.col("action") == "drain_node").sum(), reset_gpu=(pl.col("action") == "reset_gpu").sum(),
                evidence=pl.col("ev_line").drop_nulls().last(), first_seen=pl.col("end_time").min(),
                last_seen=pl.col("end_time").max()))
    if node_events is not None and node_events.height:
        ev = (node_events.join(out.select("cluster", "node", "first_seen"), on=["cluster", "node"])
              .filter(pl.col("ts") >= pl.col("first_seen")).sort("ts")
              .group_by(["cluster", "node"])
              .agg(drained_at=pl.col("ts").filter(pl.col("kind") == "drain").last(),
                   last_kind=pl.col("kind").last()))
        out = out.join(ev, on=["cluster", "node"], how="left").with_columns(
            state=pl.when(pl.col("drained_at").is_null()).then(pl.lit("not drained"))
            .when(pl.col("last_kind") == "resume").then(pl.lit("back in service"))
            .otherwise(pl.lit("drained")))
    else:
        out = out.with_columns(drained_at=pl.lit(None, ACTION_COLUMNS["drained_at"]), state=pl.lit("no node events"))
    return (out.with_columns(_r=rank).sort(["_r", "jobs", "last_seen", "cluster", "node"],
                                           descending=[False, True, True, False, False])
            .select([pl.col(c).cast(t) for c, t in ACTION_COLUMNS.items()]))


def failure_rate(jobs: pl.DataFrame, diagnoses: pl.DataFrame) -> dict:
    """Failures over all job attempts that ended (the denominator), and their share of GPU-hours."""
    total = jobs.height
    failed = jobs.filter(pl.col("state").is_in(list(FAILED_STATES))).height
    hours = (pl.col("num_gpus").cast(pl.Float64) * (pl.col("end_time") - pl.col("start_time")).dt.total_seconds() / 3600)
    gh_all = float(jobs.select(hours.fill_null(0).sum()).item() or 0.0) if total else 0.0
    gh_failed = float(diagnoses.filter(pl.col("outcome") != "healthy")["gpu_hours"].fill_null(0).sum() or 0.0)
    return {"jobs": total, "failed": failed, "rate": failed / total if total else 0.0,
            "gpu_hours": gh_all, "gpu_hours_failed": gh_failed,
            "gpu_hours_share": gh_failed / gh_all if gh_all else 0.0}
