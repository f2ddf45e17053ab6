"""A Kubernetes API answered from saved `kubectl` output: offline diagnosis of a cluster's jobs, and the demo.

`kubernetes: {snapshot: DIR}` instead of a server. DIR holds what these commands print:

    kubectl get workloads.kueue.x-k8s.io -A -o json > DIR/workloads.json
    kubectl get pods -A -o json                      > DIR/pods.json
    kubectl get events -A -o json                    > DIR/events.json
    kubectl get nodes -o json                        > DIR/nodes.json
    kubectl logs --timestamps -n NS POD -c C [--previous] > DIR/logs/NS/POD/C.log (C.previous.log)

An httpx transport answers the GETs the collector makes from them, as the API server would: lists by
namespace with equality label selectors and field selectors, `limit`/`continue` paging, one node, a
container's log with `previous`, `sinceTime` and `limitBytes` (400 when there is no previous log, 404 for a
pod that is not in the snapshot). So the same collector code reads a live cluster and a saved one.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import httpx

LISTS = {"pods": "pods.json", "events": "events.json", "workloads": "workloads.json"}


def _status(code: int, reason: str, message: str) -> httpx.Response:
    return httpx.Response(code, json={"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                      "message": message, "reason": reason, "code": code})


def _get(obj, dotted: str):
    for k in dotted.split("."):
        obj = obj.get(k) if isinstance(obj, dict) else None
    return obj


def _matches(selector: str, value_of) -> bool:
    """Equality-based requirements (`a=b`, `a==b`, `a!=b`, comma-separated): what the collector sends."""
    for part in filter(None, (p.strip() for p in (selector or "").split(","))):
        neg = "!=" in part
        key, _, want = part.replace("!=", "=").replace("==", "=").partition("=")
        if (str(value_of(key.strip()) or "") == want.strip()) == neg:
            return False
    return True


class SnapshotTransport(httpx.BaseTransport):
    def __init__(self, root: Path):
        self.root = Path(root)
        self._cache: dict[str, list[dict]] = {}

    def _items(self, name: str) -> list[dict]:
        if name not in self._cache:
            p = self.root / name
            doc = json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {"items": []}
            self._cache[name] = doc.get("items") or []
        return self._cache[name]

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = urlsplit(str(request.url))
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        ns = parts[parts.index("namespaces") + 1] if "namespaces" in parts else None
        if parts[-1] == "log" and len(parts) >= 7:
            return self._log(ns, parts[-2], q)
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
            node = next((n for n in self._items("nodes.json") if n["metadata"]["name"] == parts[3]), None)
            return httpx.Response(200, json=node) if node else _status(404, "NotFound", f'nodes "{parts[3]}" not found')
        if parts[-1] in LISTS:
            items = [o for o in self._items(LISTS[parts[-1]])
                     if (ns is None or (o.get("metadata") or {}).get("namespace") == ns)
                     and _matches(q.get("labelSelector", ""), lambda k, o=o: ((o.get("metadata") or {})
                                                                               .get("labels") or {}).get(k))
                     and _matches(q.get("fieldSelector", ""), lambda k, o=o: _get(o, k))]
            start = int(q.get("continue") or 0)
            limit = int(q.get("limit") or 0) or len(items) or 1
            meta = {"resourceVersion": "1"}
            if start + limit < len(items):
                meta["continue"] = str(start + limit)
            return httpx.Response(200, json={"kind": "List", "apiVersion": "v1", "metadata": meta,
                                             "items": items[start:start + limit]})
        return _status(404, "NotFound", "the server could not find the requested resource")

    def _log(self, ns: str, pod: str, q: dict) -> httpx.Response:
        d = self.root / "logs" / ns / pod
        if not d.is_dir():
            return _status(404, "NotFound", f'pods "{pod}" not found')
        c = q.get("container", "")
        previous = q.get("previous") == "true"
        p = d / f"{c}.previous.log" if previous else d / f"{c}.log"
        if not p.is_file():
            if previous:
                return _status(400, "BadRequest", f'previous terminated container "{c}" in pod "{pod}" not found')
            return httpx.Response(200, text="")
        lines = p.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        if q.get("sinceTime"):
            since = datetime.fromisoformat(q["sinceTime"].replace("Z", "+00:00"))
            from faultline.collectors.kubernetes import parse_time

            lines = [ln for ln in lines if (t := parse_time(ln.split(" ", 1)[0])) is None or t >= since]
        data = "".join(lines).encode()
        if q.get("limitBytes", "").isdigit():
            data = data[:int(q["limitBytes"])]
        return httpx.Response(200, content=data, headers={"Content-Type": "text/plain"})
