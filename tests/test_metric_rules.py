"""Metric rules (`match: metric`) over many jobs at once, and their promtool-style rule tests."""

from datetime import datetime, timedelta, timezone

import polars as pl

from faultline.rules.loader import load_ruleset
from faultline.rules.metric import expand_values, extract_metrics
from faultline.rules.testing import run_rule_tests

T = datetime(2026, 11, 20, 8, tzinfo=timezone.utc)
SCHEMA = {"cluster": pl.String, "node": pl.String, "gpu": pl.Int32, "name": pl.String,
          "ts": pl.Datetime("us", "UTC"), "value": pl.Float64, "labels": pl.String}


def samples(rows):
    return pl.DataFrame([{"cluster": "a", "node": n, "gpu": g, "name": name, "ts": T + timedelta(minutes=k),
                          "value": float(v), "labels": "{}"} for n, g, name, vals in rows for k, v in enumerate(vals)],
                        schema=SCHEMA)


def jobs(*rows):
    return pl.DataFrame([{"cluster": "a", "job_id": j, "attempt": 0, "start_time": T + timedelta(minutes=s),
                          "end_time": T + timedelta(minutes=e), "nodes": nodes} for j, s, e, nodes in rows],
                        schema={"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32,
                                "start_time": pl.Datetime("us", "UTC"), "end_time": pl.Datetime("us", "UTC"),
                                "nodes": pl.List(pl.String)})


def test_promtool_notation():
    assert expand_values("0x2 79") == [0, 0, 0, 79]
    assert expand_values("1+2x3 _ 5-1x1") == [1, 3, 5, 7, None, 5, 4]


def test_each_job_sees_only_its_nodes_and_its_window(ruleset):
    xid = "DCGM_FI_DEV_XID_ERRORS"
    m = samples([("n1", 0, xid, [0] * 5 + [79] * 15), ("n2", 0, xid, [0] * 20), ("n3", 2, xid, [0] * 12 + [48] * 8)])
    out = extract_metrics(m, jobs(("j1", 1, 10, ["n1", "n2"]),     # n1's Xid at minute 5: j1's
                                  ("j2", 1, 10, ["n3"]),           # n3's Xid at minute 12: after j2 ended
                                  ("j3", 11, 19, ["n1", "n3"])),   # n1 already at 79: only n3's 48
                          ruleset).filter(pl.col("rule_id") == "nvidia.dcgm_xid")
    got = {(r["job_id"], r["node"], r["gpu"], r["outcome"]) for r in out.iter_rows(named=True)}
    assert got == {("j1", "n1", 0, "gpu_hardware"), ("j3", "n3", 2, "gpu_hardware")}
    row = out.filter(pl.col("job_id") == "j1").row(0, named=True)
    assert row["source"] == "metrics" and row["implicates"] == "self" and row["priority"] == 95
    assert row["ts"] == T + timedelta(minutes=5) and row["seq"] == int((T + timedelta(minutes=5)).timestamp())
    assert "rose 0 -> 79" in row["line"]


def test_outlier_needs_one_node_apart_from_the_others(ruleset):
    name = "node_infiniband_symbol_error_total"
    ramp = lambda k: [i * k for i in range(10)]  # noqa: E731
    m = samples([("a1", None, name, ramp(0)), ("a2", None, name, ramp(50)), ("a3", None, name, ramp(0)),
                 ("b1", None, name, ramp(50)), ("b2", None, name, ramp(50)), ("b3", None, name, ramp(0))])
    out = extract_metrics(m, jobs(("one", 0, 9, ["a1", "a2", "a3"]), ("two", 0, 9, ["b1", "b2", "b3"])), ruleset)
    out = out.filter(pl.col("rule_id") == "network.ib_symbol_error_outlier")
    assert out.select("job_id", "node").rows() == [("one", "a2")]


def test_a_metric_rule_test_that_does_not_hold_fails(tmp_path):
    pack = tmp_path / "mine"
    pack.mkdir()
    (pack / "m.yaml").write_text("""
rules:
  - id: mine.temp
    title: hot
    description: hot GPU
    match: {metric: {name: DCGM_FI_DEV_GPU_TEMP, kind: above, threshold: 80, for: 2m}}
    emits: {symptom: hot, role: context, domain: hardware, implicates: self, outcome: healthy}
    tests:
      match:
        - series: [{node: n1, gpu: 0, values: "70 85x1 70"}]     # two minutes above? no: one
          node: n1
      no_match:
        - series: [{node: n1, gpu: 0, values: "85x5"}]           # it is hot for five minutes
""")
    count, failures = run_rule_tests(load_ruleset([tmp_path], builtin=False))
    assert count == 2 and len(failures) == 2
    assert "gave no symptom" in str(failures[0]) and "must not" in str(failures[1])
