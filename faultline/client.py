"""A small typed client of the attribution service (`faultline serve`, docs/service.md), on httpx.

    from faultline.client import FaultlineClient

    with FaultlineClient("http://127.0.0.1:8080", token=os.environ.get("FAULTLINE_TOKEN")) as fl:
        s = fl.create_session(cluster="alpha", job_id="4711", nodes=["gpu001", "gpu002"])
        fl.observe(s.session_id, "epilog", scheduler={"state": "FAILED", "exit_code": 1})
        fl.observe(s.session_id, "node-logs", logs=[LogLines("gpu001/syslog", ["...Xid 79..."])])
        a = fl.attribute(s.session_id, final=True)
        if a.action.action == "drain_node":
            drain(a.action.targets)

Every error answer raises `FaultlineError` (status, error code, detail, Retry-After). A 503 `busy` or
a 429 is retried (honouring Retry-After) up to `retries` times; nothing else is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx


class FaultlineError(Exception):
    def __init__(self, status: int, error: str, detail: Any, retry_after: float | None = None):
        super().__init__(f"{status} {error}: {detail}")
        self.status, self.error, self.detail, self.retry_after = status, error, detail, retry_after


@dataclass(frozen=True)
class LogLines:
    """One stream's lines for `observe`: named as a file would be (node-a/syslog), with an offset."""

    file: str
    lines: list[str]
    node: str | None = None
    rank: int | None = None
    source: str | None = None
    offset: int | None = None

    def as_json(self) -> dict:
        return {k: v for k, v in {"file": self.file, "lines": self.lines, "node": self.node, "rank": self.rank,
                                  "source": self.source, "offset": self.offset}.items() if v is not None}


@dataclass(frozen=True)
class Action:
    action: str
    targets: list[str]
    reason: str
    approved: bool | None = None  # the action guard's answer (sessions); None for /v1/diagnose
    engine_action: dict | None = None


@dataclass(frozen=True)
class Diagnosis:
    outcome: str
    root_cause: str
    culprit_nodes: list[str]
    culprit_ranks: list[int]
    affected_nodes: list[str]
    ambiguous: bool
    confidence: str
    action: Action
    raw: dict = field(repr=False)

    @classmethod
    def of(cls, d: dict) -> Diagnosis:
        a = d.get("recommended_action") or {"action": "human_review", "targets": [], "reason": ""}
        guard = a.get("guard") or {}
        return cls(d["outcome"], d.get("root_cause", ""), (d.get("culprit") or {}).get("nodes", []),
                   (d.get("culprit") or {}).get("ranks", []), (d.get("affected") or {}).get("nodes", []),
                   bool(d.get("ambiguous")), d.get("confidence", ""),
                   Action(a["action"], a.get("targets", []), a.get("reason", ""), guard.get("approved"),
                          guard.get("engine_action")), d)


@dataclass(frozen=True)
class Session:
    session_id: str
    cluster: str
    job_id: str
    expires_at: str
    final: bool
    batches: int
    lines: int
    raw: dict = field(repr=False)

    @classmethod
    def of(cls, s: dict) -> Session:
        return cls(s["session_id"], s["cluster"], s["job_id"], s["expires_at"], s["final"],
                   s["evidence"]["batches"], s["evidence"]["lines"], s)


@dataclass(frozen=True)
class Attribution:
    session_id: str
    attribution: int
    final: bool
    diagnosis: Diagnosis
    missing: list[str]
    raw: dict = field(repr=False)

    @property
    def action(self) -> Action:
        return self.diagnosis.action

    @classmethod
    def of(cls, r: dict) -> Attribution:
        return cls(r["session_id"], r["attribution"], r["final"], Diagnosis.of(r["diagnosis"]),
                   r["coverage"].get("missing", []), r)


@dataclass(frozen=True)
class Ack:
    batch_id: str
    stored: bool
    batches: int
    lines: int


class FaultlineClient:
    def __init__(self, base_url: str, token: str | None = None, timeout: float = 120.0, retries: int = 3,
                 transport: httpx.BaseTransport | None = None, verify: Any = True):
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.retries = retries
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout, transport=transport,
                                  verify=verify)

    def __enter__(self) -> FaultlineClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kw) -> Any:
        for attempt in range(self.retries + 1):
            r = self._http.request(method, path, **kw)
            if r.status_code < 400:
                return r.json() if r.content else None
            try:
                body = r.json()
            except ValueError:
                body = {"error": "http_error", "detail": r.text[:300]}
            ra = r.headers.get("retry-after")
            err = FaultlineError(r.status_code, body.get("error", "http_error"), body.get("detail"),
                                 float(ra) if ra and ra.replace(".", "", 1).isdigit() else None)
            if r.status_code in (429, 503) and attempt < self.retries:
                time.sleep(min(err.retry_after or 1.0, 30.0))
                continue
            raise err
        raise AssertionError("unreachable")

    # ---- one-shot
    def diagnose_files(self, files: dict[str, str | bytes], job_id: str | None = None, cluster: str | None = None,
                       state: str | None = None, exit_code: int | None = None) -> Diagnosis:
        """POST /v1/diagnose with the files inline (multipart upload; names keep their folders)."""
        data = {k: str(v) for k, v in {"job_id": job_id, "cluster": cluster, "state": state,
                                       "exit_code": exit_code}.items() if v is not None}
        up = [("files", (name, c.encode() if isinstance(c, str) else c)) for name, c in files.items()]
        return Diagnosis.of(self._call("POST", "/v1/diagnose", files=up, data=data))

    def diagnose_job(self, cluster: str, job_id: str) -> Diagnosis:
        """POST /v1/diagnose by reference to a job of a configured cluster."""
        return Diagnosis.of(self._call("POST", "/v1/diagnose", json={"cluster": cluster, "job_id": job_id}))

    def stored_diagnosis(self, cluster: str, job_id: str, attempt: int | None = None) -> Diagnosis:
        params = {"attempt": attempt} if attempt is not None else None
        return Diagnosis.of(self._call("GET", f"/v1/diagnoses/{cluster}/{job_id}", params=params))

    # ---- sessions
    def create_session(self, job_id: str, cluster: str = "local", attempt: int = 0, nodes: list[str] = (),
                       ranks: list[int] = (), window: dict | None = None, scheduler: dict | None = None) -> Session:
        body = {"cluster": cluster, "job_id": job_id, "attempt": attempt, "nodes": list(nodes), "ranks": list(ranks)}
        if window:
            body["window"] = window
        if scheduler:
            body["scheduler"] = scheduler
        return Session.of(self._call("POST", "/v2/sessions", json=body))

    def session(self, session_id: str) -> Session:
        return Session.of(self._call("GET", f"/v2/sessions/{session_id}"))

    def observe(self, session_id: str, batch_id: str, logs: list[LogLines] = (), loki: Any = None,
                metrics: Any = None, scheduler: dict | None = None, node_events: list[dict] = ()) -> Ack:
        """One observation batch. Retrying it with the same batch_id is safe: it is stored once."""
        body: dict = {"batch_id": batch_id}
        if logs:
            body["logs"] = [x.as_json() for x in logs]
        for k, v in (("loki", loki), ("metrics", metrics), ("scheduler", scheduler)):
            if v is not None:
                body[k] = v
        if node_events:
            body["node_events"] = list(node_events)
        r = self._call("POST", f"/v2/sessions/{session_id}/observations", json=body)
        return Ack(r["batch_id"], r["stored"], r["evidence"]["batches"], r["evidence"]["lines"])

    def attribute(self, session_id: str, final: bool = False) -> Attribution:
        return Attribution.of(self._call("POST", f"/v2/sessions/{session_id}/attribute", json={"final": final}))

    def verdicts(self, session_id: str) -> list[Attribution]:
        return [Attribution.of(v) for v in self._call("GET", f"/v2/sessions/{session_id}/verdicts")["verdicts"]]

    def delete_session(self, session_id: str) -> None:
        self._call("DELETE", f"/v2/sessions/{session_id}")

    def health(self) -> dict:
        return self._call("GET", "/healthz")
