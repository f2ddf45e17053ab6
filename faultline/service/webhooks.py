"""Verdict callbacks: every final session verdict is POSTed to a configured webhook (docs/service.md).

The body is JSON: `{"event": "faultline.diagnosis.completed", "session_id", "attribution", "final",
"coverage", "diagnosis"}`. It is signed: `X-Faultline-Signature: sha256=<hex>` is the HMAC-SHA256, keyed
with the secret in `$FAULTLINE_WEBHOOK_SECRET`, of `<X-Faultline-Timestamp>.<body bytes>`; a receiver
recomputes it, compares in constant time and refuses old timestamps (replays). A delivery is retried
(tenacity: exponential backoff from `webhook_backoff_s`, doubling, at most 60 s between attempts,
`webhook_retries` retries) on a connection error, a timeout, 408, 429 or any 5xx; any other 4xx is final.
Every attempt is recorded in the session store (`deliveries`: attempt, status, error, delivered), read
back at `GET /v2/sessions/{id}/deliveries`. A Prefect event of the same name is emitted too when a
Prefect API is configured (`PREFECT_API_URL`), so Prefect automations can act on verdicts.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import time

import httpx
import tenacity

log = logging.getLogger("faultline.service")
EVENT = "faultline.diagnosis.completed"
RETRY_STATUSES = (408, 429)


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def verify(secret: bytes, timestamp: str, body: bytes, signature: str, max_age_s: float = 300,
           now: float | None = None) -> bool:
    """What a receiver does: the signature matches, and the timestamp is recent."""
    now = time.time() if now is None else now
    try:
        fresh = abs(now - float(timestamp)) <= max_age_s
    except ValueError:
        return False
    return fresh and hmac.compare_digest(sign(secret, timestamp, body), signature)


class RetryableStatus(Exception):
    def __init__(self, status: int):
        super().__init__(f"HTTP {status}")
        self.status = status


def payload(result: dict) -> bytes:
    return json.dumps({"event": EVENT, **result}, ensure_ascii=False, separators=(",", ":"), default=str).encode()


def deliver(store, url: str, secret: bytes, result: dict, retries: int = 5, backoff_s: float = 1.0,
            timeout_s: float = 10.0) -> bool:
    """POST one verdict to `url` until it is accepted or the retries are spent; every attempt recorded."""
    body = payload(result)
    sid, n = result["session_id"], result["attribution"]
    attempt = {"n": 0}

    def once() -> None:
        attempt["n"] += 1
        ts = str(int(time.time()))
        headers = {"content-type": "application/json", "x-faultline-event": EVENT, "x-faultline-timestamp": ts,
                   "x-faultline-signature": sign(secret, ts, body), "x-faultline-delivery": f"{sid}:{n}"}
        try:
            r = httpx.post(url, content=body, headers=headers, timeout=timeout_s)
        except httpx.HTTPError as exc:
            store.record_delivery(sid, n, url, attempt["n"], None, f"{type(exc).__name__}: {exc}"[:300], False)
            raise
        ok = 200 <= r.status_code < 300
        store.record_delivery(sid, n, url, attempt["n"], r.status_code, None if ok else r.text[:300], ok)
        if r.status_code >= 500 or r.status_code in RETRY_STATUSES:
            raise RetryableStatus(r.status_code)
        if not ok:
            raise PermissionError(f"the webhook refused the verdict: HTTP {r.status_code}")

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(retries + 1),
        wait=tenacity.wait_exponential(multiplier=backoff_s, min=backoff_s, max=60),
        retry=tenacity.retry_if_exception_type((httpx.HTTPError, RetryableStatus)), reraise=True)
    try:
        retrying(once)
        return True
    except Exception as exc:  # spent or refused: recorded; the verdict itself stands
        log.warning("webhook delivery of %s attribution %s to %s failed after %d attempt(s): %s",
                    sid, n, url, attempt["n"], exc)
        return False


def emit_prefect_event(result: dict) -> bool:
    """The same verdict as a Prefect event, when a Prefect API is configured; False when not sent."""
    if not os.environ.get("PREFECT_API_URL"):
        return False
    try:
        from prefect.events import emit_event

        d = result["diagnosis"]
        emit_event(event=EVENT, resource={"prefect.resource.id": f"faultline.session.{result['session_id']}",
                                          "faultline.cluster": str(d.get("cluster")),
                                          "faultline.job_id": str(d.get("job_id"))},
                   payload={"outcome": d.get("outcome"), "culprit": d.get("culprit"),
                            "recommended_action": d.get("recommended_action"), "attribution": result["attribution"]})
        return True
    except Exception as exc:
        log.warning("Prefect event %s for %s not emitted: %s", EVENT, result.get("session_id"), exc)
        return False


def secret_from_env(settings) -> bytes | None:
    """The webhook's HMAC key; a webhook without one refuses to start (unsigned verdicts could be forged)."""
    if not settings.webhook_url:
        return None
    value = os.environ.get(settings.webhook_secret_env, "")
    if len(value) < 16:
        raise ValueError(f"--webhook-url needs an HMAC secret of at least 16 characters in ${settings.webhook_secret_env}")
    return value.encode()
