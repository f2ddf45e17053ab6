"""Collector: the Kubernetes API, for the pods of a job, their container states, logs and events.

The I/O is an injected `httpx.Client` (its base URL the API server); `connection()` builds one from a
kubeconfig (server, CA, bearer token or token file, client certificate; inline `*-data` too) or from
the in-cluster service account. Exec credential plugins and auth providers are refused with a clear
message (faultline does not run programs named in a kubeconfig).

Requests: lists are paged with `limit`/`continue`; an expired continue token (410 Gone, reason
Expired) restarts the list once from the beginning, a second expiry is reported. Timeouts, refused
connections, 429 and 5xx are retried with jittered backoff (tenacity, through `collectors.http`); any
other status is reported at once with the API's own Status message ("pods is forbidden: ...").

What a failed job's pods say becomes log lines the rule packs read (packs/kubernetes), printed as
`kubectl describe` / `kubectl get events` print them, each with the pod's node as its node:

    pod <ns>/<pod> container <c>: State: Terminated, Reason: OOMKilled, Exit Code: 137, Signal: 9,
        Restart Count: 2, Started: <t>, Finished: <t>[, Disruption: <reason>][, Message: <msg>]
    pod <ns>/<pod> container <c>: Last State: Terminated, Reason: ..., Exit Code: ... (lastState)
    pod <ns>/<pod>: Status: Failed, Reason: Evicted, Message: The node was low on resource: memory. ...
    pod <ns>/<pod>: Condition: DisruptionTarget True, Reason: PreemptionByScheduler, Message: ...
    <Type>  <Reason>  <kind>/<name>  <component>[, <host>]  <message>        (an Event; x<count> if repeated)
    node <node>: Condition: <type> <status>, Reason: <reason>, Message: <message>   (unhealthy ones only)

They are source `k8s_event`; the containers' own output (current, and the previous container's when
it restarted) is `applog`, the kubelet's RFC 3339 timestamps (`timestamps=true`) as the line's time.
"""

from __future__ import annotations

import base64
import os
import re
import ssl
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable
from urllib.parse import quote, urlsplit

import httpx
import polars as pl
import tenacity
import yaml

from faultline.collectors.http import checked_answer, json_answer
from faultline.logparse import TS_DTYPE

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
LINE_SCHEMA = {"node": pl.String, "source": pl.String, "file": pl.String, "ts": TS_DTYPE, "line": pl.String}

# Pods of a job by the owner kind of its Kueue workload: the label each controller puts on its pods.
DEFAULT_POD_SELECTORS = {
    "PyTorchJob": "training.kubeflow.org/job-name={name}",  # Kubeflow training-operator v1
    "TFJob": "training.kubeflow.org/job-name={name}",
    "XGBoostJob": "training.kubeflow.org/job-name={name}",
    "PaddleJob": "training.kubeflow.org/job-name={name}",
    "JAXJob": "training.kubeflow.org/job-name={name}",
    "MPIJob": "training.kubeflow.org/job-name={name}",      # mpi-operator v2beta1
    "JobSet": "jobset.sigs.k8s.io/jobset-name={name}",
    "Job": "batch.kubernetes.io/job-name={name}",           # Kubernetes >= 1.27 (older: job-name={name})
    "RayJob": "ray.io/cluster={name}",
    "Pod": "kueue.x-k8s.io/pod-group-name={name}",          # a Kueue pod group (plain pods)
}


class KubeError(RuntimeError):
    """A request that failed for good; the message is what coverage records."""


class _Retryable(KubeError):
    pass


class KubeGone(KubeError):
    """410 Gone: a continue token (or resourceVersion) the API server no longer holds."""


class KubeBadRequest(KubeError):
    """400: e.g. `previous=true` for a container that never restarted."""


class KubeNotFound(KubeError):
    pass


@dataclass(frozen=True)
class KubeSettings:
    """`kubernetes:` of a `kind: kubernetes` cluster: how to reach its API server."""
    kubeconfig: str | None = None      # path; default $KUBECONFIG or ~/.kube/config unless in_cluster
    context: str | None = None         # default: the kubeconfig's current-context
    in_cluster: bool = False           # the pod's service account (KUBERNETES_SERVICE_HOST, SA token, CA)
    snapshot: str | None = None        # a folder of saved kubectl output instead of a server (kube_snapshot)
    timeout_s: float = 30.0
    retries: int = 3
    backoff_s: float = 0.5
    page_limit: int = 500              # items per list page

    @classmethod
    def from_config(cls, section: dict | None) -> "KubeSettings":
        section = dict(section or {})
        errors = []
        unknown = sorted(set(section) - set(cls.__dataclass_fields__))
        if unknown:
            errors.append(f"unknown key(s) {unknown}")
        values = {}
        for key in ("kubeconfig", "context", "snapshot"):
            v = section.get(key)
            if v is not None and (not isinstance(v, str) or not v):
                errors.append(f"{key} must be a non-empty string")
            values[key] = v
        v = section.get("in_cluster", False)
        if not isinstance(v, bool):
            errors.append(f"in_cluster must be true or false, got {v!r}")
        values["in_cluster"] = bool(v)
        if sum(bool(x) for x in (values["in_cluster"], values["kubeconfig"], values["snapshot"])) > 1:
            errors.append("give one of in_cluster: true, a kubeconfig or a snapshot folder")
        if values["snapshot"] and not Path(values["snapshot"]).is_dir():
            errors.append(f"snapshot {values['snapshot']!r} is not a folder")
        errors += _numbers(section, values, {"timeout_s": (float, 0, True), "retries": (int, 0, False),
                                             "backoff_s": (float, 0, False), "page_limit": (int, 1, False)}, cls)
        if errors:
            raise ValueError("; ".join(errors))
        return cls(**values)


def _numbers(section: dict, values: dict, spec: dict, cls) -> list[str]:
    errors = []
    for key, (kind, low, strict) in spec.items():
        v = section.get(key, cls.__dataclass_fields__[key].default)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not ok or (kind is int and not float(v).is_integer()) or v < low or (strict and v == low):
            errors.append(f"{key} must be {'an integer' if kind is int else 'a number'} "
                          f"{'>' if strict else '>='} {low}, got {v!r}")
            continue
        values[key] = kind(v)
    return errors


@dataclass(frozen=True)
class PodLogSettings:
    """`logs: {kind: kubernetes, ...}`: what is read of a failed job's pods."""
    previous: bool = True              # the previous container's log when a container restarted
    events: bool = True                # Events of the pods and of their nodes, and node conditions
    limit_bytes: int = 16 << 20        # per container log (the kubelet's limitBytes)
    tail_lines: int = 20000            # a log longer than limit_bytes: its last lines are read too
    containers: tuple[str, ...] = ()   # only these container names (default: all)
    node_events_namespace: str = "default"  # where the node controller and kubelet record Node events
    pod_selectors: dict = field(default_factory=lambda: dict(DEFAULT_POD_SELECTORS))
    max_parallel: int = 4              # jobs in flight
    tail_minutes: float = 5.0          # events read until this long after a job's end

    @classmethod
    def from_config(cls, section: dict | None) -> "PodLogSettings":
        section = dict(section or {})
        section.pop("kind", None)
        errors = []
        unknown = sorted(set(section) - set(cls.__dataclass_fields__))
        if unknown:
            errors.append(f"unknown key(s) {unknown}")
        values: dict = {}
        for key in ("previous", "events"):
            v = section.get(key, True)
            if not isinstance(v, bool):
                errors.append(f"{key} must be true or false, got {v!r}")
            values[key] = bool(v)
        c = section.get("containers", [])
        if not isinstance(c, list) or not all(isinstance(x, str) and x for x in c):
            errors.append("containers must be a list of container names")
            c = []
        values["containers"] = tuple(c)
        ns = section.get("node_events_namespace", "default")
        if not isinstance(ns, str) or not ns:
            errors.append("node_events_namespace must be a namespace name")
        values["node_events_namespace"] = str(ns)
        sel = section.get("pod_selectors", {})
        if not isinstance(sel, dict) or not all(isinstance(k, str) and isinstance(v, str) and "{name}" in v
                                                for k, v in sel.items()):
            errors.append("pod_selectors must map an owner kind (PyTorchJob, JobSet, ...) to a label selector "
                          "holding {name}, e.g. 'training.kubeflow.org/job-name={name}'")
            sel = {}
        values["pod_selectors"] = {**DEFAULT_POD_SELECTORS, **sel}
        errors += _numbers(section, values, {"limit_bytes": (int, 1, False), "tail_lines": (int, 1, False),
                                             "max_parallel": (int, 1, False),
                                             "tail_minutes": (float, 0, False)}, cls)
        if errors:
            raise ValueError("; ".join(errors))
        return cls(**values)


def pod_selector(settings: PodLogSettings, owner_kind: str | None, owner_name: str | None) -> str | None:
    """The label selector of a job's pods (None: an owner kind without a template)."""
    template = settings.pod_selectors.get(owner_kind or "")
    return template.format(name=owner_name) if template and owner_name else None


# ------------------------------------------------------------------ auth: kubeconfig or in-cluster

@dataclass
class Connection:
    server: str
    token: str | None = None
    verify: ssl.SSLContext | bool = True


def _b64(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=False)
    except ValueError:
        raise KubeError(f"kubeconfig: {what} is not base64") from None


def _ssl_context(ca_file: str | None, ca_data: bytes | None, cert: tuple[bytes, bytes] | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca_file, cadata=ca_data.decode() if ca_data else None)
    if cert:
        # ssl loads a client certificate only from files: private temp files, removed at once
        with tempfile.TemporaryDirectory(prefix="faultline-kube-") as d:
            crt, key = Path(d) / "c.crt", Path(d) / "c.key"
            for p, data in ((crt, cert[0]), (key, cert[1])):
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            ctx.load_cert_chain(str(crt), str(key))
    return ctx


def from_kubeconfig(path: Path, context: str | None = None) -> Connection:
    """The server, CA and credentials of `context` (default: current-context) of a kubeconfig file."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise KubeError(f"kubeconfig {path}: {type(exc).__name__}: {exc}"[:300]) from None
    base = path.parent
    named = lambda kind: {e.get("name"): e.get(kind[:-1]) or {} for e in doc.get(kind) or []  # noqa: E731
                          if isinstance(e, dict)}
    name = context or doc.get("current-context")
    contexts = named("contexts")
    if name not in contexts:
        raise KubeError(f"kubeconfig {path}: no context {name!r} (contexts: {sorted(c for c in contexts if c)})")
    ctx = contexts[name]
    cluster, user = named("clusters").get(ctx.get("cluster")), named("users").get(ctx.get("user"))
    if not cluster or not cluster.get("server"):
        raise KubeError(f"kubeconfig {path}: context {name!r} names cluster {ctx.get('cluster')!r}, "
                        "which has no server")
    user = user or {}
    if user.get("exec") or user.get("auth-provider"):
        raise KubeError(f"kubeconfig {path}: user {ctx.get('user')!r} gets credentials from an exec plugin or "
                        "auth provider, which faultline does not run; give it a token, tokenFile or client "
                        "certificate (e.g. a service account token)")
    rel = lambda p: str(p if Path(p).is_absolute() else base / p)  # noqa: E731 - relative to the kubeconfig
    token = user.get("token")
    if not token and user.get("tokenFile"):
        try:
            token = Path(rel(user["tokenFile"])).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise KubeError(f"kubeconfig {path}: tokenFile: {exc}") from None
    cert = None
    try:
        if user.get("client-certificate-data") or user.get("client-certificate"):
            crt = (_b64(user["client-certificate-data"], "client-certificate-data")
                   if user.get("client-certificate-data") else Path(rel(user["client-certificate"])).read_bytes())
            key = (_b64(user["client-key-data"], "client-key-data") if user.get("client-key-data")
                   else Path(rel(user.get("client-key") or "")).read_bytes())
            cert = (crt, key)
        if cluster.get("insecure-skip-tls-verify"):
            verify: ssl.SSLContext | bool = False if not cert else _insecure(cert)
        else:
            ca_data = _b64(cluster["certificate-authority-data"], "certificate-authority-data") \
                if cluster.get("certificate-authority-data") else None
            ca_file = rel(cluster["certificate-authority"]) if cluster.get("certificate-authority") else None
            verify = _ssl_context(ca_file, ca_data, cert) if (ca_file or ca_data or cert) else True
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise KubeError(f"kubeconfig {path}: credentials of user {ctx.get('user')!r}: {exc}"[:300]) from None
    return Connection(str(cluster["server"]).rstrip("/"), token, verify)


def _insecure(cert: tuple[bytes, bytes]) -> ssl.SSLContext:
    ctx = _ssl_context(None, None, cert)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def in_cluster(env: dict | None = None, sa_dir: Path = SA_DIR) -> Connection:
    """The service account of the pod faultline runs in."""
    env = os.environ if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubeError("in_cluster: KUBERNETES_SERVICE_HOST is not set (not running in a pod?)")
    try:
        token = (sa_dir / "token").read_text(encoding="utf-8").strip()
        verify = _ssl_context(str(sa_dir / "ca.crt"), None, None)
    except (OSError, ssl.SSLError) as exc:
        raise KubeError(f"in_cluster: service account files in {sa_dir}: {exc}") from None
    host = f"[{host}]" if ":" in host else host
    return Connection(f"https://{host}:{port}", token, verify)


def connection(s: KubeSettings, env: dict | None = None) -> Connection:
    env = os.environ if env is None else env
    if s.in_cluster:
        return in_cluster(env)
    path = s.kubeconfig or (env.get("KUBECONFIG") or "").split(os.pathsep)[0] or str(Path.home() / ".kube/config")
    return from_kubeconfig(Path(path).expanduser(), s.context)


def make_http(conn: Connection, timeout_s: float) -> httpx.Client:
    headers = {"Accept": "application/json"}
    if conn.token:
        headers["Authorization"] = f"Bearer {conn.token}"
    return httpx.Client(base_url=conn.server, headers=headers, verify=conn.verify, timeout=timeout_s)


# ------------------------------------------------------------------ requests

def status_reason(r: httpx.Response) -> str:
    """A Kubernetes Status body's reason and message; else the body's first bytes."""
    try:
        doc = r.json()
        if isinstance(doc, dict) and doc.get("kind") == "Status":
            return f"{doc.get('reason') or r.reason_phrase}: {doc.get('message') or ''}".strip()[:300]
    except ValueError:
        pass
    return " ".join(r.text.split())[:300] or r.reason_phrase


class KubeClient:
    """GETs against one API server, retried; thread-safe (one httpx.Client shared by a job pool)."""

    def __init__(self, settings: KubeSettings, http: httpx.Client | None = None, env: dict | None = None,
                 sleep: Callable[[float], None] | None = None):
        self.s = settings
        self._own = http is None
        if http is None and settings.snapshot:
            from faultline.collectors.kube_snapshot import SnapshotTransport

            http = httpx.Client(transport=SnapshotTransport(Path(settings.snapshot)), base_url="http://kube-snapshot")
            self._own = True
        self.http = http if http is not None else make_http(connection(settings, env), settings.timeout_s)
        self.requests = 0
        self._retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Retryable),
            stop=tenacity.stop_after_attempt(settings.retries + 1),
            wait=tenacity.wait_random_exponential(multiplier=settings.backoff_s, max=30),
            sleep=sleep or tenacity.nap.sleep, reraise=True)

    def close(self) -> None:
        if self._own:
            self.http.close()

    def _send(self, path: str, params: dict) -> httpx.Response:
        self.requests += 1
        r = self.http.get(path, params=params)
        for code, exc in ((410, KubeGone), (400, KubeBadRequest), (404, KubeNotFound)):
            if r.status_code == code:
                raise exc(f"HTTP {code}: {status_reason(r)}")
        return r

    def _retried(self, once: Callable[[], object]) -> object:
        try:
            return self._retrying(once)
        except _Retryable as exc:
            n = self.s.retries + 1
            raise KubeError(f"{exc} (gave up after {n} attempt{'s' if n > 1 else ''})") from None

    def get(self, path: str, params: dict | None = None) -> dict:
        doc = self._retried(lambda: json_answer(lambda: self._send(path, params or {}), str(self.http.base_url),
                                                self.s.timeout_s, KubeError, _Retryable, status_reason))
        if not isinstance(doc, dict):
            raise KubeError(f"GET {path}: the answer is not a JSON object")
        return doc

    def list(self, path: str, params: dict | None = None) -> list[dict]:
        """Every item of a list, page by page. An expired continue token restarts the list once."""
        restarted, items, token = False, [], None
        while True:
            p = {**(params or {}), "limit": str(self.s.page_limit)}
            if token:
                p["continue"] = token
            try:
                doc = self.get(path, p)
            except KubeGone as exc:
                if token is None or restarted:
                    raise KubeError(f"list {path}: {exc}" + (" (again, after restarting the list)" if restarted
                                                             else "")) from None
                restarted, items, token = True, [], None
                continue
            page = doc.get("items")
            if not isinstance(page, list) or not all(isinstance(i, dict) for i in page):
                raise KubeError(f"list {path}: the answer has no items list (kind {doc.get('kind')!r})")
            items += page
            token = (doc.get("metadata") or {}).get("continue") or None
            if not token:
                return items

    def log(self, namespace: str, pod: str, container: str, previous: bool = False,
            since: datetime | None = None, limit_bytes: int | None = None, tail_lines: int | None = None) -> str:
        """A container's log with the kubelet's timestamps."""
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/log"
        params = {"container": container, "timestamps": "true"}
        if previous:
            params["previous"] = "true"
        if since is not None:
            params["sinceTime"] = since.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        if limit_bytes:
            params["limitBytes"] = str(limit_bytes)
        if tail_lines:
            params["tailLines"] = str(tail_lines)

        def once() -> str:
            return checked_answer(lambda: self._send(path, params), str(self.http.base_url), self.s.timeout_s,
                                  KubeError, _Retryable, status_reason).text

        return self._retried(once)


# ------------------------------------------------------------------ pods -> lines

_LOG_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)) ?")


def parse_time(value) -> datetime | None:
    """An RFC 3339 time as the API prints it (`2026-03-01T10:00:00Z`, with fractions in logs)."""
    if not isinstance(value, str) or not value:
        return None
    v = value.replace("Z", "+00:00")
    m = re.match(r"^(.*T\d\d:\d\d:\d\d)(\.\d+)?(.*)$", v)
    if m and m.group(2):  # Python reads at most microseconds
        v = m.group(1) + m.group(2)[:7] + m.group(3)
    try:
        t = datetime.fromisoformat(v)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def log_lines(text: str, node: str | None, file: str) -> pl.DataFrame:
    """A `timestamps=true` log -> lines: the kubelet's time prefix becomes the line's time."""
    frame = pl.DataFrame({"raw": text.splitlines()}, schema={"raw": pl.String})
    if frame.height == 0:
        return pl.DataFrame(schema=LINE_SCHEMA)
    ts = pl.col("raw").str.extract(_LOG_TS.pattern, 1)
    return frame.select(
        node=pl.lit(node, pl.String), source=pl.lit("applog"), file=pl.lit(file),
        ts=ts.str.slice(0, 26).str.replace(r"Z$", "").str.to_datetime("%Y-%m-%dT%H:%M:%S%.f", time_unit="us",
                                                                       strict=False).dt.replace_time_zone("UTC"),
        line=pl.col("raw").str.replace(_LOG_TS.pattern, ""))


def _clean(text) -> str:
    return " ".join(str(text).split()) if text else ""


def _state_line(prefix: str, what: str, t: dict, disruption: str | None, restarts) -> str:
    parts = [f"{what}: Terminated", f"Reason: {t.get('reason') or 'Unknown'}", f"Exit Code: {t.get('exitCode')}"]
    if t.get("signal"):
        parts.append(f"Signal: {t['signal']}")
    parts.append(f"Restart Count: {restarts}")
    for key, label in (("startedAt", "Started"), ("finishedAt", "Finished")):
        if t.get(key):
            parts.append(f"{label}: {t[key]}")
    if disruption:
        parts.append(f"Disruption: {disruption}")
    if t.get("message"):
        parts.append(f"Message: {_clean(t['message'])[:500]}")
    return f"{prefix}: " + ", ".join(parts)


def pod_status_lines(pod: dict) -> list[dict]:
    """The lines `kubectl describe pod` would show for what ended: containers' terminated states (current and
    last), the pod's failure reason and message, its DisruptionTarget condition."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    ns, name, node = meta.get("namespace"), meta.get("name"), spec.get("nodeName")
    prefix = f"pod {ns}/{name}"
    file = f"k8s:pod/{ns}/{name}"
    out = []
    disruption = None
    for c in status.get("conditions") or []:
        if c.get("type") == "DisruptionTarget" and c.get("status") == "True":
            disruption = c.get("reason")
            out.append({"ts": parse_time(c.get("lastTransitionTime")),
                        "line": f"{prefix}: Condition: DisruptionTarget True, Reason: {c.get('reason')}, "
                                f"Message: {_clean(c.get('message'))[:500]}"})
    if status.get("reason") or status.get("message"):  # Evicted, DeadlineExceeded, NodeLost, Shutdown...
        out.append({"ts": parse_time(status.get("startTime")),
                    "line": f"{prefix}: Status: {status.get('phase')}, Reason: {status.get('reason') or ''}, "
                            f"Message: {_clean(status.get('message'))[:500]}"})
    for kind in ("initContainerStatuses", "containerStatuses"):
        for c in status.get(kind) or []:
            cprefix = f"{prefix} {'init container' if kind.startswith('init') else 'container'} {c.get('name')}"
            restarts = c.get("restartCount", 0)
            t = (c.get("state") or {}).get("terminated")
            if t and not (t.get("exitCode") == 0 and kind.startswith("init")):
                out.append({"ts": parse_time(t.get("finishedAt")),
                            "line": _state_line(cprefix, "State", t, disruption, restarts)})
            w = (c.get("state") or {}).get("waiting")
            if w and w.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
                out.append({"ts": None, "line": f"{cprefix}: State: Waiting, Reason: {w.get('reason')}, "
                                                f"Message: {_clean(w.get('message'))[:500]}"})
            lt = (c.get("lastState") or {}).get("terminated")
            if lt:
                out.append({"ts": parse_time(lt.get("finishedAt")),
                            "line": _state_line(cprefix, "Last State", lt, None, restarts)})
    return [{"node": node, "source": "k8s_event", "file": file, **r} for r in out]


def event_time(e: dict) -> datetime | None:
    """When an Event last happened: lastTimestamp (core/v1), else eventTime (events.k8s.io), else the series."""
    return (parse_time(e.get("lastTimestamp")) or parse_time(e.get("eventTime"))
            or parse_time((e.get("series") or {}).get("lastObservedTime"))
            or parse_time(e.get("firstTimestamp")) or parse_time((e.get("metadata") or {}).get("creationTimestamp")))


def event_line(e: dict) -> str:
    """An Event as `kubectl describe` lists it, with the object as `kubectl get events` names it."""
    obj = e.get("involvedObject") or {}
    src = e.get("source") or {}
    origin = src.get("component") or e.get("reportingComponent") or ""
    if src.get("host"):
        origin = f"{origin}, {src['host']}"
    count = e.get("count") or (e.get("series") or {}).get("count")
    times = f" (x{count})" if isinstance(count, int) and count > 1 else ""
    return (f"{e.get('type') or 'Normal'}  {e.get('reason') or ''}{times}  {str(obj.get('kind') or '').lower()}/"
            f"{obj.get('name')}  {origin or '-'}  {_clean(e.get('message'))[:1000]}")


def event_rows(events: list[dict], node: str | None, file: str, since: datetime, until: datetime) -> list[dict]:
    rows = []
    for e in events:
        t = event_time(e)
        if t is not None and not (since <= t <= until):
            continue
        rows.append({"node": node, "source": "k8s_event", "file": file, "ts": t, "line": event_line(e)})
    return rows


_HEALTHY = {"Ready": "True"}  # every other condition (MemoryPressure, DiskPressure, PIDPressure, ...) is bad when True


def node_condition_rows(node: dict, until: datetime) -> list[dict]:
    """A node's unhealthy conditions that began before `until` (Ready not True; pressure and problem-detector
    conditions True)."""
    name = (node.get("metadata") or {}).get("name")
    rows = []
    for c in (node.get("status") or {}).get("conditions") or []:
        kind, status = c.get("type"), c.get("status")
        healthy = status == _HEALTHY[kind] if kind in _HEALTHY else status != "True"
        t = parse_time(c.get("lastTransitionTime"))
        if healthy or (t is not None and t > until):
            continue
        rows.append({"node": name, "source": "k8s_event", "file": f"k8s:node/{name}", "ts": t,
                     "line": f"node {name}: Condition: {kind} {status}, Reason: {c.get('reason') or ''}, "
                             f"Message: {_clean(c.get('message'))[:500]}"})
    return rows


def lines_frame(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=LINE_SCHEMA) if rows else pl.DataFrame(schema=LINE_SCHEMA)


def valid_server(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.netloc)
