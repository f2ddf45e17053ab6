"""One ASGI layer around the whole app, for what every request shares:

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
import time

import anyio

from faultline.service.errors import error_body

log = logging.getLogger("faultline.service")
RULESET_HEADER = "x-faultline-ruleset"
DRAIN_BYTES = 1 << 30
DRAIN_SECONDS = 10.0


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


async def drain(receive) -> None:
    """Read and drop what is left of a request body, within DRAIN_BYTES and DRAIN_SECONDS."""
    dropped = 0
    with anyio.move_on_after(DRAIN_SECONDS):
        while dropped <= DRAIN_BYTES:
            message = await receive()
            if message["type"] != "http.request":
                return
            dropped += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


class ServiceMiddleware:
    def __init__(self, app, max_body: int, ruleset_version: str):
        self.app, self.max_body, self.version = app, max_body, ruleset_version

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        state = {"status": None, "started": False, "received": 0}
        version = self.version.encode()

        async def send_wrapped(message):
            if message["type"] == "http.response.start":
                state["status"], state["started"] = message["status"], True
                message = {**message, "headers": [*message.get("headers", []), (RULESET_HEADER.encode(), version)]}
            await send(message)

        async def receive_limited():
            message = await receive()
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if state["received"] > self.max_body:
                    raise BodyTooLarge(self.max_body)
            return message

        async def answer(status: int, error: str, detail: str) -> None:
            body = json.dumps(error_body(error, detail), separators=(",", ":")).encode()
            await send_wrapped({"type": "http.response.start", "status": status, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"connection", b"close")]})
            await send_wrapped({"type": "http.response.body", "body": body})

        headers = scope.get("headers", [])
        try:
            n = declared_length(headers)
            if n == -1:
                await answer(400, "bad_request", "invalid Content-Length header")
            elif n is not None and n > self.max_body:
                if not expects_continue(headers) and n <= DRAIN_BYTES:
                    await drain(receive)
                await answer(413, "payload_too_large", too_large_detail(self.max_body))
            else:
                await self.app(scope, receive_limited, send_wrapped)
        except BodyTooLarge:
            if state["started"]:
                raise
            await drain(receive)
            await answer(413, "payload_too_large", too_large_detail(self.max_body))
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if state["started"]:
                raise
            await answer(500, "internal_error", "the server failed to answer this request; see its log")
        finally:
            ms = (time.perf_counter() - t0) * 1000
            log.info("%s %s %s %.1f ms", scope.get("method"), scope.get("path"), state["status"], ms)
