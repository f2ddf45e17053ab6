"""Issue 10, defects 5 and 9: the service against a hostile browser page and hostile or broken clients.
One named regression test per defect, each against a real uvicorn server on 127.0.0.1 run exactly as
`faultline serve` runs it (its protocol class, timeouts and limits)."""

import json
import logging
import socket
import time

import httpx
import pytest

from faultline.service.app import create_app
from faultline.service.models import DiagnosisOut, ErrorOut
from faultline.service.settings import Settings

from .test_service import JOB, OOM, Running, assert_error, files_json


@pytest.fixture(scope="module")
def hardened(ruleset, tmp_path_factory):
    """Short timeouts so that each defect shows in well under a second."""
    tmp = tmp_path_factory.mktemp("hardened")
    settings = Settings(config=None, tmp_dir=tmp, max_body_mb=8, max_json_mb=3, body_slots=1, queue_timeout_s=0.3,
                        header_timeout_s=0.6, read_timeout_s=0.6, body_timeout_s=2.0, keep_alive_s=1,
                        allowed_hosts=("faultline.internal",), allowed_origins=("https://ops.example.org",))
    import os
    cwd = os.getcwd()
    os.chdir(tmp)  # no data/faultline.yaml here: inline diagnosis only
    try:
        app = create_app(settings, ruleset)
    finally:
        os.chdir(cwd)
    with Running(app) as running:
        yield running


@pytest.fixture
def client(hardened):
    with httpx.Client(base_url=hardened.url, timeout=30) as c:
        yield c


def raw(server: Running, data: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    if data:
        s.sendall(data)
    return s


def read_all(s: socket.socket, limit_s: float = 10) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took."""
    t0 = time.monotonic()
    s.settimeout(limit_s)
    out = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    return out, time.monotonic() - t0


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def body_of(response: bytes) -> dict:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])


# ---------------------------------------------------------------- defect 5: the service trusts the browser

def test_regression_cross_site_form_and_multipart_posts_are_refused(client, hardened):
    files = {"files": ("slurm-1.out", OOM.encode())}
    # What a hostile page's <form enctype="multipart/form-data"> or urlencoded form sends: an Origin of its own.
    r = client.post("/v1/diagnose", files=files, headers={"origin": "http://evil.example"})
    assert_error(r, 403, "cross_origin")
    r = client.post("/v1/diagnose", data={"cluster": "a", "job_id": "1"}, headers={"origin": "null"})
    assert_error(r, 403, "cross_origin")  # sandboxed frames and file:// pages send `null`
    r = client.post("/v1/diagnose", content=b"x", headers={"content-type": "text/plain", "sec-fetch-site": "cross-site"})
    assert_error(r, 403, "cross_origin")
    r = client.post("/v1/diagnose", files=files, headers={"referer": "http://evil.example/page.html"})
    assert_error(r, 403, "cross_origin")
    # Refused before the body is read: a 1 GiB declared body gets its 403 at once.
    s = raw(hardened, b"POST /v1/diagnose HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://evil.example\r\n"
                      b"Content-Type: multipart/form-data; boundary=x\r\nContent-Length: 1073741824\r\n\r\n")
    out, took = read_all(s)
    assert status_of(out) == 403 and took < 2
    # Not refused: curl / recovery systems (no Origin), the service's own pages (same origin), allowed origins.
    assert client.post("/v1/diagnose", files=files).status_code == 200
    assert client.post("/v1/diagnose", files=files, headers={"origin": hardened.url}).status_code == 200
    assert client.post("/v1/diagnose", files=files, headers={"origin": "https://ops.example.org"}).status_code == 200
    assert client.get("/healthz", headers={"origin": "http://evil.example"}).status_code == 200  # reads: no body


def test_regression_host_header_must_be_an_allowed_name(client):
    # DNS rebinding: the page's own name, now resolving to 127.0.0.1, arrives as the Host header.
    for host in ("evil.example", "evil.example:8080", "127.0.0.1.evil.example", ""):
        assert_error(client.get("/v1/diagnoses", headers={"host": host}), 400, "invalid_host")
    for host in ("localhost", "localhost:8080", "127.0.0.1", "[::1]:8080", "FAULTLINE.internal:443"):
        assert client.get("/healthz", headers={"host": host}).status_code == 200, host
    assert Settings(allowed_hosts=("*",)).host_allowed("anything.example")


def test_regression_idle_and_slow_head_connections_are_closed(hardened, client):
    # A connection that sends nothing, one that trickles its head, and an idle kept-alive one: all closed.
    silent = raw(hardened)
    trickle = raw(hardened, b"GET /healthz HTTP/1.1\r\n")
    out, took = read_all(silent)
    assert out == b"" and took < 3
    trickle.sendall(b"Host: 127.0.0.1\r\n")
    out, took = read_all(trickle)
    assert out == b"" and took < 3
    kept = raw(hardened, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    out, took = read_all(kept)
    assert status_of(out) == 200 and took < 3  # answered, then closed after keep-alive (1 s)
    assert client.get("/healthz").status_code == 200


def test_regression_a_slow_body_gets_408_and_holds_no_worker(hardened, client):
    head = (b"POST /v1/diagnose HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 5000\r\n\r\n")
    stalled = raw(hardened, head + b'{"files": [')  # then nothing
    assert client.get("/healthz").json()["workers"]["running"] == 0  # reading a body takes no worker
    out, took = read_all(stalled)
    assert status_of(out) == 408 and body_of(out)["error"] == "request_timeout" and took < 3
    # A body that keeps trickling (never a long pause) still ends at the total body timeout (2 s).
    trickling = raw(hardened, head)
    t0 = time.monotonic()
    trickling.settimeout(0.3)
    got = b""
    while time.monotonic() - t0 < 6 and not got:
        try:
            trickling.sendall(b" ")
            got = trickling.recv(65536)
        except socket.timeout:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
    assert got and status_of(got) == 408 and time.monotonic() - t0 < 4
    # Multipart too.
    mp = raw(hardened, b"POST /v1/diagnose HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; "
                       b"boundary=b\r\nContent-Length: 5000\r\n\r\n--b\r\nContent-Disposition: form-data; "
                       b"name=\"files\"; filename=\"a.log\"\r\n\r\nabc")
    out, _ = read_all(mp)
    assert status_of(out) == 408


def test_regression_json_bodies_are_bounded_and_gated_before_decoding(hardened, client):
    big = json.dumps({"files": [{"name": "a.log", "text": "x" * (3 << 20)}]}).encode()  # over --max-json-mb 3
    assert_error(client.post("/v1/diagnose", content=big, headers={"content-type": "application/json"}),
                 413, "payload_too_large")
    def chunks():  # undeclared length: counted as it streams
        for i in range(0, len(big), 1 << 16):
            yield big[i:i + (1 << 16)]
    assert_error(client.post("/v1/diagnose", content=chunks(), headers={"content-type": "application/json"}),
                 413, "payload_too_large")
    # A large body waits for one of the JSON slots (1 here): while one is being received, the next gets 503.
    holder = raw(hardened, b"POST /v1/diagnose HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 2500000\r\n\r\n" + b" " * 100)
    deadline = time.monotonic() + 5
    while client.get("/healthz").json()["json_slots"]["held"] != 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    body = json.dumps({"files": [{"name": "t.log", "text": OOM + "\n" + "y" * (2 << 20)}]}).encode()
    r = client.post("/v1/diagnose", content=body, headers={"content-type": "application/json"})
    assert_error(r, 503, "busy")
    assert int(r.headers["retry-after"]) >= 1 and "JSON" in r.json()["detail"]
    holder.close()
    deadline = time.monotonic() + 5
    while client.get("/healthz").json()["json_slots"]["held"] != 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    r = client.post("/v1/diagnose", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json()["outcome"] == "cuda_oom"
    # Small bodies never wait for a slot.
    assert client.post("/v1/diagnose", json={"files": files_json(JOB)}).json()["outcome"] == "gpu_hardware"


def test_regression_a_client_disconnect_is_not_logged_as_500(hardened, caplog):
    with caplog.at_level(logging.INFO, logger="faultline.service"):
        for ctype, part in ((b"application/json", b'{"files": ['),
                            (b"multipart/form-data; boundary=b",
                             b"--b\r\nContent-Disposition: form-data; name=\"files\"; filename=\"a\"\r\n\r\nx")):
            s = raw(hardened, b"POST /v1/diagnose HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: " + ctype
                    + b"\r\nContent-Length: 5000\r\n\r\n" + part)
            time.sleep(0.1)
            s.close()
        deadline = time.monotonic() + 5
        while caplog.text.count("client disconnected") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert caplog.text.count("client disconnected") == 2
    assert "unhandled error" not in caplog.text and "Traceback" not in caplog.text
    assert " 500 " not in caplog.text


@pytest.mark.parametrize("since", ["999999d", "99999999s", "0001-01-01T00:00:00+05:00",
                                   "9999-12-31T23:59:59-05:00", "0001-01-01", "9999-12-31", "1969-12-31"])
def test_regression_since_far_ages_and_dates_are_400(client, since):
    body = assert_error(client.get("/v1/diagnoses", params={"since": since}), 400, "invalid_request")
    assert "since" in body["detail"]


@pytest.mark.parametrize("body", [
    b"[" * 100_000 + b"]" * 100_000,                                   # deeper than Python's recursion limit
    b'{"files": ' + b"[" * 500 + b"]" * 500 + b"}",                    # within it, deeper than the API's 32
    b'{"job_id": ' + b'{"a": ' * 50 + b"1" + b"}" * 50 + b"}",
])
def test_regression_deeply_nested_json_is_400(client, body):
    r = client.post("/v1/diagnose", content=body, headers={"content-type": "application/json"})
    assert_error(r, 400, "invalid_json")


# ---------------------------------------------------------------- defect 9: the OpenAPI schema

def test_regression_openapi_lists_the_real_answers_with_models(client):
    schema = client.get("/openapi.json").json()
    text = json.dumps(schema)
    assert '"422"' not in text and "HTTPValidationError" not in text
    op = schema["paths"]["/v1/diagnose"]["post"]["responses"]
    for status in ("400", "404", "413", "503"):
        assert op[status]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorOut"}
    ok = op["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/DiagnosisOut"}
    assert "culprit" in schema["components"]["schemas"]["DiagnosisOut"]["properties"]
    for path, method in (("/v1/diagnoses", "get"), ("/v1/diagnoses/{cluster}/{job_id}", "get")):
        resp = schema["paths"][path][method]["responses"]
        assert "400" in resp and resp["200"]["content"]["application/json"]["schema"] != {}
    # What the service answers fits what it documents.
    d = client.post("/v1/diagnose", json={"files": files_json(JOB)}).json()
    assert DiagnosisOut.model_validate(d).culprit.nodes == ["node-a"]
    ErrorOut.model_validate(client.get("/v1/diagnoses", params={"limit": 0}).json())


def test_docs_and_redoc_work_offline(client):
    import re
    for page, asset in (("/docs", "/static/swagger-ui-bundle.js"), ("/redoc", "/static/redoc.standalone.js")):
        html = client.get(page)
        assert html.status_code == 200 and asset in html.text
        # nothing loaded from elsewhere: every src/href is a path of this service
        urls = re.findall(r'(?:src|href)\s*=\s*["\']([^"\']+)', html.text)
        assert urls and all(u.startswith("/") for u in urls), urls
        js = client.get(asset)
        assert js.status_code == 200 and len(js.content) > 100_000
    assert client.get("/static/swagger-ui.css").status_code == 200
    assert "/docs" not in client.get("/openapi.json").json()["paths"]


def test_regression_many_idle_and_slow_connections_are_all_released(hardened, client):
    # the review held 150 slow-body and 50 idle connections open for 40 s; here every one is closed by
    # the head or body timeout, and the service answers others meanwhile
    head = (b"POST /v1/diagnose HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n{")
    idle = [raw(hardened) for _ in range(30)]
    slow = [raw(hardened, head) for _ in range(30)]
    assert client.get("/healthz").status_code == 200
    t0 = time.monotonic()
    outs = [read_all(s, 10) for s in idle + slow]
    assert time.monotonic() - t0 < 6
    assert all(out == b"" for out, _ in outs[:30])
    assert all(status_of(out) == 408 for out, _ in outs[30:])
    assert client.get("/healthz").json()["workers"]["running"] == 0
