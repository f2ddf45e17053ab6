"""Verdict callbacks against a local receiver: HMAC signature, retries with backoff, deliveries recorded."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from faultline.service import webhooks
from faultline.service.webhooks import sign, verify

from .test_service import Running
from .test_sessions import attribute, make_app, observe, xid_job

SECRET = "a-webhook-secret-of-some-length"


class Receiver:
    """A webhook receiver on 127.0.0.1 that answers `statuses` in turn (then 200) and keeps what it got."""

    def __init__(self, statuses=()):
        self.statuses, self.got = list(statuses), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                outer.got.append(({k.lower(): v for k, v in self.headers.items()}, body, time.monotonic()))
                status = outer.statuses.pop(0) if outer.statuses else 200
                self.send_response(status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def wait_for(fn, timeout=15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_a_final_verdict_is_delivered_signed_with_retries_and_recorded(ruleset, tmp_path, monkeypatch):
    monkeypatch.setenv("FAULTLINE_WEBHOOK_SECRET", SECRET)
    rx = Receiver(statuses=[500, 503])
    try:
        app = make_app(ruleset, tmp_path, webhook_url=rx.url, webhook_retries=4, webhook_backoff_s=0.1)
        with Running(app) as s, httpx.Client(base_url=s.url, timeout=60) as c:
            sid = c.post("/v2/sessions", json={"cluster": "c1", "job_id": "7",
                                               "nodes": [f"node-{x}" for x in "abcdefgh"]}).json()["session_id"]
            observe(c, sid, xid_job("node-a"))
            attribute(c, sid)  # not final: no callback
            time.sleep(0.3)
            assert rx.got == []
            t0 = time.monotonic()
            final = attribute(c, sid, final=True)
            assert time.monotonic() - t0 < 2  # the answer does not wait for the webhook
            wait_for(lambda: len(rx.got) == 3)
            rows = wait_for(lambda: (r := c.get(f"/v2/sessions/{sid}/deliveries").json())["count"] == 3 and r)
        headers, body, _ = rx.got[-1]
        assert verify(SECRET.encode(), headers["x-faultline-timestamp"], body, headers["x-faultline-signature"])
        assert not verify(b"another-secret-entirely", headers["x-faultline-timestamp"], body,
                          headers["x-faultline-signature"])
        assert not verify(SECRET.encode(), headers["x-faultline-timestamp"], body + b" ", headers["x-faultline-signature"])
        sent = json.loads(body)
        assert sent["event"] == "faultline.diagnosis.completed" and sent["session_id"] == sid and sent["final"]
        assert sent["diagnosis"]["culprit"]["nodes"] == ["node-a"] == final["diagnosis"]["culprit"]["nodes"]
        assert sent["diagnosis"]["recommended_action"]["guard"]["approved"] is True
        assert headers["x-faultline-delivery"] == f"{sid}:2"
        gaps = [b[2] - a[2] for a, b in zip(rx.got, rx.got[1:])]
        assert gaps[0] >= 0.095 and gaps[1] >= 0.19  # exponential backoff: waits of 0.1 s, then 0.2 s (at least)
        d = rows["deliveries"]
        assert [(x["attempt"], x["status"], x["delivered"]) for x in d] == [(1, 500, False), (2, 503, False), (3, 200, True)]
    finally:
        rx.close()


def test_a_refusing_or_absent_receiver_is_recorded_not_retried_forever(tmp_path):
    class Store:
        def __init__(self):
            self.rows = []

        def record_delivery(self, *row):
            self.rows.append(row)

    rx = Receiver(statuses=[401])
    result = {"session_id": "s-x", "attribution": 1, "final": True, "diagnosis": {}}
    try:
        st = Store()
        assert webhooks.deliver(st, rx.url, b"k" * 16, result, retries=3, backoff_s=0.01) is False
        assert [(r[3], r[4], r[6]) for r in st.rows] == [(1, 401, False)]  # a 4xx is final
    finally:
        rx.close()
    st = Store()
    assert webhooks.deliver(st, rx.url, b"k" * 16, result, retries=2, backoff_s=0.01, timeout_s=1) is False
    assert [r[3] for r in st.rows] == [1, 2, 3] and all(r[4] is None and "Error" in r[5] for r in st.rows)


def test_signature_and_secret_rules(monkeypatch):
    body, ts = b'{"x":1}', "1795687320"
    assert verify(b"s" * 16, ts, body, sign(b"s" * 16, ts, body), now=1795687320 + 10)
    assert not verify(b"s" * 16, ts, body, sign(b"s" * 16, ts, body), now=1795687320 + 3600)  # a replay
    from faultline.service.settings import Settings
    monkeypatch.delenv("FAULTLINE_WEBHOOK_SECRET", raising=False)
    with pytest.raises(ValueError, match="FAULTLINE_WEBHOOK_SECRET"):
        webhooks.secret_from_env(Settings(webhook_url="http://127.0.0.1:9/hook"))
    assert webhooks.secret_from_env(Settings()) is None


def test_a_prefect_event_is_emitted_when_prefect_is_configured(monkeypatch):
    import prefect.events
    sent = []
    monkeypatch.setattr(prefect.events, "emit_event", lambda **kw: sent.append(kw))
    result = {"session_id": "s-1", "attribution": 2, "diagnosis": {"cluster": "c", "job_id": "7", "outcome": "gpu_hardware"}}
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert webhooks.emit_prefect_event(result) is False and sent == []
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    assert webhooks.emit_prefect_event(result) is True
    assert sent[0]["event"] == "faultline.diagnosis.completed"
    assert sent[0]["resource"]["prefect.resource.id"] == "faultline.session.s-1"
