"""The attribution service (faultline serve): a real uvicorn server on a free port, httpx as the client;
FastAPI's TestClient where a socket adds nothing."""

import base64
import json
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from faultline.cli import build_parser
from faultline.fleet.config import ConfigError, write_config
from faultline.pipeline import diagnose_files
from faultline.rules.loader import BUILTIN_PACKS
from faultline.service import app as service_app
from faultline.service.app import create_app
from faultline.service.jobs import relativize
from faultline.service.queries import ORDER_RECENT, SUMMARY_COLUMNS, Filters, build_query, parse_since
from faultline.service.server import uvicorn_config
from faultline.service.settings import Settings
from faultline.service.uploads import BadUpload, safe_name

from .fleet_fixture import write_sim

XID = ("Nov 20 10:02:00 node-a kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, "
       "GPU has fallen off the bus.")


def watchdog(rank: int, t: str) -> str:
    return (f"[rank{rank}]:[E1120 {t}.408271257 ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
            "ran for 600060 milliseconds before timing out.")


# One job: a GPU falls off the bus on node-a; node-b's ranks only notice (watchdog timeouts).
JOB = {
    "node-a/syslog": XID + "\n",
    "node-a/train.log": "[rank0]: step 10 loss 2.2\n[rank1]: step 10 loss 2.2\n",
    "node-b/train.log": "[rank2]: step 10 loss 2.2\n" + watchdog(2, "10:12:08") + "\n" + watchdog(3, "10:12:09") + "\n",
}
OOM = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
MAX_BODY_MB = 1


# ---------------------------------------------------------------- a real server

class Running:
    """The app under uvicorn exactly as `faultline serve` runs it (its protocol, timeouts, limits)."""

    def __init__(self, app, settings: Settings | None = None, **tls):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))  # a free port, held from here on: no race with other tests
        self.port = self.sock.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        settings = settings or app.state.settings
        self.server = uvicorn.Server(uvicorn_config(app, settings, log_level="warning", **tls))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The fixture fleet (cluster alpha) plus a cluster whose scheduler cannot be asked."""
    tmp = tmp_path_factory.mktemp("service-fleet")
    sim = write_sim(tmp / "sim")
    data = tmp / "data"
    write_config(data, [{"name": "alpha", "scheduler": {"kind": "sacct_files", "path": str(sim)},
                         "logs": {"kind": "loki_files", "path": str(sim)}},
                        {"name": "broken", "scheduler": {"kind": "sacct", "command": str(tmp / "no-such-sacct")}}])
    return data


@pytest.fixture(scope="module")
def server(fleet, ruleset, tmp_path_factory):
    uploads = tmp_path_factory.mktemp("service-uploads")
    app = create_app(Settings(config=fleet / "faultline.yaml", max_body_mb=MAX_BODY_MB, tmp_dir=uploads), ruleset)
    with Running(app) as running:
        running.uploads = uploads
        yield running


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def files_json(files: dict[str, str]) -> list[dict]:
    return [{"name": k, "text": v} for k, v in files.items()]


def write_job(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return root


def comparable(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "diagnosed_at"}


def assert_error(r: httpx.Response, status: int, error: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "detail"} and body["error"] == error, body
    assert "Traceback" not in r.text
    return body


# ---------------------------------------------------------------- inline diagnosis

def test_inline_json_gives_the_verdict_of_diagnose_files(http, ruleset, tmp_path):
    r = http.post("/v1/diagnose", json={"job_id": "4711", "cluster": "c1", "state": "FAILED",
                                        "files": files_json(JOB)})
    assert r.status_code == 200, r.text
    got = r.json()
    assert r.headers["x-faultline-ruleset"] == ruleset.version == got["ruleset"]["version"]
    assert got["outcome"] == "gpu_hardware" and got["culprit"]["nodes"] == ["node-a"]
    assert got["affected"]["nodes"] == ["node-b"] and got["recommended_action"]["targets"] == ["node-a"]
    assert (got["cluster"], got["job_id"]) == ("c1", "4711")
    # The files as they were uploaded, not where the server kept them for a moment.
    assert got["evidence"][0]["file"] == "node-a/syslog" and got["evidence"][0]["line"] == XID
    assert not any(server_path in r.text for server_path in ("faultline-serve-", "/tmp/"))
    # Exactly what `faultline diagnose` gives for the same files (state and id passed the same way).
    root = write_job(tmp_path / "job", JOB)
    want = relativize(diagnose_files([root], ruleset, job_id="4711", cluster="c1", state="FAILED"), root)
    assert comparable(got) == comparable(json.loads(json.dumps(want, default=str)))


def test_multipart_upload_keeps_folders_and_takes_the_slurm_id(http, ruleset):
    files = [("files", (name, text.encode(), "text/plain")) for name, text in JOB.items()]
    r = http.post("/v1/diagnose", files=files, data={"job_id": "88", "state": "failed"})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["outcome"] == "gpu_hardware" and d["culprit"]["nodes"] == ["node-a"] and d["job_id"] == "88"
    assert "node-a/syslog" in {e["file"] for e in d["evidence"]}  # the folder survived the upload
    # `curl -F files=@slurm-4711.out`: one file, the job id from its name (as `faultline diagnose` does)
    line = "slurmstepd: error: *** JOB 4711 ON gpu017 CANCELLED AT 2026-11-20T11:01:00 DUE TO TIME LIMIT ***\n"
    r = http.post("/v1/diagnose", files={"files": ("slurm-4711.out", line.encode())})
    assert r.status_code == 200, r.text
    assert (r.json()["job_id"], r.json()["outcome"], r.json()["culprit"]["nodes"]) == ("4711", "scheduler_timelimit", [])


def test_invalid_utf8_empty_and_corrupt_files_are_diagnosed_with_coverage_saying_so(http, server):
    files = [("files", ("node-a/train.log", OOM.encode() + b"\n\xff\xfe garbage \xc3\x28 line\n")),
             ("files", ("empty.log", b"")),
             ("files", ("node-a/dmesg.log.gz", b"not gzip at all"))]
    r = http.post("/v1/diagnose", files=files)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["outcome"] == "cuda_oom" and d["culprit"]["ranks"] == [1]
    cov = {c["source"]: c for c in d["coverage"]}
    assert "train.log: ok (3 invalid byte sequence(s) replaced)" in cov["applog"]["reason"]
    assert "empty.log: empty" in cov["applog"]["reason"]
    assert cov["syslog"]["status"] == "error" and "dmesg.log.gz: error" in cov["syslog"]["reason"]
    # the same bytes inline as base64 (wrapped as `base64` wraps), and lone surrogates in JSON text
    b64 = base64.encodebytes(OOM.encode() + b"\n\xff\xfe\n").decode()
    body = {"files": [{"name": "train.log", "base64": b64}, {"name": "other.log", "text": "bad \udcff\ud800 text\n"}]}
    r = http.post("/v1/diagnose", content=json.dumps(body).encode(), headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    reason = {c["source"]: c for c in r.json()["coverage"]}["applog"]["reason"]
    assert "train.log: ok (2 invalid byte sequence(s) replaced)" in reason and "other.log: ok" in reason
    assert list(server.uploads.iterdir()) == []  # every upload folder is removed after its diagnosis


# ---------------------------------------------------------------- refused requests

def test_oversize_bodies_get_413(http):
    big = "x" * (MAX_BODY_MB << 20)
    r = http.post("/v1/diagnose", json={"files": [{"name": "a.log", "text": big}]})  # declared Content-Length
    assert_error(r, 413, "payload_too_large")

    def chunks():  # no Content-Length: counted as it streams
        for _ in range(2 * MAX_BODY_MB * 16):
            yield b"y" * (1 << 16)
    r = http.post("/v1/diagnose", content=chunks(), headers={"content-type": "application/json"})
    assert_error(r, 413, "payload_too_large")
    r = http.post("/v1/diagnose", files={"files": ("big.log", big.encode())})
    assert_error(r, 413, "payload_too_large")
    assert http.get("/healthz").status_code == 200  # and the server is fine


@pytest.mark.parametrize("body,error", [
    (b'{"files": [', "invalid_json"),
    (b"\xff\xfe not json", "invalid_json"),
    (b"", "invalid_json"),
    (b"[1, 2]", "invalid_request"),
    (b'{"job_id": "1", "jobid": "2", "files": [{"name": "a", "text": "x"}]}', "invalid_request"),
    (b'{"state": "EXPLODED", "files": [{"name": "a", "text": "x"}]}', "invalid_request"),
    (b'{"files": [{"name": "a", "text": "x", "base64": "eA=="}]}', "invalid_request"),
    (b'{"files": [{"name": "a", "base64": "not base64!"}]}', "invalid_file"),
    (b'{"files": []}', "invalid_file"),
    (b'{"files": [{"name": "../etc/passwd", "text": "x"}]}', "invalid_file"),
    (b'{"files": [{"name": "node-a/../../x", "text": "x"}]}', "invalid_file"),
    (b'{"files": [{"name": "/etc/passwd", "text": "x"}]}', "invalid_file"),
    (b'{"files": [{"name": "C:\\\\logs\\\\x", "text": "x"}]}', "invalid_file"),
    (b'{"files": [{"name": "..\\\\x", "text": "x"}]}', "invalid_file"),
    (b'{"files": [{"name": "a/b", "text": "x"}, {"name": "a/./b", "text": "y"}]}', "invalid_file"),
    (b'{"files": [{"name": "a", "text": "x"}, {"name": "a/b", "text": "y"}]}', "invalid_file"),
    (b'{"cluster": "alpha"}', "invalid_request"),
    (b'{"cluster": "alpha", "job_id": "1001", "state": "FAILED"}', "invalid_request"),
    (b'{"cluster": "../alpha", "job_id": "1001"}', "invalid_request"),
])
def test_malformed_requests_get_400(http, body, error):
    r = http.post("/v1/diagnose", content=body, headers={"content-type": "application/json"})
    assert_error(r, 400, error)


def test_other_refusals(http):
    r = http.post("/v1/diagnose", files={"files": ("../../etc/cron.d/x", b"boom")})
    assert_error(r, 400, "invalid_file")
    r = http.post("/v1/diagnose", files={"logs": ("a.log", b"x")})
    assert_error(r, 400, "invalid_request")
    r = http.post("/v1/diagnose", data={"cluster": "alpha"})  # form fields, urlencoded: by reference
    assert_error(r, 400, "invalid_request")
    r = http.post("/v1/diagnose", content=b"hello", headers={"content-type": "text/plain"})
    assert_error(r, 415, "unsupported_media_type")
    assert_error(http.get("/v1/nothing-here"), 404, "not_found")
    assert_error(http.get("/v1/diagnose"), 405, "method_not_allowed")


# ---------------------------------------------------------------- by reference and stored diagnoses

def test_by_reference_diagnosis_is_stored_and_read_back(http, ruleset):
    r = http.post("/v1/diagnose", json={"cluster": "alpha", "job_id": "1001"})
    assert r.status_code == 200, r.text
    d = r.json()
    assert (d["cluster"], d["job_id"], d["outcome"]) == ("alpha", "1001", "gpu_hardware")
    assert d["culprit"]["nodes"] == ["gpu001"] and d["affected"]["nodes"] == ["gpu002"]
    assert d["ruleset"]["version"] == ruleset.version

    stored = http.get("/v1/diagnoses/alpha/1001")
    assert stored.status_code == 200, stored.text
    assert stored.json() == d
    again = http.post("/v1/diagnose", data={"cluster": "alpha", "job_id": "1001"})  # as form fields (curl -d)
    assert again.status_code == 200 and comparable(again.json()) == comparable(d)
    d = again.json()  # stored anew (same verdict, new diagnosed_at)
    assert http.get("/v1/diagnoses/alpha/1001", params={"attempt": 0}).json() == d
    assert_error(http.get("/v1/diagnoses/alpha/1001", params={"attempt": 3}), 404, "diagnosis_not_found")
    assert_error(http.get("/v1/diagnoses/alpha/1001", params={"ruleset": "0000000000000000"}), 404,
                 "diagnosis_not_found")
    assert_error(http.get("/v1/diagnoses/alpha/1001", params={"attempt": -1}), 400, "invalid_request")

    listed = http.get("/v1/diagnoses", params={"cluster": "alpha"}).json()
    assert listed["ruleset"]["version"] == ruleset.version and listed["limit"] == 100
    row = next(x for x in listed["diagnoses"] if x["job_id"] == "1001")
    assert row["outcome"] == "gpu_hardware" and row["culprit_nodes"] == ["gpu001"]
    assert set(row) == set(SUMMARY_COLUMNS) and row["end_time"] == "2026-11-20T10:13:00Z"

    def ids(**params):
        r = http.get("/v1/diagnoses", params=params)
        assert r.status_code == 200, r.text
        return [x["job_id"] for x in r.json()["diagnoses"]]
    assert ids(outcome="gpu_hardware") == ["1001"]
    assert ids(outcome="cuda_oom") == []
    assert ids(since="2026-11-20") == ["1001"] and ids(since="2026-11-20T10:14:00Z") == []
    assert ids(since="2026-11-21T00:00:00+01:00") == []
    assert ids(since="9999d") == ["1001"]
    assert ids(cluster="alpha' OR 1=1 --") == []  # a value, never SQL
    assert ids(limit=1) == ["1001"]
    for bad in ({"limit": 0}, {"limit": 1001}, {"outcome": "cosmic_rays"}, {"since": "last tuesday"}):
        assert_error(http.get("/v1/diagnoses", params=bad), 400, "invalid_request")


def test_unknown_job_or_cluster_is_404_and_a_failing_scheduler_502(http):
    body = assert_error(http.post("/v1/diagnose", json={"cluster": "alpha", "job_id": "999999"}), 404, "job_not_found")
    assert "999999" in body["detail"]
    assert_error(http.post("/v1/diagnose", json={"cluster": "gamma", "job_id": "1001"}), 404, "job_not_found")
    assert_error(http.get("/v1/diagnoses/alpha/999999"), 404, "diagnosis_not_found")
    body = assert_error(http.post("/v1/diagnose", json={"cluster": "broken", "job_id": "1"}), 502, "source_failed")
    assert "no-such-sacct" in body["detail"] and "broken" in body["detail"]


def test_healthz_and_rules(http, ruleset):
    h = http.get("/healthz")
    assert h.status_code == 200
    body = h.json()
    assert body["status"] == "ok" and body["ruleset"]["version"] == ruleset.version and body["uptime_s"] > 0
    assert body["workers"]["max"] == 2 and body["fleet_configured"] is True
    rules = http.get("/v1/rules").json()
    assert rules["ruleset"]["version"] == ruleset.version and rules["rules"] == len(ruleset.rules)
    per_pack = {p["pack"]: p for p in rules["packs"]}
    assert list(per_pack) == list(ruleset.packs)
    assert sum(p["rules"] for p in rules["packs"]) == len(ruleset.rules)
    assert per_pack["nvidia"]["lookup_rows"] > 100  # the Xid catalog is data, not one rule per Xid


# ---------------------------------------------------------------- workers, limits, start-up

def test_a_full_queue_gets_503_and_the_event_loop_stays_free(ruleset, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    release = threading.Event()

    def slow(job, rs, tmp_dir, limits=None):  # stands in for a long diagnosis: holds its worker until released
        release.wait(10)
        return {"outcome": "healthy", "job_id": job.job_id}

    monkeypatch.setattr(service_app, "diagnose_inline", slow)
    app = create_app(Settings(workers_max=1, queue_timeout_s=0.3), ruleset)
    body = {"job_id": "1", "files": [{"name": "a.log", "text": "x"}]}
    with Running(app) as running, httpx.Client(base_url=running.url, timeout=30) as client, \
            ThreadPoolExecutor(2) as ex:
        first = ex.submit(client.post, "/v1/diagnose", json=body)
        deadline = time.monotonic() + 10
        while client.get("/healthz").json()["workers"]["running"] != 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        t0 = time.monotonic()
        h = client.get("/healthz")  # answered while the only worker is busy
        assert h.status_code == 200 and time.monotonic() - t0 < 0.25
        second = client.post("/v1/diagnose", json=body)
        assert_error(second, 503, "busy")
        assert int(second.headers["retry-after"]) >= 1
        release.set()
        assert first.result().status_code == 200 and first.result().json()["outcome"] == "healthy"


def test_one_log_line_per_request(ruleset, caplog, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="faultline.service"), \
            TestClient(create_app(Settings(), ruleset), base_url="http://localhost") as client:
        client.get("/healthz")
        client.get("/v1/diagnoses/x/1")
    lines = [r.getMessage() for r in caplog.records if r.name == "faultline.service"]
    assert any(m.startswith("GET /healthz 200 ") and m.endswith(" ms") for m in lines)
    assert any(m.startswith("GET /v1/diagnoses/x/1 404 ") for m in lines)


def test_without_a_fleet_config_inline_still_works(ruleset, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no data/faultline.yaml here
    with TestClient(create_app(Settings(), ruleset), base_url="http://localhost") as client:
        r = client.post("/v1/diagnose", json={"cluster": "alpha", "job_id": "1001"})
        assert_error(r, 501, "fleet_not_configured")
        assert client.post("/v1/diagnose", json={"files": [{"name": "t.log", "text": OOM}]}).json()["outcome"] == "cuda_oom"
        assert_error(client.get("/v1/diagnoses/alpha/1001"), 404, "diagnosis_not_found")
        assert client.get("/v1/diagnoses").json()["diagnoses"] == []
        assert client.get("/healthz").json()["fleet_configured"] is False


def test_an_unexpected_error_is_a_json_500_without_a_traceback(ruleset, monkeypatch, tmp_path, caplog):
    monkeypatch.chdir(tmp_path)

    def broken(*_):
        raise RuntimeError("secret internals at /srv/x.py line 3")

    monkeypatch.setattr(service_app, "diagnose_inline", broken)
    with caplog.at_level(logging.ERROR, logger="faultline.service"), \
            TestClient(create_app(Settings(), ruleset), base_url="http://localhost") as client:
        r = client.post("/v1/diagnose", json={"files": [{"name": "t.log", "text": OOM}]})
    body = assert_error(r, 500, "internal_error")
    assert "secret" not in r.text and r.headers["x-faultline-ruleset"] == ruleset.version
    assert "secret internals" in caplog.text  # the operator still sees it, in the server's log
    assert body["detail"]


def test_start_up_loads_the_rules_options_and_refuses_a_missing_config(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    app = create_app(Settings(rules=(str(BUILTIN_PACKS / "slurm"),), builtin=False))
    with TestClient(app, base_url="http://localhost") as client:
        rules = client.get("/v1/rules").json()
        assert [p["pack"] for p in rules["packs"]] == ["slurm"] and rules["rules"] > 0
        assert client.get("/healthz").headers["x-faultline-ruleset"] == rules["ruleset"]["version"]
    with pytest.raises(ConfigError):
        create_app(Settings(config=tmp_path / "nope" / "faultline.yaml"))


def test_serve_command_line():
    args = build_parser().parse_args(["serve", "--port", "9999", "--max-body-mb", "64", "--workers-max", "3",
                                      "--config", "d/faultline.yaml", "--rules", "r1", "--no-builtin"])
    s = Settings.from_args(args)
    assert (args.host, args.port) == ("127.0.0.1", 9999)
    assert s.max_body_bytes == 64 << 20 and s.workers_max == 3 and s.rules == ("r1",) and s.builtin is False
    assert s.config == Path("d/faultline.yaml") and s.queue_timeout_s == 30
    with pytest.raises(ValueError):
        Settings(workers_max=0)


# ---------------------------------------------------------------- pure parts

@pytest.mark.parametrize("name,want", [("node-a/syslog", "node-a/syslog"), ("a\\b.log", "a/b.log"),
                                       ("./x//y/", "x/y"), ("slurm-1.out", "slurm-1.out")])
def test_safe_names(name, want):
    assert str(safe_name(name)) == want


@pytest.mark.parametrize("name", ["", "..", "a/../..", "/abs", "\\\\server\\share\\x", "C:x", "a\x00b", "x" * 300])
def test_unsafe_names(name):
    with pytest.raises(BadUpload):
        safe_name(name)


def test_queries_bind_every_value():
    since = datetime(2026, 11, 20, 12, tzinfo=timezone.utc)
    f = Filters(cluster="a'; DROP TABLE x; --", outcome="gpu_hardware", since=since, ruleset="r")
    sql, params = build_query(f, "v1", 10, SUMMARY_COLUMNS, ORDER_RECENT)
    assert "DROP" not in sql and "gpu_hardware" not in sql and "v1" not in sql
    assert sql.count("?") == len(params) and params[0] == f.cluster and params[-1] == 10
    assert parse_since("2h", since) == datetime(2026, 11, 20, 10, tzinfo=timezone.utc)
    assert parse_since("2026-11-20", since) == datetime(2026, 11, 20, tzinfo=timezone.utc)
    with pytest.raises(ValueError):
        parse_since("yesterday", since)


def test_every_answer_has_the_documented_key_order_and_shape(http):
    from faultline.service.jobs import DIAGNOSIS_KEYS
    inline = http.post("/v1/diagnose", json={"files": files_json(JOB)}).json()
    ref = http.post("/v1/diagnose", json={"cluster": "alpha", "job_id": "1001"}).json()
    stored = http.get("/v1/diagnoses/alpha/1001").json()
    for d in (inline, ref, stored):
        assert list(d) == list(DIAGNOSIS_KEYS), list(d)
    done = http.post("/v1/diagnose", json={"cluster": "alpha", "job_id": "1002"}).json()  # COMPLETED
    assert list(done) == list(DIAGNOSIS_KEYS) and done["outcome"] == "healthy"
    assert done["recommended_action"]["action"] == "no_action" and done["culprit"]["nodes"] == []
