"""One ASGI layer around the whole app, for what every request shares:

- the Host header must be one the service answers to (loopback names unless configured: a page
  that rebinds its own DNS name to 127.0.0.1 sends its own name, and gets 400 `invalid_host`);
- a browser's cross-site write is refused (403 `cross_origin`) before its body is read: a POST that
  carries an `Origin` (or `Referer`) of another site, or `Sec-Fetch-Site: cross-site|same-site`. Browsers
  send these; curl, httpx and recovery systems do not, and are unaffected. Same-origin requests (the
  service's own /docs page) pass;
- body read timeouts: a pause longer than `read_timeout_s` between two pieces of a body, or a body
  that takes longer than `body_timeout_s` in all, gets 408 and the connection is closed. A body is
  read before a diagnosis worker is taken, so a slow client never holds a worker;
- a client that goes away mid-request is logged as `client disconnected` (status 499 in the log
  line), not as a server error;
- the request body limit: a declared Content-Length over it is refused, an undeclared (chunked) body
  is counted as it streams; either way 413 in the API's error shape. Before the 413 goes out, the rest
  of the body is read and dropped (within DRAIN_BYTES / DRAIN_SECONDS): a client that sends its whole
  body before reading the answer (most do) then sees the 413 instead of a reset connection. A client
  that asked `Expect: 100-continue` (curl does for large bodies) gets the 413 before sending anything;
- the ruleset version on every response (`X-Faultline-Ruleset`);
- one log line per request: method, path, status, milliseconds;
- a last guard: an exception nothing else handled is logged with its traceback and answered with
  a plain JSON 500 (no stack trace in the response).
"""

from __future__ import annotations

import json
import logging
import math
import time

from urllib.parse import urlsplit

import anyio
from starlette.requests import ClientDisconnect

from faultline.service.errors import error_body

log = logging.getLogger("faultline.service")
audit = logging.getLogger("faultline.audit")  # one line per request: the token's name (never the token), client
RULESET_HEADER = "x-faultline-ruleset"
DRAIN_BYTES = 1 << 30
DRAIN_SECONDS = 10.0
REFUSE_DRAIN_BYTES = 8 << 20  # a request refused before its body is read (host, origin, token) ...
REFUSE_DRAIN_SECONDS = 1.0    # ... has this much of its body read and dropped first


class BodyTimeout(Exception):
    pass


class BodyTooLarge(Exception):
    def __init__(self, limit: int):
        super().__init__(f"request body exceeds {limit} bytes")
        self.limit = limit


def too_large_detail(limit: int) -> str:
    return f"request body exceeds the limit of {limit} bytes ({limit / (1 << 20):g} MiB; --max-body-mb)"


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The Content-Length a request declares; None when absent; -1 when it is not a number."""
    for k, v in headers:
        if k.lower() == b"content-length":
            try:
                n = int(v)
            except ValueError:
                return -1
            return n if n >= 0 else -1
    return None


def expects_continue(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(k.lower() == b"expect" and v.strip().lower() == b"100-continue" for k, v in headers)


async def drain(receive, max_bytes: int = DRAIN_BYTES, max_seconds: float = DRAIN_SECONDS) -> None:
    """Read and drop what is left of a request body, within max_bytes and max_seconds."""
    dropped = 0
    with anyio.move_on_after(max_seconds):
        while dropped <= max_bytes:
            message = await receive()
            if message["type"] != "http.request":
                return
            dropped += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


UNSAFE_METHODS = ("POST", "PUT", "PATCH", "DELETE")


def header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for k, v in headers:
        if k.lower() == name:
            return v.decode("latin-1")
    return None


def origin_of(url: str) -> str:
    """`https://Example.org:8443/x` -> `https://example.org:8443` (scheme://host[:port], lower case)."""
    parts = urlsplit(url.strip())
    if not parts.scheme or not parts.netloc:
        return url.strip().lower()
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


def cross_site(headers: list[tuple[bytes, bytes]], scheme: str, allowed: tuple[str, ...]) -> str | None:
    """Why a write request is a browser's cross-site request (None when it is not)."""
    host = (header(headers, b"host") or "").strip().lower()
    own = f"{scheme}://{host}"
    ok = {own, *(origin_of(o) for o in allowed)}
    origin = header(headers, b"origin")
    if origin is not None:
        if origin_of(origin) not in ok:  # includes `Origin: null` (sandboxed frames, file://)
            return f"Origin {origin[:100]!r} is not this service ({own}); allow it with --allowed-origin"
        return None
    fetch_site = (header(headers, b"sec-fetch-site") or "").strip().lower()
    if fetch_site in ("cross-site", "same-site"):
        return f"Sec-Fetch-Site: {fetch_site}: a page of another site sent this request"
    referer = header(headers, b"referer")
    if referer and origin_of(referer) not in ok:
        return f"Referer of another site ({origin_of(referer)[:100]!r})"
    return None


class ServiceMiddleware:
    def __init__(self, app, max_body: int, ruleset_version: str, settings=None, auth=None):
        from faultline.service.auth import Authenticator
        from faultline.service.settings import Settings

        self.app, self.max_body, self.version = app, max_body, ruleset_version
        self.settings = settings if settings is not None else Settings()
        self.auth = auth if auth is not None else Authenticator()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        state = {"status": None, "started": False, "received": 0, "done": False, "drain": True}
        version = self.version.encode()
        cfg = self.settings
        deadline = time.monotonic() + cfg.body_timeout_s

        async def send_wrapped(message):
            if message["type"] == "http.response.start" and not state["done"] and state["drain"]:
                # Answered before the body was read (refused: host, origin, token, media type ...): read
                # what little of it has come, so that a client that sends its whole body before reading
                # the answer sees this answer, not a reset connection. A large or stalled body is not
                # waited for.
                state["done"] = True
                n = declared_length(headers)
                if ((n and n > 0) or header(headers, b"transfer-encoding")) and not expects_continue(headers):
                    await drain(receive, REFUSE_DRAIN_BYTES, min(REFUSE_DRAIN_SECONDS, cfg.read_timeout_s))
            if message["type"] == "http.response.start":
                state["status"], state["started"] = message["status"], True
                message = {**message, "headers": [*message.get("headers", []), (RULESET_HEADER.encode(), version)]}
            await send(message)

        async def receive_limited():
            if state["done"]:  # the body is complete: what follows is a wait for disconnect; no timeout
                return await receive()
            wait = min(cfg.read_timeout_s, deadline - time.monotonic())
            try:
                with anyio.fail_after(max(wait, 0.001)):
                    message = await receive()
            except TimeoutError:
                raise BodyTimeout() from None
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if state["received"] > self.max_body:
                    raise BodyTooLarge(self.max_body)
                if not message.get("more_body", False):
                    state["done"] = True
            return message

        async def answer(status: int, error: str, detail: str, extra: tuple = ()) -> None:
            body = json.dumps(error_body(error, detail), separators=(",", ":")).encode()
            await send_wrapped({"type": "http.response.start", "status": status, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"), *extra]})
            await send_wrapped({"type": "http.response.body", "body": body})

        headers = scope.get("headers", [])
        identity: dict = {"token": None}

        try:
            n = declared_length(headers)
            host = header(headers, b"host")
            why = (cross_site(headers, scope.get("scheme", "http"), cfg.allowed_origins)
                   if scope.get("method") in UNSAFE_METHODS else None)
            if host is None or not cfg.host_allowed(host):
                await answer(400, "invalid_host", f"Host {(host or '')[:100]!r} is not a name this service answers "
                                                  "to; allow it with --allowed-host")
            elif why:
                await answer(403, "cross_origin", f"refused a browser's cross-site request: {why}")
            elif (denied := self.authorize(scope, headers, identity)) is not None:
                await answer(*denied)
            elif n == -1:
                await answer(400, "bad_request", "invalid Content-Length header")
            elif n is not None and n > self.max_body:
                state["drain"] = False
                if not expects_continue(headers) and n <= DRAIN_BYTES:
                    await drain(receive)
                await answer(413, "payload_too_large", too_large_detail(self.max_body))
            else:
                await self.app(scope, receive_limited, send_wrapped)
        except BodyTooLarge:
            if state["started"]:
                raise
            state["drain"] = False
            await drain(receive)
            await answer(413, "payload_too_large", too_large_detail(self.max_body))
        except BodyTimeout:
            if state["started"]:
                raise
            state["drain"] = False
            await answer(408, "request_timeout", f"the request body did not arrive in time (a pause over "
                                                 f"{cfg.read_timeout_s:g} s, or over {cfg.body_timeout_s:g} s in all)")
        except ClientDisconnect:  # Starlette's: the client closed its connection before the body was read
            state["status"] = 499
            log.info("%s %s: client disconnected", scope.get("method"), scope.get("path"))
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if state["started"]:
                raise
            await answer(500, "internal_error", "the server failed to answer this request; see its log")
        finally:
            ms = (time.perf_counter() - t0) * 1000
            log.info("%s %s %s %.1f ms", scope.get("method"), scope.get("path"), state["status"], ms)
            client = scope.get("client") or ("-", 0)
            token = identity["token"]
            audit.info("token=%s client=%s %s %s %s %.1f ms", token.name if token else "-", client[0],
                       scope.get("method"), scope.get("path"), state["status"], ms)

    def authorize(self, scope, headers, identity: dict):
        """None when the request may go on (its token, if any, in scope["state"]["token"]), else the
        (status, error, detail, headers) to answer: 401 without a known token, 403 without the scope,
        429 past the token's rate."""
        from faultline.service.auth import required_scope

        if not self.auth.enabled:
            return None
        need = required_scope(scope.get("method", ""), scope.get("path", ""))
        if need is None:
            return None
        token = self.auth.identify(header(headers, b"authorization"))
        if token is None:
            return (401, "unauthorized", "send a valid token: Authorization: Bearer <token>",
                    ((b"www-authenticate", b'Bearer realm="faultline"'),))
        identity["token"] = token
        scope.setdefault("state", {})["token"] = token
        if need not in token.scopes and "admin" not in token.scopes:
            return (403, "insufficient_scope", f"token {token.name!r} lacks the {need!r} scope this request needs",
                    ((b"www-authenticate", f'Bearer error="insufficient_scope", scope="{need}"'.encode()),))
        wait = self.auth.take(token)
        if wait > 0:
            return (429, "rate_limited", f"token {token.name!r} is over its rate of {token.rate_per_minute:g} "
                                         "requests per minute", ((b"retry-after", str(math.ceil(wait)).encode()),))
        return None
