"""Fleet mode without Prefect: collectors, collect -> warehouse -> diagnose, idempotency."""

import polars as pl

from faultline.collectors.slurm import expand_hostlist, expand_hostlists, parse_sacct
from faultline.fleet.collect import collect_cluster
from faultline.fleet.config import load_config
from faultline.fleet.diagnose import diagnose_tables, verdict_changes
from faultline.flows import tasks

from .fleet_fixture import END, SACCT, START, make_fleet


def test_hostlist_expansion():
    assert expand_hostlist("gpu[001-003,007],login1") == ["gpu001", "gpu002", "gpu003", "gpu007", "login1"]
    assert expand_hostlist("a[1-2]-ib[0-1]") == ["a1-ib0", "a1-ib1", "a2-ib0", "a2-ib1"]
    assert expand_hostlist("None assigned") == []


def test_vectorized_hostlists_agree_with_the_reference():
    cases = ["gpu[001-003,007],login1", "a[1-2]-ib[0-1]", "None assigned", "gpu017", "n[9-11]x,n[08]", "",
             "gpu-a-[0001-0003]", "x[1],y[2-3]"]
    got = expand_hostlists(pl.Series(cases)).to_list()
    assert got == [expand_hostlist(c) for c in cases]


def test_sacct_text_to_jobs_and_allocations():
    jobs, allocs = parse_sacct(SACCT, "alpha")
    row = jobs.filter(pl.col("job_id") == "1001").row(0, named=True)
    assert (row["state"], row["exit_code"], row["signal"], row["num_gpus"]) == ("FAILED", 1, 0, 16)
    assert row["nodes"] == ["gpu001", "gpu002"]
    assert jobs.filter(pl.col("job_id") == "1003")["state"][0] == "TIMEOUT"
    assert sorted(allocs.filter(pl.col("job_id") == "1001")["node"].to_list()) == ["gpu001", "gpu002"]


def test_collect_parses_lines_and_records_coverage(tmp_path):
    cfg = load_config(make_fleet(tmp_path))
    got = collect_cluster(cfg.clusters[0], START, END)
    assert got.jobs.height == 4
    assert set(got.logs["job_id"].unique()) == {"1001", "1003", "1004"}  # failed jobs only
    xid = got.logs.filter(pl.col("line").str.contains("Xid")).row(0, named=True)
    assert xid["node"] == "gpu001" and xid["source"] == "syslog"
    wd = got.logs.filter(pl.col("line").str.contains("Watchdog")).row(0, named=True)
    assert wd["rank"] == 1 and wd["node"] == "gpu002"
    cov = got.coverage.filter(pl.col("job_id") == "1004")
    assert dict(cov.select("source", "status").iter_rows()) == {
        "applog": "ok", "syslog": "empty", "scheduler": "ok", "k8s_event": "not_configured"}


def test_fleet_diagnosis_through_the_warehouse_is_idempotent(tmp_path, ruleset):
    data = make_fleet(tmp_path)
    for _ in range(2):  # the same window twice: same rows, no duplicates
        tasks.collect_partition.fn(str(data), "alpha", START, END)
        tasks.diagnose_partition.fn(str(data), "alpha", START, END)
    from faultline.warehouse.store import Warehouse

    wh = Warehouse(data / "warehouse")
    d = wh.read("diagnoses").sort("job_id")
    assert d["job_id"].to_list() == ["1001", "1003", "1004"]
    by_job = {r["job_id"]: r for r in d.iter_rows(named=True)}
    assert by_job["1001"]["outcome"] == "gpu_hardware" and by_job["1001"]["culprit_nodes"] == ["gpu001"]
    assert by_job["1001"]["affected_nodes"] == ["gpu002"]
    assert by_job["1003"]["outcome"] == "scheduler_timelimit" and by_job["1003"]["culprit_nodes"] == []
    assert by_job["1004"]["outcome"] == "config_error"
    assert by_job["1001"]["gpu_hours"] > 30  # 16 GPUs x ~2.2 h
    assert wh.sql("SELECT count(*) AS n FROM diagnoses_all")["n"][0] == 3
    assert wh.sql("SELECT count(*) AS n FROM logs")["n"][0] == wh.sql("SELECT count(*) AS n FROM logs_all")["n"][0]


def test_verdict_changes_lists_only_changed_jobs(tmp_path, ruleset):
    cfg = load_config(make_fleet(tmp_path))
    got = collect_cluster(cfg.clusters[0], START, END)
    old, _ = diagnose_tables(got.jobs, got.logs, got.coverage, ruleset)
    new = old.with_columns(outcome=pl.when(pl.col("job_id") == "1004").then(pl.lit("user_code_error"))
                           .otherwise(pl.col("outcome")))
    changes = verdict_changes(old, new)
    assert changes["job_id"].to_list() == ["1004"]
    assert changes.row(0, named=True)["outcome_new"] == "user_code_error"
