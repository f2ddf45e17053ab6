"""A protocol-faithful fake Loki for tests (no Loki can be installed here; DESIGN.md "Real parts").

Built from Loki's documented HTTP API (docs/sources/reference/loki-http-api.md) and its source where the
docs are silent:
- `GET /loki/api/v1/query_range`: `query` a log query (stream selector with =, !=, =~, !~ matchers, fully
  anchored regexes, plus |=, !=, |~, !~ line filters); `start` (default now-1h) inclusive and `end`
  (default now) exclusive, as Unix ns, Unix seconds (<= 10 digits), float seconds or RFC3339(Nano)
  (pkg/loghttp/params.go parseTimestamp); `limit` (default 100) capped by max_entries_limit_per_query
  (default 5000) with Loki's 400 message; `direction` forward|backward (default backward): the `limit`
  oldest (newest) lines of the range across all streams, grouped per stream, each stream's values sorted
  in that direction. Errors are plain text bodies, as Loki writes them.
- `GET /ready`.
- multi-tenancy: with `multi_tenant=True` a request without `X-Scope-OrgID` is a 401 "no org id", and a
  query sees only the streams of the tenant(s) it names ("a|b").
Failure injection: `inject(kind, times)` for the next query_range requests (429 with Retry-After, 500,
hang past the client's timeout, garbage, a wrong resultType, a dropped connection), and
`fail_queries(substring, status, body)` for every query that contains a substring.
"""

from __future__ import annotations

import bisect
import json
import random
import re
import threading
import time
from collections import deque
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

MAX_ENTRIES_LIMIT = 5000


class LogQLError(ValueError):
    pass


# ------------------------------------------------------------------ LogQL: stream selector + line filters
_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\\n]|\\.)*"|`[^`]*`)|(?P<op>!=|=~|!~|\|=|\|~|[{}=,])'
                    r'|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|(?P<bad>\S))')


def go_unquote(tok: str) -> str:
    """A Go string literal (as LogQL strings are): "..." with backslash escapes, or `raw`."""
    if tok.startswith("`"):
        return tok[1:-1]
    body, out, i = tok[1:-1], [], 0
    simple = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"'}
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        e = body[i + 1]
        if e in simple:
            out.append(simple[e])
            i += 2
        elif e in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[e]
            digits = body[i + 2:i + 2 + n]
            if len(digits) != n or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                raise ValueError(f"invalid char escape \\{e}{digits}")
            out.append(chr(int(digits, 16)))
            i += 2 + n
        elif e in "01234567":
            out.append(chr(int(body[i + 1:i + 4], 8)))
            i += 4
        else:
            raise ValueError(f"invalid char escape \\{e}")
    return "".join(out)


def parse_logql(query: str) -> tuple[list[tuple[str, str, str]], list[tuple[str, str]]]:
    """-> (matchers [(label, op, value)], line filters [(op, value)]), or LogQLError with Loki's wording."""
    toks, pos = [], 0
    while pos < len(query):
        m = _TOKEN.match(query, pos)
        if not m or m.end() == pos:
            break
        kind = m.lastgroup
        toks.append((kind, m.group(kind), m.start(kind) + 1))
        pos = m.end()
    toks.append(("eof", "", len(query) + 1))

    def fail(tok, expecting: str):
        shown = {"ident": "IDENTIFIER", "str": "STRING", "eof": "$end"}.get(tok[0], tok[1])
        raise LogQLError(f"parse error at line 1, col {tok[2]}: syntax error: unexpected {shown}, expecting {expecting}")

    i = 0
    if toks[i][1] != "{":
        fail(toks[i], "{")
    i += 1
    matchers = []
    while True:
        if toks[i][0] != "ident":
            fail(toks[i], "IDENTIFIER")
        label = toks[i][1]
        op = toks[i + 1]
        if op[1] not in ("=", "!=", "=~", "!~"):
            fail(op, "= or != or =~ or !~")
        val = toks[i + 2]
        if val[0] != "str":
            fail(val, "STRING")
        try:
            value = go_unquote(val[1])
        except (ValueError, IndexError) as exc:
            raise LogQLError(f"parse error at line 1, col {val[2]}: {exc}") from None
        if op[1] in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as exc:
                raise LogQLError(f"parse error at line 1, col {val[2]}: error parsing regexp: {exc}") from None
        matchers.append((label, op[1], value))
        i += 3
        if toks[i][1] == ",":
            i += 1
            continue
        if toks[i][1] == "}":
            i += 1
            break
        fail(toks[i], ", or }")
    filters = []
    while toks[i][0] != "eof":
        op, val = toks[i], toks[i + 1]
        if op[1] not in ("|=", "!=", "|~", "!~") or val[0] != "str":
            fail(op if op[1] not in ("|=", "!=", "|~", "!~") else val, "|= or != or |~ or !~ STRING")
        filters.append((op[1], go_unquote(val[1])))
        i += 2
    if not any(op in ("=", "=~") and not _match(op, value, "") for _, op, value in matchers):
        raise LogQLError('queries require at least one regexp or equality matcher that does not have an '
                         'empty-compatible value. For instance, app=~".*" does not meet this requirement, '
                         'but app=~".+" will')
    return matchers, filters


def _match(op: str, want: str, got: str) -> bool:
    if op == "=":
        return got == want
    if op == "!=":
        return got != want
    hit = re.fullmatch(want, got) is not None  # Loki's label regexes are fully anchored
    return hit if op == "=~" else not hit


def _line_ok(filters, line: str) -> bool:
    for op, v in filters:
        ok = (v in line) if op in ("|=", "!=") else (re.search(v, line) is not None)
        if ok != (op in ("|=", "|~")):
            return False
    return True


def parse_timestamp(value: str | None, default_ns: int) -> int:
    """Loki's parseTimestamp: empty -> default; float -> seconds; int -> seconds if <= 10 digits else ns;
    else RFC3339(Nano)."""
    if not value:
        return default_ns
    if "." in value:
        try:
            s = float(value)
            return int(s) * 1_000_000_000 + round((s - int(s)) * 1000) * 1_000_000
        except ValueError:
            pass
    if re.fullmatch(r"-?\d+", value):
        return int(value) * 1_000_000_000 if len(value) <= 10 else int(value)
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)", value)
    if not m:
        raise ValueError(f'cannot parse "{value}" to a valid timestamp')
    base = datetime.fromisoformat(m.group(1) + (m.group(3).replace("Z", "+00:00")))
    return int(base.timestamp()) * 1_000_000_000 + int((m.group(2) or "0").ljust(9, "0"))


# ------------------------------------------------------------------ the store and the server
class FakeLoki:
    def __init__(self, max_entries_limit: int = MAX_ENTRIES_LIMIT, multi_tenant: bool = False,
                 require_authorization: str | None = None, shuffle_ties: bool = False, seed: int = 0):
        self.max_entries_limit = max_entries_limit
        self.multi_tenant = multi_tenant
        self.require_authorization = require_authorization
        self.shuffle_ties = shuffle_ties  # equal timestamps come back in a different order on every request
        self._rng = random.Random(seed)
        self._streams: dict[tuple, dict] = {}  # (tenant, label key) -> {labels, ns: [...], lines: [...]}
        self._faults: deque = deque()
        self._failing: list[tuple[str, int, str]] = []
        self._lock = threading.Lock()
        self.requests: list[dict] = []
        self._server: ThreadingHTTPServer | None = None

    # ---------------------------------------------------------------- data
    def push(self, labels: dict, entries, tenant: str = "fake") -> None:
        """Entries [(ns, line)], like POST /loki/api/v1/push (kept sorted by time, stable)."""
        key = (tenant, json.dumps(labels, sort_keys=True))
        s = self._streams.setdefault(key, {"labels": dict(labels), "ns": [], "lines": []})
        rows = sorted(zip(s["ns"] + [int(n) for n, _ in entries], s["lines"] + [l for _, l in entries]),
                      key=lambda r: r[0])
        s["ns"], s["lines"] = [r[0] for r in rows], [r[1] for r in rows]

    def load_export(self, path: Path, tenant: str = "fake") -> int:
        """Streams of saved query_range responses (the simulator's `<cluster>/loki/<day>.jsonl`)."""
        n = 0
        for text in Path(path).read_text().splitlines():
            for stream in json.loads(text)["data"]["result"]:
                self.push(stream["stream"], [(int(ns), line) for ns, line in stream["values"]], tenant)
                n += len(stream["values"])
        return n

    def select(self, query: str, start_ns: int, end_ns: int, tenants=("fake",)) -> list[tuple[dict, int, str]]:
        """Every (labels, ns, line) the query matches in [start, end): the truth a client must reproduce."""
        matchers, filters = parse_logql(query)
        out = []
        for (tenant, _), s in self._streams.items():
            if tenant not in tenants or not all(_match(op, v, s["labels"].get(k, "")) for k, op, v in matchers):
                continue
            lo, hi = bisect.bisect_left(s["ns"], start_ns), bisect.bisect_left(s["ns"], end_ns)
            out += [(s["labels"], s["ns"][i], s["lines"][i]) for i in range(lo, hi) if _line_ok(filters, s["lines"][i])]
        return out

    # ---------------------------------------------------------------- failure injection
    def inject(self, kind: str, times: int = 1, **kw) -> None:
        """kind: 429 | 500 | 502 | 503 | hang | garbage | matrix | close, or pass (answer this one normally, to
        aim the next fault at a later request); kw: retry_after, hang_s, body."""
        with self._lock:
            self._faults.extend({"kind": kind, **kw} for _ in range(times))

    def fail_queries(self, substring: str, status: int = 500, body: str = "internal error") -> None:
        self._failing.append((substring, status, body))

    def query_requests(self) -> list[dict]:
        return [r for r in self.requests if r["path"] == "/loki/api/v1/query_range"]

    # ---------------------------------------------------------------- HTTP
    def handle(self, path: str, params: dict, headers: dict) -> tuple[int, dict, bytes | None]:
        """-> (status, headers, body); body None means: drop the connection."""
        with self._lock:
            self.requests.append({"path": path, "params": params, "headers": headers})
        if path == "/ready":
            return 200, {}, b"ready\n"
        if path != "/loki/api/v1/query_range":
            return 404, {}, b"404 page not found\n"
        if self.require_authorization and headers.get("authorization") != self.require_authorization:
            return 401, {}, b"unauthorized\n"
        tenants = ("fake",)
        if self.multi_tenant:
            org = headers.get("x-scope-orgid")
            if not org:
                return 401, {}, b"no org id\n"
            tenants = tuple(org.split("|"))
        with self._lock:
            fault = self._faults.popleft() if self._faults else None
        if fault:
            k = fault["kind"]
            if k in ("429", "500", "502", "503"):
                h = {"Retry-After": str(fault["retry_after"])} if "retry_after" in fault else {}
                return int(k), h, fault.get("body", "too many outstanding requests\n" if k == "429"
                                            else "internal server error\n").encode()
            if k == "hang":
                time.sleep(fault.get("hang_s", 2.0))
            if k == "garbage":
                return 200, {"Content-Type": "application/json"}, b"<html><body>502 Bad Gateway</body></html>"
            if k == "matrix":
                return 200, {"Content-Type": "application/json"}, json.dumps(
                    {"status": "success", "data": {"resultType": "matrix", "result": []}}).encode()
            if k == "close":
                return 0, {}, None
        query = params.get("query", "")
        for sub, status, body in self._failing:
            if sub in query:
                return status, {}, (body + "\n").encode()
        try:
            return 200, {"Content-Type": "application/json"}, json.dumps(self._query_range(params, tenants)).encode()
        except (LogQLError, ValueError) as exc:
            return 400, {}, (str(exc) + "\n").encode()

    def _query_range(self, params: dict, tenants) -> dict:
        if not params.get("query"):
            raise ValueError("query parameter is required")  # before parsing, as Loki validates its params
        now = time.time_ns()
        start = parse_timestamp(params.get("start"), now - 3600 * 1_000_000_000)
        end = parse_timestamp(params.get("end"), now)
        limit = int(params.get("limit") or 100)
        if limit <= 0:
            raise ValueError("limit must be a positive value")
        direction = (params.get("direction") or "backward").lower()
        if direction not in ("forward", "backward"):
            raise ValueError(f"invalid direction '{params['direction']}'")
        if end < start:
            raise ValueError("end timestamp must not be before or equal to start time")
        if limit > self.max_entries_limit:
            raise ValueError(f"max entries limit per query exceeded, limit > max_entries_limit "
                             f"({limit} > {self.max_entries_limit})")
        rows = self.select(params["query"], start, end, tenants)
        tie = ([self._rng.random() for _ in rows] if self.shuffle_ties
               else [json.dumps(r[0], sort_keys=True) for r in rows])
        order = sorted(range(len(rows)), key=lambda i: (rows[i][1], tie[i]), reverse=direction == "backward")
        picked = [rows[i] for i in order[:limit]]
        by_stream: dict[str, dict] = {}
        for labels, ns, line in picked:  # already in the direction's order, so each stream's values are too
            s = by_stream.setdefault(json.dumps(labels, sort_keys=True), {"stream": labels, "values": []})
            s["values"].append([str(ns), line])
        result = list(by_stream.values())
        if self.shuffle_ties:
            self._rng.shuffle(result)
        return {"status": "success", "data": {"resultType": "streams", "result": result,
                                              "stats": {"summary": {"totalEntriesReturned": len(picked)}}}}

    def start(self) -> "FakeLoki":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802
                url = urlsplit(self.path)
                params = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
                status, headers, body = fake.handle(url.path, params, {k.lower(): v for k, v in self.headers.items()})
                if body is None:
                    self.close_connection = True
                    return
                try:
                    self.send_response(status)
                    headers.setdefault("Content-Type", "text/plain; charset=utf-8")
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout): nothing to say
                    self.close_connection = True

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True, name="fake-loki").start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> "FakeLoki":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
