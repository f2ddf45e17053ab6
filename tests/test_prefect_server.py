"""prefect.yaml as written, against a real `prefect server start` process, a process work pool and a worker:
README's steps (`prefect work-pool create`, `prefect --no-prompt deploy --all`, `prefect worker start`), then
one run of a scheduled deployment (its next scheduled run, moved to now) and one event-triggered
`diagnose_job` run, both to COMPLETED. Skipped, with the reason, when the server does not start."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .fleet_fixture import make_fleet

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

DRIVER = r"""
import asyncio, json, sys
from datetime import datetime, timezone
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName, FlowRunFilter, FlowRunFilterDeploymentId
from prefect.events import emit_event
from prefect.states import Scheduled

async def deployment_id(client, name):
    deps = await client.read_deployments(deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[name])))
    return deps[0].id

async def runs_of(client, dep):
    return await client.read_flow_runs(flow_run_filter=FlowRunFilter(deployment_id=FlowRunFilterDeploymentId(any_=[dep])))

async def main():
    async with get_client() as client:
        collect = await deployment_id(client, "collect-every-10m")
        on_failure = await deployment_id(client, "diagnose-job-on-failure")
        for _ in range(60):  # the scheduler service creates the schedule's runs
            scheduled = sorted((r for r in await runs_of(client, collect) if r.state.type.value == "SCHEDULED"),
                               key=lambda r: r.expected_start_time)
            if scheduled:
                break
            await asyncio.sleep(1)
        run = scheduled[0]
        await client.set_flow_run_state(run.id, Scheduled(scheduled_time=datetime.now(timezone.utc)), force=True)
        emit_event(event="faultline.job.failed", resource={"prefect.resource.id": "faultline.job.alpha.1001"},
                   payload={"cluster": "alpha", "job_id": "1001"})
        triggered = []
        for _ in range(60):
            triggered = await runs_of(client, on_failure)
            if triggered:
                break
            await asyncio.sleep(1)
        watch = [run.id] + [r.id for r in triggered]
        states = {}
        for _ in range(150):
            states = {str(i): (await client.read_flow_run(i)).state for i in watch}
            if all(s.is_final() for s in states.values()):
                break
            await asyncio.sleep(1)
        params = triggered[0].parameters if triggered else None
        print(json.dumps({"scheduled_run": str(run.id), "was_scheduled_for": run.expected_start_time.isoformat(),
                          "states": {k: v.type.value for k, v in states.items()},
                          "messages": {k: v.message for k, v in states.items()}, "triggered": len(triggered),
                          "trigger_parameters": params}))

asyncio.run(main())
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def server(tmp_path):
    port = _free_port()
    home = tmp_path / "prefect-home"
    home.mkdir()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "INFO"}
    env.pop("PREFECT_API_URL", None)
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 120
    try:
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (tmp_path / "server.log").read_text()[-1500:]
                pytest.skip(f"prefect server did not start on 127.0.0.1:{port}: {tail}")
            time.sleep(1)
        yield {**env, "PREFECT_API_URL": url}
    finally:
        _stop(proc)
        log.close()


def test_deployments_of_prefect_yaml_run_on_a_real_server_and_worker(tmp_path, server):
    data = make_fleet(tmp_path)
    run = lambda *cmd, **kw: subprocess.run(cmd, env=kw.pop("env", server), capture_output=True, text=True,  # noqa: E731
                                            timeout=180, **kw)
    pool = run(str(BIN / "prefect"), "work-pool", "create", "faultline", "--type", "process")
    assert pool.returncode == 0, pool.stdout[-2000:] + pool.stderr[-2000:]
    deploy = run(str(BIN / "prefect"), "--no-prompt", "deploy", "--all", cwd=ROOT)
    assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-2000:]
    assert deploy.stdout.count("successfully created") == 5, deploy.stdout[-3000:]
    worker_env = {**server, "FAULTLINE_DATA_DIR": str(data), "PREFECT_WORKER_QUERY_SECONDS": "2"}
    wlog = open(tmp_path / "worker.log", "w")
    worker = subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", "faultline"], cwd=tmp_path,
                              env=worker_env, stdout=wlog, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        drive = run(sys.executable, "-c", DRIVER)
    finally:
        _stop(worker)
        wlog.close()
    wtail = (tmp_path / "worker.log").read_text()[-4000:]
    assert drive.returncode == 0, drive.stderr[-3000:] + wtail
    got = json.loads(drive.stdout.strip().splitlines()[-1])
    print(json.dumps(got, indent=1))
    assert got["triggered"] == 1 and got["trigger_parameters"] == {"cluster": "alpha", "job_id": "1001"}
    assert set(got["states"].values()) == {"COMPLETED"}, (got, wtail)
    from faultline.warehouse.store import Warehouse

    d = Warehouse(data / "warehouse").read("diagnoses")
    assert d["job_id"].to_list() == ["1001"] and d["outcome"][0] == "gpu_hardware"
