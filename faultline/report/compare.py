"""The last 24 hours against the previous 7 days: is anything failing more (or less) than usual?

Three views, one frame (pure Polars + a vectorized binomial tail per row; no I/O):

* outcome  jobs with that verdict / every job attempt that ended in the period;
* cluster  failed job attempts (scheduler state) / job attempts of the cluster;
* node     confident culprit appearances of the node (hardware, network, infrastructure domains, as
           the lemons count them) / job attempts that ran on the node (the `jobs.nodes` list).

The rule that flags a change, stated once (the report prints it): failures are counted as Poisson
events over the job attempts at risk; conditional on the total k = k_recent + k_base, k_recent is
Binomial(k, n_recent / (n_recent + n_base)) if the rate did not change (the exact conditional test of
two Poisson rates). A row is flagged **up** when that one-sided p-value is below ALPHA and the last
24 h hold at least MIN_COUNT failures (one or two events are never an alarm), **down** when the
other tail is below ALPHA. No baseline jobs: no change and no flag, said as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import polars as pl

from faultline.report.trends import NODE_DOMAINS
from faultline.taxonomy import FAILED_STATES

RECENT = timedelta(hours=24)
BASELINE = timedelta(days=7)
ALPHA = 0.01
MIN_COUNT = 3
RULE = (f"flagged when the exact conditional binomial test of the two rates gives p < {ALPHA:g} "
        f"(one-sided) and, for a rise, the last 24 h hold at least {MIN_COUNT} failures")

COLUMNS = {"kind": pl.String, "cluster": pl.String, "key": pl.String,
           "recent": pl.Int64, "recent_jobs": pl.Int64, "recent_rate": pl.Float64,
           "base": pl.Int64, "base_jobs": pl.Int64, "base_rate": pl.Float64,
           "change": pl.Float64, "p_up": pl.Float64, "p_down": pl.Float64, "flag": pl.String}
_KINDS = {"outcome": 0, "cluster": 1, "node": 2}


@dataclass
class Comparison:
    rows: pl.DataFrame        # compare()'s frame
    now: datetime             # end of the last 24 h
    baseline_days: float      # how much of the 7-day baseline holds data
    recent_jobs: int          # job attempts that ended in the last 24 h


def binom_tails(k: int, n: int, p: float) -> tuple[float, float]:
    """(P(X >= k), P(X <= k)) for X ~ Binomial(n, p), in log space (exact for any n)."""
    if n <= 0:
        return 1.0, 1.0
    if p <= 0.0:
        return (1.0 if k <= 0 else 0.0), 1.0
    if p >= 1.0:
        return 1.0, (1.0 if k >= n else 0.0)
    i = np.arange(n + 1, dtype=np.float64)
    # log C(n, i) by the running product C(n, i) = C(n, i-1) (n - i + 1) / i
    log_c = np.concatenate(([0.0], np.cumsum(np.log((n - i[1:] + 1) / i[1:]))))
    log_pmf = log_c + i * np.log(p) + (n - i) * np.log1p(-p)
    pmf = np.exp(log_pmf - log_pmf.max())
    total = pmf.sum()
    return float(min(1.0, pmf[k:].sum() / total)), float(min(1.0, pmf[: k + 1].sum() / total))


def anchor(jobs: pl.DataFrame) -> datetime | None:
    """The default "now": the newest job end in the data, so the result depends on the data only
    (the nightly report passes the end of its last day instead)."""
    ends = jobs["end_time"].drop_nulls() if jobs.height else pl.Series([], dtype=pl.Datetime)
    return ends.max() if len(ends) else None


def baseline_days(jobs: pl.DataFrame, now: datetime) -> float:
    """How much of the 7-day baseline the data covers (days from its first job end to its end)."""
    t = jobs.filter((pl.col("end_time") > now - RECENT - BASELINE) & (pl.col("end_time") <= now - RECENT))["end_time"]
    return 0.0 if t.is_empty() else round((now - RECENT - t.min()).total_seconds() / 86400, 1)


def _period(now: datetime) -> pl.Expr:
    t = pl.col("end_time")
    return (pl.when((t > now - RECENT) & (t <= now)).then(pl.lit("recent"))
            .when((t > now - RECENT - BASELINE) & (t <= now - RECENT)).then(pl.lit("base"))
            .otherwise(pl.lit(None, pl.String)))


def _counts(events: pl.DataFrame, jobs: pl.DataFrame, keys: list[str], kind: str) -> pl.DataFrame:
    """events: one row per (period, *keys) failure; jobs: (period, *keys, jobs at risk)
    -> one row per key with both periods side by side."""
    ev = events.group_by(["period", *keys]).agg(n=pl.len())
    both = (jobs.join(ev, on=["period", *keys], how="full", coalesce=True, nulls_equal=True)
            .with_columns(pl.col("n", "jobs").fill_null(0)))
    wide = (both.filter(pl.col("period") == "recent").select(*keys, recent="n", recent_jobs="jobs")
            .join(both.filter(pl.col("period") == "base").select(*keys, base="n", base_jobs="jobs"),
                  on=keys, how="full", coalesce=True, nulls_equal=True)
            .with_columns(pl.col("recent", "recent_jobs", "base", "base_jobs").fill_null(0)))
    if "cluster" not in keys:
        wide = wide.with_columns(cluster=pl.lit(None, pl.String))
    return wide.with_columns(kind=pl.lit(kind), key=pl.col(keys[-1]))


def _test(rows: pl.DataFrame) -> pl.DataFrame:
    """Rates, change and the flag of every row (the module docstring's rule)."""
    tails = [binom_tails(k1, k1 + k0, (n1 / (n1 + n0)) if n1 + n0 else 0.0)
             for k1, k0, n1, n0 in rows.select("recent", "base", "recent_jobs", "base_jobs").iter_rows()]
    p_up = [t[0] for t in tails]
    p_down = [t[1] for t in tails]
    r1 = pl.col("recent") / pl.col("recent_jobs")
    r0 = pl.col("base") / pl.col("base_jobs")
    no_base = (pl.col("base_jobs") == 0) | (pl.col("recent_jobs") == 0)
    return rows.with_columns(
        recent_rate=pl.when(pl.col("recent_jobs") > 0).then(r1),
        base_rate=pl.when(pl.col("base_jobs") > 0).then(r0),
        p_up=pl.Series(p_up, dtype=pl.Float64), p_down=pl.Series(p_down, dtype=pl.Float64),
    ).with_columns(
        change=pl.when(~no_base & (pl.col("base") > 0)).then(pl.col("recent_rate") / pl.col("base_rate")),
        flag=pl.when(no_base).then(pl.lit(""))
        .when((pl.col("p_up") < ALPHA) & (pl.col("recent") >= MIN_COUNT)).then(pl.lit("up"))
        .when(pl.col("p_down") < ALPHA).then(pl.lit("down"))
        .otherwise(pl.lit("")),
    )


def compare(jobs: pl.DataFrame, diagnoses: pl.DataFrame, now: datetime | None = None) -> pl.DataFrame:
    """One row per outcome, cluster and blamed node: counts and rates in the last 24 h up to `now`
    (default: `anchor(jobs)`) and in the 7 days before, the change (ratio of rates) and the flag.
    `jobs` is the jobs table (the denominator), `diagnoses` one verdict per job attempt."""
    now = now if now is not None else anchor(jobs)
    if now is None:
        return pl.DataFrame(schema=COLUMNS)
    j = jobs.with_columns(period=_period(now)).drop_nulls("period")
    d = (diagnoses.join(j.select("cluster", "job_id", "attempt", "period"), on=["cluster", "job_id", "attempt"])
         if diagnoses.height else diagnoses.with_columns(period=pl.lit(None, pl.String)))
    failed = d.filter(pl.col("outcome") != "healthy")
    # every outcome is at risk in every job attempt of the period
    per_period = j.group_by("period").agg(jobs=pl.len())
    outcomes = _counts(failed.select("period", "outcome"),
                       per_period.join(failed.select("outcome").unique(), how="cross"), ["outcome"], "outcome")
    clusters = _counts(j.filter(pl.col("state").is_in(list(FAILED_STATES))).select("period", "cluster"),
                       j.group_by(["period", "cluster"]).agg(jobs=pl.len()), ["cluster"], "cluster")
    blamed = (d.filter(~pl.col("ambiguous").fill_null(False) & pl.col("domain").is_in(list(NODE_DOMAINS)))
              .select("period", "cluster", node=pl.col("culprit_nodes").cast(pl.List(pl.String)).list.unique())
              .explode("node").drop_nulls("node"))
    # a node is at risk in every job attempt that ran on it; only blamed nodes are listed
    node_jobs = (j.select("period", "cluster", node=pl.col("nodes").cast(pl.List(pl.String)).list.unique())
                 .explode("node")
                 .join(blamed.select("cluster", "node").unique(), on=["cluster", "node"], how="semi")
                 .group_by(["period", "cluster", "node"]).agg(jobs=pl.len()))
    nodes = _counts(blamed, node_jobs, ["cluster", "node"], "node")
    nodes = nodes.filter((pl.col("recent") > 0) | (pl.col("base") > 0))
    rows = pl.concat([f.select("kind", "cluster", "key", "recent", "recent_jobs", "base", "base_jobs")
                      for f in (outcomes, clusters, nodes)])
    rows = rows.filter((pl.col("recent") > 0) | (pl.col("base") > 0) | (pl.col("kind") == "cluster"))
    out = _test(rows) if rows.height else rows.with_columns(
        **{c: pl.lit(None, t) for c, t in COLUMNS.items() if c not in rows.columns})
    order = pl.col("kind").replace_strict(_KINDS, return_dtype=pl.Int32)
    return (out.with_columns(_o=order, _f=(pl.col("flag") == "").cast(pl.Int8),
                             _p=pl.min_horizontal("p_up", "p_down"))
            .sort(["_o", "_f", "_p", "recent", "cluster", "key"], descending=[False, False, False, True, False, False],
                  nulls_last=True)
            .select([pl.col(c).cast(t) for c, t in COLUMNS.items()]))


def of(jobs: pl.DataFrame, diagnoses: pl.DataFrame, now: datetime | None = None) -> Comparison:
    """compare() with what the report says about it."""
    now = now if now is not None else anchor(jobs)
    if now is None:
        return Comparison(pl.DataFrame(schema=COLUMNS), datetime.min, 0.0, 0)
    return Comparison(compare(jobs, diagnoses, now), now, baseline_days(jobs, now),
                      jobs.filter((pl.col("end_time") > now - RECENT) & (pl.col("end_time") <= now)).height)
