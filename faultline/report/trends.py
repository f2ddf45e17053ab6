"""Trend models over the `diagnoses` (and `symptoms`) warehouse tables (DESIGN.md "Flows": report).

Pure, vectorized Polars: frames in, frames out, no I/O and no Python loop over jobs.

* `node_day`      -> TABLES["trends_node_day"]: per cluster, UTC day of the job's end, node.
* `outcome_day`   -> TABLES["trends_outcome_day"]: per cluster, day, queue, outcome.
* `lemons`        repeat-offender nodes: culprit of >= k jobs in a window (node-fault domains only).
* `gpu_hours_lost_by_outcome`, `culprit_counts`, `coverage_summary`, `ambiguous_review`,
  `headline`: the smaller views the nightly report draws.

Conventions shared by every function:

* The input is a frame with the columns of TABLES["diagnoses"] (extra columns are ignored).
  It may hold several rulesets or re-diagnoses of one job; pass it through `current()` first
  (the report does) to keep one verdict per job attempt.
* "Day" is the UTC date of `end_time` (falling back to `diagnosed_at` when a job has no end).
* Ambiguous verdicts never count as culprit appearances: doubt must not build a node's record.
* A `healthy` verdict lost no GPU-hours.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl

from faultline.warehouse.schema import JOB_KEY, TABLES

# Domains whose culprit is the node itself (a workload culprit, e.g. a CUDA OOM on rank 2,
# is the job's fault, never the node's).
NODE_DOMAINS = ("hardware", "network", "infrastructure")
COVERAGE_STATUSES = ("ok", "empty", "error", "not_configured")

EVIDENCE_DTYPE = pl.List(pl.Struct({
    "rule_id": pl.String, "symptom": pl.String, "role": pl.String, "source": pl.String,
    "node": pl.String, "rank": pl.Int64, "ts": pl.String, "line": pl.String,
}))
COVERAGE_DTYPE = pl.List(pl.Struct({
    "source": pl.String, "status": pl.String, "rows": pl.Int64, "reason": pl.String,
}))
CANDIDATES_DTYPE = pl.List(pl.Struct({
    "outcome": pl.String, "domain": pl.String,
    "culprit": pl.Struct({"nodes": pl.List(pl.String), "ranks": pl.List(pl.Int64)}),
    "evidence": EVIDENCE_DTYPE,
}))
_ROLE_RANK = {"root": 0, "confirmation": 1, "cascade": 2, "teardown": 3, "context": 4}


def _conform(df: pl.DataFrame, table: str) -> pl.DataFrame:
    schema = TABLES[table]
    return df.select([pl.col(c).cast(t) for c, t in schema.items()])


def _day() -> pl.Expr:
    return pl.coalesce(pl.col("end_time"), pl.col("diagnosed_at")).dt.date().alias("date")


def current(diagnoses: pl.DataFrame, ruleset: str | None = None) -> pl.DataFrame:
    """One verdict per job attempt: of `ruleset` if given, else the newest `diagnosed_at`
    (ties broken by ruleset id, so the choice is deterministic)."""
    d = diagnoses if ruleset is None else diagnoses.filter(pl.col("ruleset") == ruleset)
    return (d.sort([*JOB_KEY, "diagnosed_at", "ruleset"], descending=[False, False, False, True, True],
                   nulls_last=True)
            .unique(subset=JOB_KEY, keep="first", maintain_order=True))


def parse_evidence(diagnoses: pl.DataFrame) -> pl.DataFrame:
    """The evidence JSON exploded: job key + position `i` + one column per evidence field."""
    return (diagnoses.select(*JOB_KEY, ev=pl.col("evidence").str.json_decode(EVIDENCE_DTYPE))
            .with_columns(i=pl.int_ranges(pl.col("ev").list.len()))
            .explode(["ev", "i"]).drop_nulls("ev").unnest("ev"))


# --------------------------------------------------------------------------- trends tables

def node_day(diagnoses: pl.DataFrame, symptoms: pl.DataFrame | None = None) -> pl.DataFrame:
    """TABLES["trends_node_day"]: per cluster, day and node, how often the node was the culprit
    (non-ambiguous verdicts), how often it only noticed (affected), how many symptom rows it
    produced in the day's diagnosed jobs, and the sorted outcomes of the jobs it was culprit of."""
    d = diagnoses.with_columns(_day())
    keys = ["cluster", "date", "node"]
    cul = (d.filter(~pl.col("ambiguous").fill_null(False))
           .select("cluster", "date", *JOB_KEY[1:], "outcome", node=pl.col("culprit_nodes").list.unique())
           .explode("node").drop_nulls("node")
           .group_by(keys).agg(times_culprit=pl.len(), outcomes=pl.col("outcome").unique().sort()))
    aff = (d.select("cluster", "date", node=pl.col("affected_nodes").list.unique())
           .explode("node").drop_nulls("node")
           .group_by(keys).agg(times_affected=pl.len()))
    out = cul.join(aff, on=keys, how="full", coalesce=True)
    if symptoms is not None and symptoms.height:
        sym = (symptoms.drop_nulls("node")
               .join(d.select(*JOB_KEY, "ruleset", "date"), on=[*JOB_KEY, "ruleset"], how="inner")
               .group_by(keys).agg(symptoms=pl.len()))
        out = out.join(sym, on=keys, how="full", coalesce=True)
    else:
        out = out.with_columns(symptoms=pl.lit(0, pl.Int64))
    out = out.with_columns(
        pl.col("times_culprit", "times_affected", "symptoms").fill_null(0),
        outcomes=pl.col("outcomes").fill_null(pl.lit([], pl.List(pl.String))),
    )
    return _conform(out, "trends_node_day").sort(keys)


def outcome_day(diagnoses: pl.DataFrame) -> pl.DataFrame:
    """TABLES["trends_outcome_day"]: per cluster, day, queue and outcome: jobs, GPU-hours lost
    (sum of `gpu_hours`; 0 for healthy verdicts) and how many of those verdicts are ambiguous."""
    out = (diagnoses.with_columns(_day(), lost=_lost())
           .group_by(["cluster", "date", "queue", "outcome"])
           .agg(jobs=pl.len(), gpu_hours_lost=pl.col("lost").sum(),
                ambiguous=pl.col("ambiguous").fill_null(False).sum()))
    return _conform(out, "trends_outcome_day").sort(["cluster", "date", "queue", "outcome"], nulls_last=True)


def _lost() -> pl.Expr:
    return (pl.when(pl.col("outcome") == "healthy").then(0.0)
            .otherwise(pl.col("gpu_hours").cast(pl.Float64).fill_null(0.0)))


def gpu_hours_lost_by_outcome(diagnoses: pl.DataFrame) -> pl.DataFrame:
    """outcome, jobs, ambiguous, gpu_hours_lost, share (of all GPU-hours lost); largest loss first."""
    out = (diagnoses.with_columns(lost=_lost())
           .group_by("outcome")
           .agg(jobs=pl.len(), ambiguous=pl.col("ambiguous").fill_null(False).sum().cast(pl.Int64),
                gpu_hours_lost=pl.col("lost").sum()))
    total = out["gpu_hours_lost"].sum() if out.height else 0.0
    return (out.with_columns(share=pl.col("gpu_hours_lost") / total if total else pl.lit(0.0))
            .with_columns(pl.col("jobs").cast(pl.Int64))
            .sort(["gpu_hours_lost", "jobs", "outcome"], descending=[True, True, False]))


# --------------------------------------------------------------------------- culprits and lemons

def _culprit_rows(diagnoses: pl.DataFrame, domains: tuple[str, ...] | None) -> pl.DataFrame:
    d = diagnoses.filter(~pl.col("ambiguous").fill_null(False))
    if domains is not None:
        d = d.filter(pl.col("domain").is_in(list(domains)))
    return (d.select(*JOB_KEY, "outcome", "domain", "evidence",
                     end_time=pl.coalesce(pl.col("end_time"), pl.col("diagnosed_at")),
                     node=pl.col("culprit_nodes").list.unique())
            .explode("node").drop_nulls("node"))


def culprit_counts(diagnoses: pl.DataFrame, domains: tuple[str, ...] | None = NODE_DOMAINS,
                   top: int | None = None) -> pl.DataFrame:
    """cluster, node, times_culprit (non-ambiguous verdicts of `domains`; None: every domain),
    outcomes (sorted, unique), most frequent first."""
    out = (_culprit_rows(diagnoses, domains)
           .group_by(["cluster", "node"])
           .agg(times_culprit=pl.len().cast(pl.Int64), outcomes=pl.col("outcome").unique().sort())
           .sort(["times_culprit", "cluster", "node"], descending=[True, False, False]))
    return out.head(top) if top is not None else out


def lemons(diagnoses: pl.DataFrame, window_days: float = 7, k: int = 3, *,
           now: datetime | None = None, domains: tuple[str, ...] = NODE_DOMAINS) -> pl.DataFrame:
    """Repeat offenders: nodes named culprit of at least `k` job attempts whose end (or, without
    one, diagnosis time) lies in (now - window_days, now], counting only non-ambiguous verdicts of
    `domains`.

    `now` defaults to the newest `end_time` in the frame, so the result depends on the data only.
    One row per (cluster, node): times_culprit, first_seen, last_seen, and aligned lists
    (one entry per job attempt, oldest first) job_ids, attempts, outcomes, evidence (the line that
    blames this node: its root/confirmation line if any, else its first line, else the job's
    first line) and evidence_rules.
    """
    cols = {"cluster": pl.String, "node": pl.String, "times_culprit": pl.Int64,
            "first_seen": TABLES["diagnoses"]["end_time"], "last_seen": TABLES["diagnoses"]["end_time"],
            "job_ids": pl.List(pl.String), "attempts": pl.List(pl.Int32), "outcomes": pl.List(pl.String),
            "evidence": pl.List(pl.String), "evidence_rules": pl.List(pl.String)}
    rows = _culprit_rows(diagnoses, domains).drop_nulls("end_time")
    if rows.height == 0:
        return pl.DataFrame(schema=cols)
    end = now if now is not None else rows["end_time"].max()
    start = end - timedelta(days=window_days)
    rows = rows.filter((pl.col("end_time") > start) & (pl.col("end_time") <= end))
    rows = rows.with_columns(n=pl.len().over(["cluster", "node"])).filter(pl.col("n") >= k)
    if rows.height == 0:
        return pl.DataFrame(schema=cols)
    # the evidence line that blames this node, chosen per (job attempt, node)
    ev = parse_evidence(rows.unique(JOB_KEY).select(*JOB_KEY, "evidence")).rename({"node": "ev_node"})
    pick = (rows.select(*JOB_KEY, "node").join(ev, on=JOB_KEY, how="inner")
            .with_columns(score=pl.when(pl.col("ev_node") == pl.col("node")).then(0).otherwise(10)
                          + pl.col("role").replace_strict(_ROLE_RANK, default=5, return_dtype=pl.Int32))
            .sort([*JOB_KEY, "node", "score", "i"])
            .unique([*JOB_KEY, "node"], keep="first")
            .select(*JOB_KEY, "node", ev_line="line", ev_rule="rule_id"))
    rows = rows.join(pick, on=[*JOB_KEY, "node"], how="left").sort(["end_time", "job_id", "attempt"])
    out = (rows.group_by(["cluster", "node"])
           .agg(times_culprit=pl.len(), first_seen=pl.col("end_time").min(), last_seen=pl.col("end_time").max(),
                job_ids=pl.col("job_id"), attempts=pl.col("attempt"), outcomes=pl.col("outcome"),
                evidence=pl.col("ev_line"), evidence_rules=pl.col("ev_rule")))
    return (out.select([pl.col(c).cast(t) for c, t in cols.items()])
            .sort(["times_culprit", "last_seen", "cluster", "node"], descending=[True, True, False, False]))


# --------------------------------------------------------------------------- report views

def coverage_summary(diagnoses: pl.DataFrame) -> pl.DataFrame:
    """Telemetry coverage: per source, how many diagnosed jobs had it ok / empty / error /
    not_configured (a job without a record for a source counts as not_configured), with shares."""
    n_jobs = diagnoses.height
    cov = (diagnoses.select(*JOB_KEY, c=pl.col("coverage").str.json_decode(COVERAGE_DTYPE))
           .explode("c").drop_nulls("c").unnest("c")
           .unique([*JOB_KEY, "source"], keep="first", maintain_order=True))
    counts = (cov.group_by("source").agg([(pl.col("status") == s).sum().cast(pl.Int64).alias(s)
                                          for s in COVERAGE_STATUSES]))
    counts = counts.with_columns(
        not_configured=pl.col("not_configured") + (n_jobs - pl.sum_horizontal(*COVERAGE_STATUSES)).clip(0))
    return (counts.with_columns(jobs=pl.lit(n_jobs, pl.Int64))
            .with_columns([(pl.col(s) / pl.col("jobs")).alias(f"{s}_share") for s in COVERAGE_STATUSES])
            .sort("source"))


def ambiguous_review(diagnoses: pl.DataFrame) -> pl.DataFrame:
    """Ambiguous verdicts awaiting a person: job key, end_time, queue, outcome, confidence_reason,
    candidates (list of {outcome, domain, nodes, line}) and the verdict's first evidence lines.
    Newest first."""
    amb = diagnoses.filter(pl.col("ambiguous").fill_null(False))
    base = amb.select(*JOB_KEY, "end_time", "queue", "outcome", "confidence_reason",
                      cand=pl.col("candidates").str.json_decode(CANDIDATES_DTYPE),
                      ev=pl.col("evidence").str.json_decode(EVIDENCE_DTYPE))
    return (base.with_columns(
        candidates=pl.col("cand").list.eval(pl.struct(
            outcome=pl.element().struct.field("outcome"), domain=pl.element().struct.field("domain"),
            nodes=pl.element().struct.field("culprit").struct.field("nodes"),
            ranks=pl.element().struct.field("culprit").struct.field("ranks"),
            line=pl.element().struct.field("evidence").list.first().struct.field("line"))),
        evidence=pl.col("ev").list.eval(pl.element().struct.field("line")),
        evidence_nodes=pl.col("ev").list.eval(pl.element().struct.field("node")),
    ).drop("cand", "ev").sort(["end_time", "cluster", "job_id"], descending=[True, False, False], nulls_last=True))


def headline(diagnoses: pl.DataFrame) -> dict:
    """The report's headline numbers as a dict of plain Python values."""
    d = diagnoses
    failed = d.filter(pl.col("outcome") != "healthy")
    ends = d["end_time"].drop_nulls()
    return {
        "jobs": d.height,
        "failed": failed.height,
        "healthy": d.height - failed.height,
        "ambiguous": int(d["ambiguous"].fill_null(False).sum()),
        "gpu_hours_lost": float(d.select(_lost()).to_series().sum() or 0.0),
        "clusters": d["cluster"].n_unique(),
        "culprit_nodes": culprit_counts(d).height,
        "first_end": ends.min() if len(ends) else None,
        "last_end": ends.max() if len(ends) else None,
    }
