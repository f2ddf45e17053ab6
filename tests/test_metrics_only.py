"""Faults only the metrics show: the simulator's GPU Xid jobs without syslog, collected from saved metric
files (`metrics: {kind: parquet_files}`) and diagnosed by the DCGM metric rules, scored against the truth."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import polars as pl
import pytest

from faultline.collectors import metric_files
from faultline.fleet import watermark
from faultline.fleet.config import load_config, write_config
from faultline.fleet.diagnose import diagnose_tables
from faultline.simulate import SimConfig, simulate
from faultline.simulate.jobs import build_jobs
from faultline.simulate.fleet import build_clusters
from faultline.warehouse.store import Warehouse

T0 = datetime(2024, 6, 1, 12, tzinfo=timezone.utc)


def test_metric_files_keep_each_jobs_nodes_and_window(tmp_path):
    d = tmp_path / "alpha" / "metrics"
    d.mkdir(parents=True)
    ts = [T0 + timedelta(minutes=m) for m in range(-60, 120, 10)]
    rows = [{"cluster": "alpha", "node": n, "gpu": 0, "name": "DCGM_FI_DEV_XID_ERRORS", "ts": t, "value": 0.0,
             "labels": "{}"} for n in ("n1", "n2") for t in ts]
    pl.DataFrame(rows).with_columns(pl.col("gpu").cast(pl.Int32)).write_parquet(d / "2024-06-01.parquet")
    failed = pl.DataFrame({"cluster": ["alpha", "alpha"], "job_id": ["1", "2"], "attempt": [0, 0],
                           "nodes": [["n1"], ["n9"]], "submit_time": [T0, T0], "start_time": [T0, T0],
                           "end_time": [T0 + timedelta(minutes=30)] * 2}).with_columns(pl.col("attempt").cast(pl.Int32))
    samples, cov = metric_files.fetch({"path": str(tmp_path)}, "alpha", failed, margin_minutes=15)
    assert set(samples["node"]) == {"n1"}  # n2 ran no failed job
    assert samples["ts"].min() == T0 - timedelta(minutes=10) and samples["ts"].max() == T0 + timedelta(minutes=30)
    got = {r["job_id"]: (r["status"], r["rows"]) for r in cov.iter_rows(named=True)}
    assert got == {"1": ("ok", samples.height), "2": ("empty", 0)}
    (d / "2024-06-01.parquet").write_bytes(b"not parquet")
    _, cov = metric_files.fetch({"path": str(tmp_path)}, "alpha", failed)
    assert cov["status"].to_list() == ["error", "error"] and "metric files" in cov["reason"][0]


def test_the_simulator_marks_metrics_only_faults():
    cfg = SimConfig(jobs=400, days=2, clusters=2, seed=3)
    from faultline.simulate.sim import Fleet

    jt = Fleet(cfg).jt.cols
    plain = build_jobs(cfg, build_clusters(cfg.clusters, cfg.nodes_per_cluster,
                                           __import__("numpy").random.default_rng([cfg.seed, 0]),
                                           __import__("faultline.simulate.faults", fromlist=["x"]).LEMON_FAULTS,
                                           cfg.lemon_share)).cols
    changed = [i for i in range(len(jt["job_id"])) if jt["missing"][i] != plain["missing"][i]]
    assert len(changed) == 2 and {int(jt["cidx"][i]) for i in changed} == {0, 1}
    assert all(str(jt["fault"][i]).startswith("gpu_") and jt["missing"][i] == "syslog" for i in changed)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("mo")
    sim = root / "sim"
    simulate(sim, SimConfig(jobs=400, days=2, clusters=2, seed=3), log=lambda *_: None)
    names = sorted(p.name for p in sim.iterdir() if p.is_dir())
    write_config(root / "data", [{"name": n, "scheduler": {"kind": "sacct_files", "path": str(sim)},
                                  "logs": {"kind": "loki_files", "path": str(sim)},
                                  "metrics": {"kind": "parquet_files", "path": str(sim)}} for n in names], demo=True)
    truth = pl.read_parquet(sim / "truth.parquet")
    return root / "data", truth, names


def test_metrics_only_faults_are_diagnosed_from_the_xid_gauge(fleet, ruleset):
    data, truth, names = fleet
    cfg = load_config(data)
    lo = truth["end_time"].min().replace(hour=0, minute=0, second=0, microsecond=0)
    hi = truth["end_time"].max() + timedelta(days=1)
    for n in names:
        watermark.collect(cfg, n, now=hi, start=lo, end=hi)
        watermark.diagnose(cfg, n, ruleset, now=hi)
    wh = Warehouse(cfg.warehouse_dir)
    mo = truth.filter(pl.col("fault").str.starts_with("gpu_") & pl.col("missing").str.starts_with("syslog")
                      & (pl.col("blame") == "node"))
    assert mo.height >= 2
    d = wh.read("diagnoses").join(mo.select("cluster", "job_id", "attempt", "culprit_nodes", want="outcome"),
                                  on=["cluster", "job_id", "attempt"], suffix="_truth")
    assert d.height == mo.height
    for r in d.iter_rows(named=True):
        assert (r["outcome"], r["culprit_nodes"]) == (r["want"], r["culprit_nodes_truth"]), r["root_cause"]
        rules = [e["rule_id"] for e in json.loads(r["evidence"])]
        assert any(x.startswith("nvidia.dcgm_") for x in rules), rules  # a metric rule decided
        cov = {c["source"]: c["status"] for c in json.loads(r["coverage"])}
        assert cov["syslog"] == "empty" and cov["metrics"] == "ok"
    # without the samples the same evidence names no culprit node: the metrics made the verdict
    keys = d.select("cluster", "job_id", "attempt")
    jobs = wh.read("jobs").join(keys, on=list(keys.columns), how="semi")
    logs = wh.read("logs").join(keys, on=list(keys.columns), how="semi")
    cov = wh.read("coverage").join(keys, on=list(keys.columns), how="semi")
    blind, _ = diagnose_tables(jobs, logs, cov, ruleset)
    blind = blind.join(d.select("cluster", "job_id", "attempt", "want", "culprit_nodes_truth"),
                       on=["cluster", "job_id", "attempt"])
    right = blind.filter((pl.col("outcome") == pl.col("want")) & (pl.col("culprit_nodes") == pl.col("culprit_nodes_truth")))
    assert right.height < d.height


def test_a_gpu_series_labelled_with_a_job_is_only_that_jobs_evidence(ruleset):
    """Two jobs share a node; DCGM's HPC job mapping labels GPU 3's samples with job A: the Xid is A's."""
    from faultline.rules.metric import extract_metrics

    ts = [T0 + timedelta(seconds=30 * i) for i in range(20)]
    vals = [0.0] * 8 + [79.0] * 12
    metrics = pl.DataFrame({"cluster": "alpha", "node": "n1", "gpu": 3, "name": "DCGM_FI_DEV_XID_ERRORS", "ts": ts,
                            "value": vals, "labels": '{"Hostname":"n1","hpc_job":"A"}'}).cast(
        {"gpu": pl.Int32, "ts": pl.Datetime("us", "UTC")})
    jobs = pl.DataFrame({"cluster": ["alpha", "alpha"], "job_id": ["A", "B"], "attempt": [0, 0],
                         "nodes": [["n1", "n2"], ["n1"]], "start_time": [T0, T0],
                         "end_time": [T0 + timedelta(minutes=15)] * 2, "state": ["FAILED"] * 2}).cast(
        {"attempt": pl.Int32, "start_time": pl.Datetime("us", "UTC"), "end_time": pl.Datetime("us", "UTC")})
    hits = extract_metrics(metrics, jobs, ruleset)
    assert hits.filter(pl.col("rule_id") == "nvidia.dcgm_xid")["job_id"].to_list() == ["A"]
    unlabelled = metrics.with_columns(labels=pl.lit('{"Hostname":"n1"}'))  # no mapping: every job on the node
    hits = extract_metrics(unlabelled, jobs, ruleset)
    assert sorted(hits.filter(pl.col("rule_id") == "nvidia.dcgm_xid")["job_id"].to_list()) == ["A", "B"]
