"""Issue 10, defect 4: sacct edge cases. Each input is text in `sacct -a -P -X -D --format=...`'s real
format (the header of SACCT_FIELDS, `|` between fields, no trailing `|`; Unknown for a time not yet
reached, `None assigned` for a pending job's nodes), served by a stand-in `sacct` command that prints
it, so the by-reference path runs exactly as against a real cluster."""

import os
import stat
import time
from pathlib import Path

import polars as pl
import pytest
from fastapi.testclient import TestClient

from faultline.collectors.slurm import SACCT_FIELDS, base_job_id, parse_sacct, sacct_timeout
from faultline.fleet.config import ConfigError, load_config, write_config
from faultline.service.app import create_app
from faultline.service.settings import Settings

HEADER = "|".join(SACCT_FIELDS)
T = "2026-11-20T08:00:00|2026-11-20T08:01:00|2026-11-20T10:13:00"
ROWS = {
    "failed": f"4711|pretrain|ana|gpu|FAILED|1:0|{T}|2|gpu[001-002]|billing=128,cpu=128,gres/gpu=16,node=2",
    "running": "4720|pretrain|ana|gpu|RUNNING|0:0|2026-11-20T08:00:00|2026-11-20T08:01:00|Unknown|2|gpu[003-004]|"
               "billing=128,cpu=128,gres/gpu=16,node=2",
    "pending": "4721|pretrain|ana|gpu|PENDING|0:0|2026-11-20T08:00:00|Unknown|Unknown|2|None assigned|"
               "billing=128,cpu=128,gres/gpu=16,node=2",
    "het0": f"4730+0|moe|bo|gpu|FAILED|1:0|{T}|1|gpu005|cpu=64,gres/gpu=8,node=1",
    "het1": f"4730+1|moe|bo|cpu|CANCELLED by 1001|0:15|{T}|1|cpu001|cpu=32,node=1",
    "array_done": f"4740_2|sweep|cy|gpu|FAILED|1:0|{T}|1|gpu006|cpu=64,gres/gpu=8,node=1",
    "array_pending": "4740_[3-5]|sweep|cy|gpu|PENDING|0:0|2026-11-20T08:00:00|Unknown|Unknown|1|None assigned|"
                     "billing=64,cpu=64,gres/gpu=8,node=1",
    "pipe_name": f"4750|eval|a|b||c|dee|gpu|TIMEOUT|0:0|{T}|1|gpu007|cpu=64,gres/gpu=8,node=1",
}


def sacct_text(*rows: str) -> str:
    return "\n".join([HEADER, *rows]) + "\n"


def fake_sacct(tmp: Path, text: str, sleep_s: float = 0) -> Path:
    """An executable that answers like sacct: the same text for any job id (as sacct -j <id> would,
    the exact id chosen by the caller), after `sleep_s`."""
    out = tmp / "sacct.txt"
    out.write_text(text)
    cmd = tmp / "sacct"
    cmd.write_text(f"#!/bin/sh\nsleep {sleep_s}\ncat {out}\n")
    cmd.chmod(cmd.stat().st_mode | stat.S_IEXEC)
    return cmd


def client_for(tmp: Path, ruleset, text: str, **scheduler) -> TestClient:
    data = tmp / "data"
    write_config(data, [{"name": "alpha", "scheduler": {"kind": "sacct", "command": str(fake_sacct(tmp, text)),
                                                          **scheduler}}])
    return TestClient(create_app(Settings(config=data / "faultline.yaml", tmp_dir=tmp), ruleset),
                      base_url="http://localhost")


def by_ref(client: TestClient, job_id: str):
    return client.post("/v1/diagnose", json={"cluster": "alpha", "job_id": job_id})


def test_defect4_header_only_output_is_no_jobs_and_by_reference_404(tmp_path, ruleset):
    jobs, allocs = parse_sacct(sacct_text(), "alpha")  # a quiet window, or an unknown job
    assert jobs.height == 0 and allocs.height == 0 and jobs.schema["end_time"] == pl.Datetime("us", "UTC")
    with client_for(tmp_path, ruleset, sacct_text()) as client:
        r = by_ref(client, "999")
        assert r.status_code == 404 and r.json()["error"] == "job_not_found", r.text


@pytest.mark.parametrize("row,job_id,state", [("running", "4720", "RUNNING"), ("pending", "4721", "PENDING"),
                                              ("array_pending", "4740_[3-5]", "PENDING")])
def test_defect4_a_job_still_running_is_409_not_500(tmp_path, ruleset, row, job_id, state):
    with client_for(tmp_path, ruleset, sacct_text(ROWS[row])) as client:
        r = by_ref(client, job_id)
        assert r.status_code == 409, r.text
        assert r.json()["error"] == "job_not_finished" and state in r.json()["detail"]


def test_defect4_heterogeneous_and_array_ids_are_parsed_and_stored(tmp_path, ruleset):
    text = sacct_text(ROWS["het0"], ROWS["het1"], ROWS["array_done"], ROWS["array_pending"])
    jobs, allocs = parse_sacct(text, "alpha")
    assert jobs["job_id"].to_list() == ["4730+0", "4730+1", "4740_2", "4740_[3-5]"]
    assert jobs["state"].to_list() == ["FAILED", "CANCELLED", "FAILED", "PENDING"]
    assert allocs.filter(pl.col("job_id") == "4730+1")["node"].to_list() == ["cpu001"]
    with client_for(tmp_path, ruleset, text) as client:
        for job_id in ("4730+0", "4740_2"):
            r = by_ref(client, job_id)
            assert r.status_code == 200, r.text
            assert r.json()["job_id"] == job_id
            stored = client.get(f"/v1/diagnoses/alpha/{job_id}")
            assert stored.status_code == 200 and stored.json()["job_id"] == job_id
        whole = by_ref(client, "4730")  # the het job as a whole: Slurm's own ids are named
        assert whole.status_code == 404 and "4730+0, 4730+1" in whole.json()["detail"]


def test_defect4_sacct_is_asked_for_the_base_id_of_array_tasks_and_het_components():
    assert [base_job_id(j) for j in ("4711", "4711_2", "4711_[1-3]", "4711+0", "weird")] == [
        "4711", "4711", "4711", "4711", "weird"]


def test_defect4_a_pipe_in_a_job_name_keeps_the_job(tmp_path, ruleset):
    jobs, allocs = parse_sacct(sacct_text(ROWS["failed"], ROWS["pipe_name"]), "alpha")
    row = jobs.filter(pl.col("job_id") == "4750").row(0, named=True)
    assert row["name"] == "eval|a|b||c" and row["user"] == "dee" and row["state"] == "TIMEOUT"
    assert row["nodes"] == ["gpu007"] and row["num_gpus"] == 8
    assert jobs.height == 2
    cut = parse_sacct(sacct_text("4760|short|row"), "alpha")[0]  # fewer fields: nothing to trust
    assert cut.height == 0


def test_defect4_the_sacct_timeout_is_configurable(tmp_path, ruleset, monkeypatch):
    assert sacct_timeout({}, 20.0) == 20.0
    monkeypatch.setenv("FAULTLINE_SACCT_TIMEOUT_S", "7.5")
    assert sacct_timeout({}, 20.0) == 7.5
    assert sacct_timeout({"timeout_s": 3}, 20.0) == 3.0  # the cluster's own setting wins
    with pytest.raises(ValueError):
        sacct_timeout({"timeout_s": -1}, 20.0)
    data = tmp_path / "bad"
    write_config(data, [{"name": "a", "scheduler": {"kind": "sacct", "timeout_s": "soon"}}])
    with pytest.raises(ConfigError, match="timeout_s"):
        load_config(data)
    monkeypatch.delenv("FAULTLINE_SACCT_TIMEOUT_S")
    # a hung sacct: the request gives up after the configured 1 s with 502, and does not hold its worker 60 s
    data = tmp_path / "data"
    write_config(data, [{"name": "alpha", "scheduler": {
        "kind": "sacct", "timeout_s": 1, "command": str(fake_sacct(tmp_path, sacct_text(ROWS["failed"]), 30))}}])
    with TestClient(create_app(Settings(config=data / "faultline.yaml", tmp_dir=tmp_path), ruleset),
                    base_url="http://localhost") as client:
        t0 = time.monotonic()
        r = by_ref(client, "4711")
        assert r.status_code == 502 and "timed out" in r.json()["detail"], r.text
        assert time.monotonic() - t0 < 15
