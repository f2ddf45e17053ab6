"""The flows under real Prefect orchestration (one temporary server for the module), and the
deployments of prefect.yaml, including the event trigger that starts `diagnose_job`."""

import asyncio
import time

import pytest

from .fleet_fixture import END, START, make_fleet

prefect = pytest.importorskip("prefect")


def test_every_deployment_of_prefect_yaml_loads():
    from faultline.flows.deployments import build_all, read_deployments

    deployments = build_all({"data_dir": "/tmp/x"})
    names = {d.name for d in deployments}
    assert names == {d["name"] for d in read_deployments()} == {
        "collect-every-10m", "diagnose-every-10m", "report-nightly", "diagnose-job-on-failure", "backtest",
        "record-placements-every-1m"}
    by_name = {d.name: d for d in deployments}
    assert by_name["collect-every-10m"].schedules[0].schedule.interval.total_seconds() == 600
    assert by_name["report-nightly"].schedules[0].schedule.cron == "30 2 * * *"
    assert by_name["record-placements-every-1m"].schedules[0].schedule.interval.total_seconds() == 60
    trigger = by_name["diagnose-job-on-failure"].triggers[0]
    assert trigger.expect == {"faultline.job.failed"}
    assert set(trigger.parameters) == {"cluster", "job_id"}


@pytest.fixture(scope="module")
def harness():
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180), temporary_settings(
            {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


def test_collect_diagnose_report_through_prefect(tmp_path, harness):
    from faultline.flows import flows
    from faultline.warehouse.store import Warehouse

    data = str(make_fleet(tmp_path))
    collected = flows.collect(data_dir=data, start=START, end=END)
    diagnosed = flows.diagnose(data_dir=data)
    assert collected[0]["jobs"] == 4 and collected[0]["failed"] == 3
    assert diagnosed[0]["diagnosed"] == 3
    # a re-run of the same window finds nothing new, and diagnose nothing pending
    assert flows.collect(data_dir=data, start=START, end=END)[0]["jobs"] == 0
    assert flows.diagnose(data_dir=data)[0]["diagnosed"] == 0
    wh = Warehouse(tmp_path / "data" / "warehouse")
    assert wh.sql("SELECT count(*) n FROM diagnoses_all")["n"][0] == 3
    html_path = flows.report(data_dir=data, day=END.date(), days=2)
    html = open(html_path, encoding="utf-8").read()
    assert "gpu_hardware" in html and "gpu001" in html and "<script src" not in html
    assert wh.read("trends_node_day").filter(wh.read("trends_node_day")["node"] == "gpu001")["times_culprit"][0] == 1


def test_the_record_placements_flow_records_the_pods_of_admitted_workloads(tmp_path, harness):
    from faultline.flows import flows
    from faultline.fleet.config import write_config
    from faultline.warehouse.store import Warehouse
    from tests.k8s_fake import FakeKube
    from tests.test_kubernetes import cluster_cfg, pytorchjob

    fake = FakeKube()
    url = fake.start()
    try:
        pytorchjob(fake)
        fake.workloads[0]["status"]["conditions"].pop()  # still running
        data = tmp_path / "data"
        write_config(data, [cluster_cfg(tmp_path, url),
                            {"name": "slurm", "scheduler": {"kind": "sacct_files", "path": str(tmp_path)}}])
        out = flows.record_placements(data_dir=str(data))
        assert [(r["cluster"], r["pods"], r["written"]) for r in out] == [("kube", 4, 4)]
        assert flows.record_placements(data_dir=str(data))[0]["written"] == 0
        assert Warehouse(data / "warehouse").read("placements").height == 4
    finally:
        fake.stop()


def test_a_failed_job_event_starts_diagnose_job(tmp_path, harness):
    from prefect.client.orchestration import get_client
    from prefect.events import emit_event
    from prefect.runner import Runner

    from faultline.flows.deployments import build, read_deployments
    from faultline.warehouse.store import Warehouse

    data = make_fleet(tmp_path)
    spec = next(d for d in read_deployments() if d["name"] == "diagnose-job-on-failure")
    deployment = build(spec, {"data_dir": str(data)})
    deployment_id = deployment.apply()  # creates the automation behind the trigger
    time.sleep(1)
    emit_event(event="faultline.job.failed", resource={"prefect.resource.id": "faultline.job.alpha.1001"},
               payload={"cluster": "alpha", "job_id": "1001"})

    async def runs_of_deployment():
        async with get_client() as client:
            for _ in range(90):
                runs = [r for r in await client.read_flow_runs() if r.deployment_id == deployment_id]
                if runs:
                    return runs
                await asyncio.sleep(1)
        return []

    runs = asyncio.run(runs_of_deployment())
    assert len(runs) == 1
    assert runs[0].parameters == {"data_dir": str(data), "cluster": "alpha", "job_id": "1001"}

    runner = Runner(limit=1)
    runner.add_deployment(deployment)
    asyncio.run(runner.start(run_once=True))  # executes the scheduled run

    async def final_state():
        async with get_client() as client:
            return (await client.read_flow_run(runs[0].id)).state.type.value

    assert asyncio.run(final_state()) == "COMPLETED"
    d = Warehouse(tmp_path / "data" / "warehouse").read("diagnoses")
    assert d["job_id"].to_list() == ["1001"] and d["outcome"][0] == "gpu_hardware"
    assert d["culprit_nodes"].to_list() == [["gpu001"]]


CANDIDATE = """\
rules:
  - id: python.module_not_found
    title: Missing module, read as a user code error (candidate)
    status: stable
    description: A candidate that files missing modules under user code errors.
    match:
      log:
        literals: ["No module named"]
        regex: "ModuleNotFoundError: No module named '(?P<module>[^']+)'"
    emits: {symptom: module_not_found, role: root, domain: workload, implicates: self, outcome: user_code_error}
    priority: 70
    tests:
      match: ["ModuleNotFoundError: No module named 'flash_attn'"]
"""


def test_backtest_lists_the_verdicts_a_candidate_ruleset_would_change(tmp_path, harness):
    from faultline.flows import flows
    from faultline.warehouse.store import Warehouse

    data = str(make_fleet(tmp_path))
    flows.collect(data_dir=data, start=START, end=END)
    flows.diagnose(data_dir=data)
    candidate = tmp_path / "candidate" / "site"
    candidate.mkdir(parents=True)
    (candidate / "override.yaml").write_text(CANDIDATE)
    changes = flows.backtest(candidate_rules=[str(candidate.parent)], data_dir=data, start=START, end=END)
    assert [(c["job_id"], c["outcome"], c["outcome_new"]) for c in changes] == [
        ("1004", "config_error", "user_code_error")]
    versions = Warehouse(tmp_path / "data" / "warehouse").sql("SELECT DISTINCT ruleset FROM diagnoses")["ruleset"]
    assert versions.len() == 2  # both verdicts sit side by side


def test_settings_of_the_deployments_fail_clearly_when_missing(tmp_path, monkeypatch):
    from faultline.flows.env import DATA_ENV, data_dir_of
    from faultline.flows.steps import ENV, project_dir, set_project_dir

    monkeypatch.delenv(DATA_ENV, raising=False)
    with pytest.raises(ValueError, match="pass the flow's data_dir parameter or set FAULTLINE_DATA_DIR"):
        data_dir_of(None)
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    with pytest.raises(ValueError, match="has no faultline.yaml: run `faultline demo`"):
        data_dir_of(None)
    data = make_fleet(tmp_path)
    monkeypatch.setenv(DATA_ENV, str(data))
    assert data_dir_of(None) == str(data)
    monkeypatch.setenv(ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="is not a faultline checkout"):
        set_project_dir()
    monkeypatch.delenv(ENV)
    assert (project_dir() / "prefect.yaml").is_file()  # the checkout faultline is installed from


def test_diagnose_on_a_dask_cluster_writes_the_same_warehouse(tmp_path, harness):
    """The diagnose flow's partition tasks on a 2-process Dask LocalCluster, jobs streamed 7 at a time,
    against the thread runner with one batch per partition: the same diagnoses and symptoms."""
    pytest.importorskip("prefect_dask")
    import shutil

    import polars as pl

    from faultline.fleet.config import write_config
    from faultline.flows import flows, runner
    from faultline.simulate import SimConfig, simulate
    from faultline.warehouse.store import Warehouse

    sim = tmp_path / "sim"
    simulate(sim, SimConfig(jobs=160, days=2, clusters=2, seed=11, nodes_per_cluster=32), log=lambda _: None)
    names = sorted(p.name for p in sim.iterdir() if p.is_dir())
    threads, dask = tmp_path / "threads", tmp_path / "dask"
    write_config(threads, [{"name": n, "scheduler": {"kind": "sacct_files", "path": str(sim)},
                            "logs": {"kind": "loki_files", "path": str(sim)}} for n in names], demo=True)
    truth = pl.read_parquet(sim / "truth.parquet")
    lo, hi = truth["end_time"].min(), truth["end_time"].max()
    flows.collect(data_dir=str(threads), start=lo.replace(hour=0, minute=0, second=0, microsecond=0),
                  end=hi + __import__("datetime").timedelta(days=1))
    shutil.copytree(threads, dask)  # the same collected warehouse, twice
    cfg = (dask / "faultline.yaml").read_text()
    (dask / "faultline.yaml").write_text("diagnose_batch_jobs: 7\n" + cfg)

    flows.diagnose(data_dir=str(threads))
    on_dask = flows.diagnose.with_options(task_runner=runner.dask(workers=2))(data_dir=str(dask))
    assert sum(r["partitions"] for r in on_dask) >= 4  # clusters x days: work to spread

    def table(root, name: str) -> pl.DataFrame:  # all but when and in which batch it was written
        df = Warehouse(root / "warehouse").read(name)
        if "diagnosis" in df.columns:
            df = df.with_columns(pl.col("diagnosis").str.replace(r'"diagnosed_at": "[^"]*"', ""))
        keep = [c for c in df.columns if c not in ("diagnosed_at", "_batch", "_written_at")]
        return df.select(keep).sort(keep[:4])

    a, b = table(threads, "diagnoses"), table(dask, "diagnoses")
    assert a.height == truth.filter(pl.col("state") != "COMPLETED").height > 20
    assert a.equals(b)
    sa, sb = table(threads, "symptoms"), table(dask, "symptoms")
    cols = [c for c in sa.columns]
    assert sa.sort(cols).equals(sb.sort(cols)) and sa.height > a.height
