"""The last 24 h against the previous 7 days: rates with denominators, the stated flag rule."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import polars as pl
import pytest

from faultline.report import compare

NOW = datetime(2024, 5, 9, tzinfo=timezone.utc)


def fleet(recent: dict[str, int], base: dict[str, int], recent_jobs: int = 100, base_jobs: int = 700,
          node: str = "n1") -> tuple[pl.DataFrame, pl.DataFrame]:
    """`recent_jobs` job attempts in the last 24 h and `base_jobs` spread over the 7 days before; the first
    jobs of each period fail with the given outcomes (gpu_hardware blames `node`)."""
    jobs, diags = [], []
    for period, n, fails, t0, span in (("r", recent_jobs, recent, NOW - timedelta(hours=24), 24),
                                       ("b", base_jobs, base, NOW - timedelta(days=8), 24 * 7)):
        outs = [o for o, k in fails.items() for _ in range(k)]
        for i in range(n):
            end = t0 + timedelta(hours=span * (i + 0.5) / n)
            o = outs[i] if i < len(outs) else "healthy"
            jobs.append({"cluster": "c", "job_id": f"{period}{i}", "attempt": 0, "end_time": end,
                         "state": "COMPLETED" if o == "healthy" else "FAILED", "nodes": [node, f"x{i % 9}"]})
            diags.append({"cluster": "c", "job_id": f"{period}{i}", "attempt": 0, "end_time": end, "outcome": o,
                          "domain": "hardware" if o == "gpu_hardware" else "software",
                          "ambiguous": False, "culprit_nodes": [node] if o == "gpu_hardware" else []})
    return pl.DataFrame(jobs), pl.DataFrame(diags)


def row(c: pl.DataFrame, kind: str, key: str) -> dict:
    return c.filter((pl.col("kind") == kind) & (pl.col("key") == key)).row(0, named=True)


def test_binomial_tails_match_the_closed_form():
    up, down = compare.binom_tails(3, 10, 0.2)
    exact = [math.comb(10, i) * 0.2 ** i * 0.8 ** (10 - i) for i in range(11)]
    assert up == pytest.approx(sum(exact[3:]))
    assert down == pytest.approx(sum(exact[:4]))
    # large counts stay finite and exact enough (log space)
    u, d = compare.binom_tails(700, 5000, 0.125)
    assert 0 < u < 1 and 0 < d < 1 and u + d == pytest.approx(1 + math.exp(
        math.lgamma(5001) - math.lgamma(701) - math.lgamma(4301) + 700 * math.log(0.125) + 4300 * math.log(0.875)))


def test_a_rise_is_flagged_with_its_rates_and_denominators():
    jobs, diags = fleet({"gpu_hardware": 8, "cuda_oom": 2}, {"gpu_hardware": 7, "cuda_oom": 14})
    c = compare.compare(jobs, diags, NOW)
    g = row(c, "outcome", "gpu_hardware")
    assert (g["recent"], g["recent_jobs"], g["base"], g["base_jobs"]) == (8, 100, 7, 700)
    assert g["recent_rate"] == pytest.approx(0.08) and g["base_rate"] == pytest.approx(0.01)
    assert g["change"] == pytest.approx(8.0) and g["flag"] == "up" and g["p_up"] < compare.ALPHA
    assert row(c, "outcome", "cuda_oom")["flag"] == ""  # 2/100 vs 14/700: the same rate
    n = row(c, "node", "n1")  # the node ran every job: 8 blames of 100 against 7 of 700
    assert (n["recent"], n["recent_jobs"], n["flag"]) == (8, 100, "up")
    assert row(c, "cluster", "c")["recent"] == 10
    assert c["kind"].to_list()[0] == "outcome" and c.filter(pl.col("kind") == "outcome")["key"][0] == "gpu_hardware"


def test_small_counts_and_missing_baselines_are_never_flagged():
    jobs, diags = fleet({"gpu_hardware": 2}, {}, recent_jobs=10)  # 2 of 10 against 0 of 700: p tiny, but 2 events
    g = row(compare.compare(jobs, diags, NOW), "outcome", "gpu_hardware")
    assert g["p_up"] < compare.ALPHA and g["flag"] == "" and g["change"] is None
    jobs, diags = fleet({"gpu_hardware": 9}, {}, base_jobs=0)
    g = row(compare.compare(jobs, diags, NOW), "outcome", "gpu_hardware")
    assert g["base_jobs"] == 0 and g["flag"] == "" and g["base_rate"] is None
    assert compare.baseline_days(jobs, NOW) == 0.0


def test_a_drop_is_flagged_down_and_the_anchor_is_the_data():
    jobs, diags = fleet({"cuda_oom": 0}, {"cuda_oom": 140})
    c = compare.compare(jobs, diags, NOW)
    assert row(c, "outcome", "cuda_oom")["flag"] == "down"
    vs = compare.of(jobs, diags)  # no `now`: the newest job end
    assert vs.recent_jobs == 100 and vs.baseline_days == 7.0
    assert compare.compare(jobs.head(0), diags.head(0)).height == 0
