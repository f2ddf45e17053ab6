"""The typed client (faultline.client) against a real server: one-shot, a session round trip, errors."""

import pytest

from faultline.client import FaultlineClient, FaultlineError, LogLines

from .test_service import JOB, OOM, XID, Running, watchdog
from .test_sessions import make_app


@pytest.fixture(scope="module")
def url(ruleset, tmp_path_factory):
    with Running(make_app(ruleset, tmp_path_factory.mktemp("client"))) as s:
        yield s.url


def test_client_round_trip(url):
    with FaultlineClient(url) as fl:
        assert fl.health()["status"] == "ok"
        d = fl.diagnose_files(JOB, job_id="4711", state="FAILED")
        assert (d.outcome, d.culprit_nodes, d.affected_nodes) == ("gpu_hardware", ["node-a"], ["node-b"])
        assert d.action.action == "drain_node" and d.action.approved is None  # /v1: the engine's own action
        s = fl.create_session("4711", cluster="c1", nodes=[f"node-{x}" for x in "abcdefgh"])
        fl.observe(s.session_id, "epilog", scheduler={"state": "FAILED", "exit_code": 1})
        ack = fl.observe(s.session_id, "victims", logs=[LogLines("node-b/train.log", [watchdog(2, "10:12:08")])])
        assert ack.stored and ack.lines == 1
        assert fl.observe(s.session_id, "victims", logs=[LogLines("node-b/train.log", [watchdog(2, "10:12:08")])]).stored is False
        first = fl.attribute(s.session_id)
        assert first.action.action == "human_review" and any("node-a" in m for m in first.missing)
        fl.observe(s.session_id, "syslog", logs=[LogLines("node-a/syslog", [XID])])
        a = fl.attribute(s.session_id, final=True)
        assert (a.attribution, a.final, a.diagnosis.culprit_nodes) == (2, True, ["node-a"])
        assert a.action.action == "drain_node" and a.action.approved is True
        assert [v.attribution for v in fl.verdicts(s.session_id)] == [1, 2]
        assert fl.session(s.session_id).final is True


def test_client_errors_are_typed(url):
    with FaultlineClient(url) as fl:
        with pytest.raises(FaultlineError) as e:
            fl.session("s-missing")
        assert (e.value.status, e.value.error) == (404, "session_not_found")
        with pytest.raises(FaultlineError) as e:
            fl.diagnose_job("alpha", "1")
        assert (e.value.status, e.value.error) == (501, "fleet_not_configured")
        assert fl.diagnose_files({"t.log": OOM}).outcome == "cuda_oom"
