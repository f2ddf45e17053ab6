"""A protocol-faithful fake Kubernetes API server for tests (no cluster can run here; DESIGN.md "Real parts").

Built from the API conventions and apiserver/kubelet behaviour (kubernetes/kubernetes: staging/src/
k8s.io/apimachinery/pkg/apis/meta/v1 Status and ListMeta, apiserver storage/etcd3 continue tokens,
kubelet's container log options), not from faultline's client:

- `GET /api/v1/namespaces/{ns}/pods` (and `/api/v1/pods`): `labelSelector` (=, ==, !=, exists, !exists,
  in, notin; comma = and), `fieldSelector` (metadata.name, metadata.namespace, spec.nodeName,
  status.phase; others 400 "field label not supported: x"), `limit` + `continue` paging with
  `metadata.continue` and `remainingItemCount`; a continue token older than the compaction point is
  410 Gone, reason Expired, with the apiserver's message and an inconsistent-continue token.
- `GET /api/v1/namespaces/{ns}/pods/{name}/log`: `container` (required when the pod has several:
  400 "a container name must be specified ..."), `previous` (400 `previous terminated container "c"
  in pod "p" not found` when it never restarted), `sinceTime`, `limitBytes` (cuts bytes, even inside a
  line), `tailLines`, `timestamps` (RFC 3339 with nanoseconds, trailing zeros trimmed as Go prints it).
- `GET /api/v1/namespaces/{ns}/events`: fieldSelector involvedObject.{name,kind,namespace,uid}, reason,
  type; paged like pods.
- `GET /api/v1/nodes/{name}`; 404 Status `nodes "x" not found`.
- `GET /apis/kueue.x-k8s.io/v1beta1/namespaces/{ns}/workloads` (and cluster-wide): a custom resource
  list (WorkloadList), paged; fieldSelector metadata.name / metadata.namespace (what CRDs support).
- Bearer tokens: none or unknown -> 401 Unauthorized; a token without a permission -> 403 Forbidden
  with the RBAC message ("pods is forbidden: User ... cannot list resource ...").
Fault injection: `fault(kind, times, path)` for the next matching requests: "500", "503", "timeout"
(hangs past the client's timeout), "malformed" (a cut JSON body), "drop" (connection closed without an
answer), "expire" (the continue token is expired: 410); `stop()` takes the server down.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from collections import deque
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

USER = "system:serviceaccount:faultline:collector"
EXPIRED = ("The provided continue parameter is too old to display a consistent list result. You can start a new "
           "list without the continue parameter, or use the continue token in this response to retrieve the "
           "remainder of the results. Continuing with the provided token results in an inconsistent list - objects "
           "that were created, modified, or deleted between the time the first chunk was returned and now may show "
           "up in the list.")


def status(code: int, reason: str, message: str, details: dict | None = None, meta: dict | None = None) -> dict:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": meta or {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body


def rfc3339nano(t: datetime) -> str:
    base = t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    frac = f"{t.microsecond:06d}000".rstrip("0")
    return f"{base}.{frac}Z" if frac else f"{base}Z"


# ------------------------------------------------------------------ selectors
_REQ = re.compile(r"^\s*(?P<neg>!)?(?P<key>[A-Za-z0-9./_-]+)\s*(?:(?P<op>==|=|!=)\s*(?P<val>[A-Za-z0-9._-]*)"
                  r"|\s+(?P<set>in|notin)\s+\((?P<vals>[^)]*)\))?\s*$")


def _split(selector: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [p for p in [*out, cur] if p.strip()]


class SelectorError(ValueError):
    pass


def label_match(selector: str, labels: dict) -> bool:
    for part in _split(selector or ""):
        m = _REQ.match(part)
        if not m:
            raise SelectorError(f"unable to parse requirement: {part!r}")
        key, has = m.group("key"), m.group("key") in labels
        if m.group("neg"):
            ok = not has
        elif m.group("op") in ("=", "=="):
            ok = labels.get(key) == m.group("val")
        elif m.group("op") == "!=":
            ok = labels.get(key) != m.group("val")
        elif m.group("set"):
            vals = {v.strip() for v in m.group("vals").split(",")}
            ok = (labels.get(key) in vals) if m.group("set") == "in" else (labels.get(key) not in vals)
        else:
            ok = has
        if not ok:
            return False
    return True


def _path_get(obj: dict, dotted: str):
    for k in dotted.split("."):
        obj = obj.get(k) if isinstance(obj, dict) else None
    return obj


def field_match(selector: str, obj: dict, supported: tuple[str, ...]) -> bool:
    for part in _split(selector or ""):
        m = re.match(r"^\s*([A-Za-z.]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if not m:
            raise SelectorError(f"invalid field selector: {part!r}")
        key, op, val = m.groups()
        if key not in supported:
            raise SelectorError(f"field label not supported: {key}")
        have = _path_get(obj, key) or ""
        if (have == val) != (op in ("=", "==")):
            return False
    return True


POD_FIELDS = ("metadata.name", "metadata.namespace", "spec.nodeName", "status.phase", "spec.schedulerName")
EVENT_FIELDS = ("involvedObject.name", "involvedObject.kind", "involvedObject.namespace", "involvedObject.uid",
                "involvedObject.apiVersion", "reason", "type", "source", "metadata.name", "metadata.namespace")


class FakeKube:
    def __init__(self, tokens: dict[str, set[str]] | None = None):
        # token -> the permissions it has ("list pods", "get pods/log", "list events", "get nodes",
        # "list workloads"); "*" = all
        self.tokens = tokens if tokens is not None else {"good-token": {"*"}}
        self.pods: list[dict] = []
        self.events: list[dict] = []
        self.nodes: dict[str, dict] = {}
        self.workloads: list[dict] = []
        self.logs: dict[tuple[str, str, str, bool], list[tuple[datetime, str]]] = {}
        self.rv = 1000
        self.compacted = 0           # continue tokens of a resourceVersion <= this are expired
        self.faults: deque = deque()
        self.requests: list[tuple[str, dict]] = []
        self.hang_s = 3.0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------ state
    def add_pod(self, pod: dict, logs: dict[str, list[tuple[datetime, str]]] | None = None,
                previous: dict[str, list[tuple[datetime, str]]] | None = None) -> None:
        self.rv += 1
        pod.setdefault("metadata", {}).setdefault("resourceVersion", str(self.rv))
        self.pods.append(pod)
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        for c, lines in (logs or {}).items():
            self.logs[(ns, name, c, False)] = lines
        for c, lines in (previous or {}).items():
            self.logs[(ns, name, c, True)] = lines

    def delete_pod(self, ns: str, name: str) -> None:
        self.pods = [p for p in self.pods if (p["metadata"]["namespace"], p["metadata"]["name"]) != (ns, name)]
        self.logs = {k: v for k, v in self.logs.items() if (k[0], k[1]) != (ns, name)}

    def fault(self, kind: str, times: int = 1, path: str = "") -> None:
        for _ in range(times):
            self.faults.append((kind, path))

    def expire_tokens(self) -> None:
        """etcd compaction: every continue token handed out so far is now too old."""
        self.compacted = self.rv
        self.rv += 1

    # ------------------------------------------------------------ server
    def start(self, tls=None) -> str:
        """Serve on a free port; `tls` (an ssl.SSLContext) serves https, and a verified client certificate
        authenticates as its CN (as the apiserver does with --client-ca-file)."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):  # noqa: N802
                fake._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"{'https' if tls else 'http'}://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ------------------------------------------------------------ handling
    def _send(self, h, code: int, body, ctype: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else (json.dumps(body).encode() if ctype == "application/json"
                                                     else str(body).encode())
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _take_fault(self, path: str):
        with self._lock:
            for i, (kind, where) in enumerate(self.faults):
                if where in path:
                    del self.faults[i]
                    return kind
        return None

    def _handle(self, h) -> None:
        url = urlsplit(h.path)
        path, q = unquote(url.path), {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        self.requests.append((path, q))
        token = (h.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        cert = h.connection.getpeercert() if hasattr(h.connection, "getpeercert") else None
        if not token and cert:  # x509 client certificate: the user is its CN
            cn = next((v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"), None)
            token = f"x509:{cn}"
        if token not in self.tokens:
            return self._send(h, 401, status(401, "Unauthorized", "Unauthorized"))
        kind = self._take_fault(h.path)
        if kind == "drop":
            h.close_connection = True
            h.connection.shutdown(2)
            return
        if kind == "timeout":
            time.sleep(self.hang_s)
        if kind in ("500", "503"):
            code = int(kind)
            return self._send(h, code, status(code, "InternalError" if code == 500 else "ServiceUnavailable",
                                              "Internal error occurred: etcdserver: request timed out"
                                              if code == 500 else "the server is currently unable to handle the request"))
        if kind == "malformed":
            return self._send(h, 200, b'{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[{"metadata":')
        try:
            self._route(h, path, q, token, kind == "expire")
        except SelectorError as exc:
            self._send(h, 400, status(400, "BadRequest", str(exc)))

    def _allowed(self, token: str, verb: str, resource: str) -> bool:
        perms = self.tokens.get(token) or set()
        return "*" in perms or f"{verb} {resource}" in perms

    def _forbid(self, h, verb: str, resource: str, group: str, ns: str | None):
        plural = resource.split("/")[0]
        full = f"{plural}.{group}" if group else plural
        where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
        msg = (f'{full} is forbidden: User "{USER}" cannot {verb} resource "{resource}" in API group "{group}"{where}')
        self._send(h, 403, status(403, "Forbidden", msg, {"kind": plural} if not group else
                                  {"group": group, "kind": plural}))

    def _route(self, h, path: str, q: dict, token: str, expire: bool) -> None:
        m = re.match(r"^/api/v1/(?:namespaces/([^/]+)/)?pods$", path)
        if m:
            if not self._allowed(token, "list", "pods"):
                return self._forbid(h, "list", "pods", "", m.group(1))
            items = [p for p in self.pods if (m.group(1) is None or p["metadata"]["namespace"] == m.group(1))
                     and label_match(q.get("labelSelector", ""), p["metadata"].get("labels") or {})
                     and field_match(q.get("fieldSelector", ""), p, POD_FIELDS)]
            return self._list(h, "PodList", "v1", items, q, expire)
        m = re.match(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$", path)
        if m:
            if not self._allowed(token, "get", "pods/log"):
                return self._forbid(h, "get", "pods/log", "", m.group(1))
            return self._log(h, m.group(1), m.group(2), q)
        m = re.match(r"^/api/v1/(?:namespaces/([^/]+)/)?events$", path)
        if m:
            if not self._allowed(token, "list", "events"):
                return self._forbid(h, "list", "events", "", m.group(1))
            items = [e for e in self.events if (m.group(1) is None or e["metadata"]["namespace"] == m.group(1))
                     and field_match(q.get("fieldSelector", ""), e, EVENT_FIELDS)]
            return self._list(h, "EventList", "v1", items, q, expire)
        m = re.match(r"^/api/v1/nodes/([^/]+)$", path)
        if m:
            if not self._allowed(token, "get", "nodes"):
                return self._forbid(h, "get", "nodes", "", None)
            node = self.nodes.get(m.group(1))
            if node is None:
                return self._send(h, 404, status(404, "NotFound", f'nodes "{m.group(1)}" not found',
                                                 {"name": m.group(1), "kind": "nodes"}))
            return self._send(h, 200, {"kind": "Node", "apiVersion": "v1", **node})
        m = re.match(r"^/apis/kueue\.x-k8s\.io/v1beta1/(?:namespaces/([^/]+)/)?workloads$", path)
        if m:
            if not self._allowed(token, "list", "workloads"):
                return self._forbid(h, "list", "workloads", "kueue.x-k8s.io", m.group(1))
            items = [{"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload", **w} for w in self.workloads
                     if (m.group(1) is None or w["metadata"]["namespace"] == m.group(1))
                     and field_match(q.get("fieldSelector", ""), w, ("metadata.name", "metadata.namespace"))]
            return self._list(h, "WorkloadList", "kueue.x-k8s.io/v1beta1", items, q, expire)
        self._send(h, 404, status(404, "NotFound", "the server could not find the requested resource"))

    def _list(self, h, kind: str, api: str, items: list[dict], q: dict, expire: bool) -> None:
        items = sorted(items, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        start = 0
        if q.get("continue"):
            try:
                tok = json.loads(base64.urlsafe_b64decode(q["continue"].encode()))
                rv, start = int(tok["rv"]), int(tok["start"])
            except (ValueError, KeyError, TypeError):
                return self._send(h, 400, status(400, "BadRequest", "continue key is not valid: illegal base64 data"))
            if expire or rv <= self.compacted:
                fresh = self._token(self.rv, start)
                return self._send(h, 410, status(410, "Expired", EXPIRED, meta={"continue": fresh}))
        else:
            rv = self.rv
        limit = int(q["limit"]) if q.get("limit", "").isdigit() and int(q["limit"]) > 0 else len(items) or 1
        page = items[start:start + limit]
        meta = {"resourceVersion": str(rv)}
        if start + limit < len(items):
            meta["continue"] = self._token(rv, start + limit)
            meta["remainingItemCount"] = len(items) - start - limit
        self._send(h, 200, {"kind": kind, "apiVersion": api, "metadata": meta, "items": page})

    @staticmethod
    def _token(rv: int, start: int) -> str:
        return base64.urlsafe_b64encode(json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}).encode()).decode()

    def _log(self, h, ns: str, name: str, q: dict) -> None:
        pod = next((p for p in self.pods if p["metadata"]["namespace"] == ns and p["metadata"]["name"] == name), None)
        if pod is None:
            return self._send(h, 404, status(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"}))
        names = [c["name"] for c in pod["spec"].get("containers") or []]
        container = q.get("container") or (names[0] if len(names) == 1 else None)
        if container is None:
            return self._send(h, 400, status(400, "BadRequest", f"a container name must be specified for pod {name}, "
                                                              f"choose one of: [{' '.join(names)}]"))
        if container not in names:
            return self._send(h, 400, status(400, "BadRequest", f"container {container} is not valid for pod {name}"))
        previous = q.get("previous") in ("true", "1")
        lines = self.logs.get((ns, name, container, previous))
        if lines is None:
            if previous:
                return self._send(h, 400, status(400, "BadRequest", f'previous terminated container "{container}" '
                                                                  f'in pod "{name}" not found'))
            lines = []
        if q.get("sinceTime"):
            since = datetime.fromisoformat(q["sinceTime"].replace("Z", "+00:00"))
            lines = [x for x in lines if x[0] >= since]
        if q.get("tailLines", "").isdigit():
            lines = lines[-int(q["tailLines"]):] if int(q["tailLines"]) else []
        stamp = q.get("timestamps") in ("true", "1")
        text = "".join((f"{rfc3339nano(t)} " if stamp else "") + line + "\n" for t, line in lines).encode()
        if q.get("limitBytes", "").isdigit():
            text = text[:int(q["limitBytes"])]
        self._send(h, 200, text, "text/plain")
