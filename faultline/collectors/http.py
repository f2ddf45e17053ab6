"""What an HTTP answer means to a collector: retry it (timeouts, refused connections, 429 and 5xx),
give up with the server's own reason (other statuses, a body that is not JSON), or take its JSON."""

from __future__ import annotations

from typing import Callable

import httpx


def checked_answer(send: Callable[[], httpx.Response], url: str, timeout_s: float,
                   error: type[Exception], retryable: type[Exception],
                   reason: Callable[[httpx.Response], str]) -> httpx.Response:
    """`send()`'s 200 answer; `retryable(...)` for what a retry may cure (timeouts, refused connections,
    429, 5xx), `error(...)` for the rest, both with the server's reason."""
    try:
        r = send()
    except httpx.TimeoutException:
        raise retryable(f"timed out after {timeout_s:g} s") from None
    except httpx.TransportError as exc:
        raise retryable(f"cannot reach {url}: {exc or type(exc).__name__}") from None
    if r.status_code == 429 or r.status_code >= 500:
        raise retryable(f"HTTP {r.status_code}: {reason(r)}")
    if r.status_code != 200:
        raise error(f"HTTP {r.status_code}: {reason(r)}")
    return r


def json_answer(send: Callable[[], httpx.Response], url: str, timeout_s: float,
                error: type[Exception], retryable: type[Exception],
                reason: Callable[[httpx.Response], str]) -> object:
    """`send()`'s decoded JSON body (see checked_answer); a body that is not JSON is an `error`."""
    r = checked_answer(send, url, timeout_s, error, retryable, reason)
    try:
        return r.json()
    except ValueError:
        raise error(f"response is not JSON: {r.text[:80]!r}") from None
