"""Attribution sessions (/v2/sessions) against a real uvicorn server on 127.0.0.1: evidence in pieces and
in any order, retries, restarts, expiry and bounds, and the verdict `faultline diagnose` gives."""

import json
import os
import random
import time

import httpx
import pytest

from faultline.pipeline import diagnose_files
from faultline.service.app import create_app
from faultline.service.jobs import relativize
from faultline.service.settings import Settings

from .test_service import JOB, XID, Running, assert_error, comparable, watchdog, write_job


def make_app(ruleset, tmp, **kw):
    cwd = os.getcwd()
    os.chdir(tmp)  # no fleet config here
    try:
        return create_app(Settings(sessions_db=tmp / "sessions.duckdb", **kw), ruleset)
    finally:
        os.chdir(cwd)


@pytest.fixture(scope="module")
def srv(ruleset, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sessions")
    with Running(make_app(ruleset, tmp)) as running:
        yield running


@pytest.fixture
def http(srv):
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        yield c


def create(http, **kw) -> str:
    body = {"cluster": "c1", "job_id": "4711", "nodes": ["node-a", "node-b"], **kw}
    r = http.post("/v2/sessions", json=body)
    assert r.status_code == 201, r.text
    assert r.headers["location"] == f"/v2/sessions/{r.json()['session_id']}"
    return r.json()["session_id"]


def batches_of(files: dict[str, str], size: int = 1) -> list[dict]:
    """Each file cut into pieces of `size` lines, each piece one batch with its offset."""
    out = []
    for name, text in files.items():
        lines = text.splitlines()
        for i in range(0, len(lines), size):
            out.append({"batch_id": f"{name}#{i}", "logs": [{"file": name, "offset": i, "lines": lines[i:i + size]}]})
    return out


def observe(http, sid, batch) -> dict:
    r = http.post(f"/v2/sessions/{sid}/observations", json=batch)
    assert r.status_code == 200, r.text
    return r.json()


def attribute(http, sid, **body) -> dict:
    r = http.post(f"/v2/sessions/{sid}/attribute", json=body) if body else http.post(f"/v2/sessions/{sid}/attribute")
    assert r.status_code == 200, r.text
    return r.json()


def test_shuffled_batches_give_the_verdict_of_faultline_diagnose(http, ruleset, tmp_path):
    root = write_job(tmp_path / "job", JOB)
    want = comparable(json.loads(json.dumps(relativize(
        diagnose_files([root], ruleset, job_id="4711", cluster="c1", state="FAILED"), root), default=str)))
    batches = batches_of(JOB) + [{"batch_id": "sched", "scheduler": {"state": "FAILED"}}]
    for seed in range(4):
        order = batches[:]
        random.Random(seed).shuffle(order)
        sid = create(http)
        for b in order:
            observe(http, sid, b)
        got = attribute(http, sid)
        guarded = got["diagnosis"].pop("recommended_action")
        assert guarded["guard"]["engine_action"] == want["recommended_action"]
        assert comparable(got["diagnosis"]) == {k: v for k, v in want.items() if k != "recommended_action"}, seed
        assert got["diagnosis"]["culprit"]["nodes"] == ["node-a"] and got["attribution"] == 1
    # the one-shot /v1/diagnose is the same engine: same verdict
    one = http.post("/v1/diagnose", json={"job_id": "4711", "cluster": "c1", "state": "FAILED",
                                          "files": [{"name": k, "text": v} for k, v in JOB.items()]}).json()
    assert comparable(one) == want


def test_a_retried_batch_is_not_counted_twice(http):
    sid = create(http)
    batch = {"batch_id": "b-1", "logs": [{"file": "node-b/train.log", "lines": [watchdog(2, "10:12:08")] * 3}]}
    first = observe(http, sid, batch)
    assert first["stored"] and first["evidence"] == {"batches": 1, "lines": 3, "bytes": first["evidence"]["bytes"]}
    again = observe(http, sid, batch)
    assert again["stored"] is False and again["duplicate"] and again["evidence"] == first["evidence"]
    other = {**batch, "logs": [{"file": "node-b/train.log", "lines": ["something else"]}]}
    assert_error(http.post(f"/v2/sessions/{sid}/observations", json=other), 409, "batch_conflict")
    info = http.get(f"/v2/sessions/{sid}").json()
    assert info["evidence"]["lines"] == 3 and info["batch_ids"] == ["b-1"]


def test_verdict_history_and_coverage_say_what_is_missing(http):
    sid = create(http, ranks=[0, 1, 2, 3])
    # the fast pass: node-b's victims only; no scheduler state yet
    observe(http, sid, {"batch_id": "fast", "logs": [{"file": "node-b/train.log", "node": "node-b",
                                                      "lines": [watchdog(2, "10:12:08"), watchdog(3, "10:12:09")]}]})
    first = attribute(http, sid)
    assert first["diagnosis"]["culprit"]["nodes"] != ["node-b"]  # never the victim
    cov = first["coverage"]
    assert cov["nodes_without_logs"] == ["node-a"] and cov["scheduler"] == "unknown"
    assert any("node-a" in m for m in cov["missing"]) and any("scheduler" in m for m in cov["missing"])
    assert any(m.startswith("syslog: no lines") for m in cov["missing"])
    # the refined pass: node-a's syslog and the scheduler's state
    observe(http, sid, {"batch_id": "slow", "logs": [{"file": "node-a/syslog", "lines": [XID]}],
                        "scheduler": {"state": "failed", "exit_code": 1}})
    second = attribute(http, sid, final=True)
    d = second["diagnosis"]
    assert (d["outcome"], d["culprit"]["nodes"], second["attribution"]) == ("gpu_hardware", ["node-a"], 2)
    assert second["coverage"]["nodes_without_logs"] == [] and second["coverage"]["scheduler"] == "observed"
    hist = http.get(f"/v2/sessions/{sid}/verdicts").json()
    assert hist["count"] == 2 and [v["attribution"] for v in hist["verdicts"]] == [1, 2]
    assert hist["verdicts"][0]["diagnosis"]["outcome"] == first["diagnosis"]["outcome"]
    # final: no more evidence, no more attributions
    assert_error(http.post(f"/v2/sessions/{sid}/observations", json={"batch_id": "late", "logs": []}), 409,
                 "session_final")
    assert_error(http.post(f"/v2/sessions/{sid}/attribute"), 409, "session_final")
    assert http.get(f"/v2/sessions/{sid}").json()["final"] is True


def test_loki_streams_metrics_scheduler_and_node_events_are_kept(http):
    sid = create(http)
    ns = 1_795_687_320 * 10**9  # 2026-11-20T10:02:00Z
    loki = {"status": "success", "data": {"resultType": "streams", "result": [
        {"stream": {"host": "node-a", "job": "syslog"}, "values": [[str(ns), XID]]},
        {"stream": {"node": "node-b", "source": "applog"},
         "values": [[str(ns + 600 * 10**9), watchdog(2, "10:12:08")], [str(ns + 601 * 10**9), watchdog(3, "10:12:09")]]}]}}
    prom_vector = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": "DCGM_FI_DEV_XID_ERRORS", "Hostname": "node-a", "gpu": "3"}, "value": [1795687320, "79"]}]}}
    prom_matrix = {"resultType": "matrix", "result": [
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "instance": "node-b", "gpu": "0"},
         "values": [[1795687300, "61"], [1795687315, "NaN"]]}]}
    events = [{"node": "node-a", "ts": "2026-11-20T10:03:00Z", "kind": "drain", "reason": "Xid 79"}]
    ack = observe(http, sid, {"batch_id": "loki-1", "loki": loki})
    assert ack["lines"] == 3
    ack = observe(http, sid, {"batch_id": "m-1", "metrics": [prom_vector, prom_matrix], "node_events": events,
                              "scheduler": {"state": "FAILED", "end_time": "2026-11-20T10:13:00Z",
                                            "nodes": ["node-a", "node-b"]}})
    assert (ack["metric_samples"], ack["node_events"]) == (3, 1)
    got = attribute(http, sid)
    d = got["diagnosis"]
    assert d["outcome"] == "gpu_hardware" and d["culprit"]["nodes"] == ["node-a"] and d["affected"]["nodes"] == ["node-b"]
    assert d["evidence"][0]["file"] == "loki:node-a:syslog" and d["evidence"][0]["ts"] == "2026-11-20T10:02:00Z"
    cov = got["coverage"]
    assert cov["metrics"]["samples"] == 3 and cov["metrics"]["names"] == 2 and cov["metrics"]["used"] is False
    assert cov["node_events"] == {**cov["node_events"], "events": 1, "kinds": ["drain"]}
    assert cov["sources"]["syslog"] == "ok" and cov["scheduler"] == "observed"


def test_a_restart_mid_session_loses_nothing(ruleset, tmp_path):
    first = batches_of(JOB)[:2]
    rest = batches_of(JOB)[2:] + [{"batch_id": "s", "scheduler": {"state": "FAILED"}}]
    with Running(make_app(ruleset, tmp_path)) as a, httpx.Client(base_url=a.url, timeout=60) as c:
        sid = create(c)
        for b in first:
            observe(c, sid, b)
        early = attribute(c, sid)
    with Running(make_app(ruleset, tmp_path)) as b, httpx.Client(base_url=b.url, timeout=60) as c:
        info = c.get(f"/v2/sessions/{sid}").json()
        assert info["evidence"]["batches"] == 2 and info["attributions"] == 1
        assert observe(c, sid, first[0])["stored"] is False  # a retry after the restart is still a retry
        for bt in rest:
            observe(c, sid, bt)
        late = attribute(c, sid)
        assert late["attribution"] == 2 and late["diagnosis"]["culprit"]["nodes"] == ["node-a"]
        hist = c.get(f"/v2/sessions/{sid}/verdicts").json()["verdicts"]
        assert comparable(hist[0]["diagnosis"]) == comparable(early["diagnosis"])


def test_sessions_expire_and_are_bounded(ruleset, tmp_path):
    app = make_app(ruleset, tmp_path, session_ttl_s=2.0, max_sessions=2, max_session_lines=5)
    with Running(app) as s, httpx.Client(base_url=s.url, timeout=60) as c:
        a = create(c)
        create(c)
        assert_error(c.post("/v2/sessions", json={"job_id": "3"}), 429, "too_many_sessions")
        too_many = {"batch_id": "x", "logs": [{"file": "a.log", "lines": ["l"] * 6}]}
        body = assert_error(c.post(f"/v2/sessions/{a}/observations", json=too_many), 413, "session_too_large")
        assert "5 lines" in body["detail"]
        samples = {"batch_id": "m", "metrics": {"resultType": "matrix", "result": [
            {"metric": {"__name__": "x"}, "values": [[1795687300 + i, "1"] for i in range(6)]}]}}
        body = assert_error(c.post(f"/v2/sessions/{a}/observations", json=samples), 413, "session_too_large")
        assert "metric samples" in body["detail"]
        time.sleep(2.2)
        assert_error(c.get(f"/v2/sessions/{a}"), 404, "session_not_found")
        assert_error(c.post(f"/v2/sessions/{a}/attribute"), 404, "session_not_found")
        create(c)  # the expired ones were swept: room again
        create(c)


@pytest.mark.parametrize("body,error", [
    ({"logs": []}, "invalid_request"),                                                  # no batch_id
    ({"batch_id": "", "logs": []}, "invalid_request"),
    ({"batch_id": "a\nb"}, "invalid_request"),
    ({"batch_id": "b", "logs": [{"file": "../x", "lines": ["a"]}]}, "invalid_file"),
    ({"batch_id": "b", "logs": [{"lines": ["a"], "source": "weird"}]}, "invalid_request"),
    ({"batch_id": "b", "loki": {"resultType": "matrix", "result": []}}, "invalid_request"),
    ({"batch_id": "b", "loki": [{"stream": {}, "values": [["not-ns", "x"]]}]}, "invalid_request"),
    ({"batch_id": "b", "metrics": {"resultType": "scalar", "result": [1, "2"]}}, "invalid_request"),
    ({"batch_id": "b", "scheduler": {"state": "EXPLODED"}}, "invalid_request"),
    ({"batch_id": "b", "node_events": [{"node": "n", "kind": "drain", "ts": "0001-01-01T00:00:00+05:00"}]},
     "invalid_request"),
    ({"batch_id": "b", "unknown": 1}, "invalid_request"),
])
def test_bad_observations_get_400(http, body, error):
    sid = create(http)
    assert_error(http.post(f"/v2/sessions/{sid}/observations", json=body), 400, error)
    assert http.get(f"/v2/sessions/{sid}").json()["evidence"]["batches"] == 0


def test_other_session_refusals(http):
    assert_error(http.post("/v2/sessions", json={"cluster": "../x", "job_id": "1"}), 400, "invalid_request")
    assert_error(http.post("/v2/sessions", json={"job_id": "1", "ranks": [-1]}), 400, "invalid_request")
    assert_error(http.post("/v2/sessions", content=b"job_id=1", headers={"content-type": "text/plain"}), 415,
                 "unsupported_media_type")
    assert_error(http.get("/v2/sessions/s-nope"), 404, "session_not_found")
    sid = create(http)
    assert http.delete(f"/v2/sessions/{sid}").status_code == 204
    assert_error(http.get(f"/v2/sessions/{sid}"), 404, "session_not_found")


# ---------------------------------------------------------------- the action guard

def xid_job(node: str) -> dict:
    return {"batch_id": f"{node}-logs", "logs": [{"file": f"{node}/syslog", "lines": [XID.replace("node-a", node)]}],
            "scheduler": {"state": "FAILED"}}


def session_for(c, cluster, job, nodes, batch) -> str:
    r = c.post("/v2/sessions", json={"cluster": cluster, "job_id": job, "nodes": nodes})
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    observe(c, sid, batch)
    return sid


def test_guard_drains_only_unambiguous_high_confidence_verdicts_within_budgets(ruleset, tmp_path):
    eight = [f"node-{x}" for x in "abcdefgh"]
    app = make_app(ruleset, tmp_path, drains_per_cluster_hour=1, drains_per_job=1, drain_max_fraction=0.25)
    with Running(app) as s, httpx.Client(base_url=s.url, timeout=60) as c:
        # one culprit of eight nodes, high confidence: approved, and the budget spent once
        sid = session_for(c, "c9", "1", eight, xid_job("node-a"))
        a = attribute(c, sid)["diagnosis"]
        assert a["confidence"] == "high" and not a["ambiguous"]
        act = a["recommended_action"]
        assert (act["action"], act["targets"], act["guard"]["approved"]) == ("drain_node", ["node-a"], True)
        again = attribute(c, sid)["diagnosis"]["recommended_action"]  # re-attributing spends nothing more
        assert again["action"] == "drain_node"
        # the cluster's hourly budget (1) is used: the next job's drain goes to a person, and says why
        other = attribute(c, session_for(c, "c9", "2", eight, xid_job("node-e")))["diagnosis"]["recommended_action"]
        assert other["action"] == "human_review" and other["targets"] == ["node-e"]
        assert "c9" in other["reason"] and "budget is 1" in other["reason"] and "drain_node" in other["reason"]
        assert other["guard"]["engine_action"]["action"] == "drain_node"
        # another cluster has its own budget
        assert attribute(c, session_for(c, "c10", "2", eight, xid_job("node-e")))["diagnosis"][
            "recommended_action"]["action"] == "drain_node"
        # a job of two nodes: one culprit is half of it, over the fraction
        half = attribute(c, session_for(c, "c11", "3", ["node-a", "node-b"], xid_job("node-a")))["diagnosis"]
        assert half["recommended_action"]["action"] == "human_review" and "0.25" in half["recommended_action"]["reason"]
        # ambiguous or not high confidence: never automatic
        amb = session_for(c, "c12", "4", eight, {"batch_id": "w", "logs": [
            {"file": "node-b/train.log", "lines": [watchdog(2, "10:12:08")]}]})
        d = attribute(c, amb)["diagnosis"]
        assert d["recommended_action"]["action"] == "human_review"
        assert d["ambiguous"] or d["confidence"] != "high"
    # budgets are kept in DuckDB: they hold after a restart
    with Running(make_app(ruleset, tmp_path, drains_per_cluster_hour=1)) as s, \
            httpx.Client(base_url=s.url, timeout=60) as c:
        late = attribute(c, session_for(c, "c9", "5", eight, xid_job("node-f")))["diagnosis"]["recommended_action"]
        assert late["action"] == "human_review" and "already had 1" in late["reason"]
