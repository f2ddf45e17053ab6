"""Collector: a live Loki, `GET /loki/api/v1/query_range`, paged and retried. The I/O half of `loki`.

Paging follows Loki's own logcli: a forward query returns the `limit` oldest lines of [start, end)
(start inclusive, end exclusive); the next page starts at the last line's nanosecond, because more
lines may share it, and the lines of that instant the previous page had are dropped
(`loki.new_entries`). Retries cover what passes (429, 5xx, timeouts, refused connections); a
4xx is the query's fault and is reported at once with Loki's own message.
"""

from __future__ import annotations

import email.utils
import os
import random
import ssl
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import httpx
import polars as pl

from faultline.collectors.loki import PAGE_SCHEMA, LokiFormatError, LokiSettings, new_entries, page_frame

QUERY_RANGE = "/loki/api/v1/query_range"
MAX_WAIT_S = 60.0  # a Retry-After beyond this is capped: a collect should not stall for an hour on one job


class LokiError(RuntimeError):
    """A query that failed for good (after retries); the message is the reason coverage records."""


@dataclass
class QueryResult:
    lines: pl.DataFrame                       # stream (label key), ns, line
    labels: dict[str, dict] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    truncated: bool = False
    error: str | None = None                  # why fetching stopped early; `lines` holds the pages before it


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _body_reason(r: httpx.Response) -> str:
    """Loki answers errors in plain text ("parse error at line 1, col 5: ..."); proxies in JSON or HTML."""
    text = r.text.strip()
    if text.startswith("{"):
        try:
            doc = r.json()
            text = str(doc.get("message") or doc.get("error") or text) if isinstance(doc, dict) else text
        except ValueError:
            pass
    return " ".join(text.split())[:300] or r.reason_phrase


def retry_after_s(value: str | None) -> float | None:
    """Retry-After as seconds: a number of seconds or an HTTP date (RFC 9110)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds()) if when.tzinfo else None


class LokiClient:
    """One Loki, shared by the threads that fetch a fleet's jobs (httpx.Client is thread-safe)."""

    def __init__(self, settings: LokiSettings, env: dict | None = None, sleep=time.sleep):
        env = os.environ if env is None else env
        self.s, self._sleep = settings, sleep

        def secret(name: str) -> str:
            value = env.get(name)
            if not value:
                raise LokiError(f"environment variable {name} is not set (named in the cluster's logs config)")
            return value

        headers = {"Accept": "application/json", **settings.headers}
        auth = None
        if settings.bearer_token_env:
            headers["Authorization"] = f"Bearer {secret(settings.bearer_token_env)}"
        if settings.password_env:
            user = settings.username or secret(settings.username_env)
            auth = httpx.BasicAuth(user, secret(settings.password_env))
        verify = ssl.create_default_context(cafile=settings.ca_file) if settings.ca_file else True
        self._http = httpx.Client(base_url=settings.url, headers=headers, auth=auth, verify=verify,
                                  timeout=settings.timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "LokiClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- one request, retried
    def query_range(self, query: str, start_ns: int, end_ns: int, limit: int, direction: str = "forward") -> dict:
        params = {"query": query, "start": str(start_ns), "end": str(end_ns), "limit": str(limit),
                  "direction": direction}
        attempts = self.s.retries + 1
        for attempt in range(attempts):
            wait = None
            try:
                r = self._http.get(QUERY_RANGE, params=params)
            except httpx.TimeoutException:
                reason = f"timed out after {self.s.timeout_s:g} s"
            except httpx.TransportError as exc:  # refused, reset, DNS, TLS
                reason = f"cannot reach {self.s.url}: {exc or type(exc).__name__}"
            else:
                if r.status_code == 200:
                    try:
                        return r.json()
                    except ValueError:
                        raise LokiFormatError(f"response is not JSON: {r.text[:80]!r}") from None
                reason = f"HTTP {r.status_code}: {_body_reason(r)}"
                if r.status_code != 429 and r.status_code < 500:
                    raise LokiError(reason)  # the query or the credentials are wrong: retrying cannot help
                wait = retry_after_s(r.headers.get("Retry-After"))
            if attempt + 1 < attempts:
                backoff = self.s.backoff_s * 2 ** attempt * random.uniform(0.5, 1.0)  # jitter: threads spread out
                self._sleep(min(MAX_WAIT_S, wait if wait is not None else backoff))
        raise LokiError(f"{reason} (gave up after {attempts} attempt{'s' if attempts > 1 else ''})")

    # ---------------------------------------------------------------- all lines of one query, paged
    def fetch(self, query: str, start_ns: int, end_ns: int, max_lines: int) -> QueryResult:
        """Every line of [start_ns, end_ns), oldest first, up to max_lines. Past that, the first half of the
        budget comes from the start (NCCL's set-up: rank and address maps) and the rest from the end (where a
        failed job's cause is), and the note says which stretch was skipped. A query that fails for good ends
        the result early with `error` set: the pages before it are still evidence."""
        out = QueryResult(pl.DataFrame(schema=PAGE_SCHEMA))
        tail_budget = max_lines // 2
        head, cut, head_last = self._paged(query, start_ns, end_ns, max_lines - tail_budget, "forward", out)
        tail = pl.DataFrame(schema=PAGE_SCHEMA)
        if cut and out.error is None and tail_budget:
            # Newest first, down to the head's last instant; the lines of that instant the head already has come
            # again (their budget is added) and are dropped.
            seen = head.filter(pl.col("ns") == head_last)
            tail, cut, _ = self._paged(query, head_last, end_ns, tail_budget + seen.height, "backward", out)
            tail = new_entries(tail.reverse(), seen).tail(tail_budget)  # oldest first again
            if cut:
                out.notes.append(f"truncated at max_lines_per_job={max_lines} lines: kept the first {head.height} "
                                 f"and the last {tail.height}; lines after {_iso(head_last)} and before "
                                 f"{_iso(tail['ns'][0] if tail.height else end_ns)} were not fetched")
        elif cut:
            out.notes.append(f"truncated at max_lines_per_job={max_lines} lines: lines after {_iso(head_last)} "
                             "were not fetched")
        out.truncated = cut
        out.lines = pl.concat([head, tail])
        return out

    def _paged(self, query: str, start_ns: int, end_ns: int, budget: int, direction: str,
               out: QueryResult) -> tuple[pl.DataFrame, bool, int]:
        """Lines of [start_ns, end_ns) in `direction` order, at most `budget`: (lines, cut short, the last
        instant reached). Forward pages move `start` to the last instant seen, backward pages move `end` to
        just past the oldest one (end is exclusive); the lines of that instant already returned are dropped."""
        limit, forward = self.s.page_limit, direction == "forward"
        pages, total, start, end, boundary = [], 0, start_ns, end_ns, None
        reached = start_ns if forward else end_ns - 1
        while start < end and budget > 0:
            try:
                page = page_frame(self.query_range(query, start, end, limit, direction), out.labels)
            except (LokiError, LokiFormatError) as exc:
                out.error = str(exc)
                break
            returned = page.height
            # Defensive: what lies outside the asked range is not ours, and keeps the range shrinking.
            page = (page.filter((pl.col("ns") >= start) & (pl.col("ns") < end))
                    .sort("ns", descending=not forward, maintain_order=True))
            fresh = new_entries(page, boundary)
            if total + fresh.height >= budget and (returned >= limit or total + fresh.height > budget):
                fresh = fresh.head(budget - total)
                pages.append(fresh)
                reached = fresh["ns"][-1] if fresh.height else reached
                return pl.concat(pages), True, reached
            pages.append(fresh)
            total += fresh.height
            if returned < limit or page.height == 0:
                break  # Loki had no more than this in the range
            edge = page["ns"][-1]  # the last instant in this direction
            reached = edge
            if page["ns"][0] == edge:
                # A whole page at one nanosecond: asking from it again returns the same page. Step past it and
                # say so (Loki cannot page within one instant).
                out.notes.append(f"more than {limit} lines at {_iso(edge)}; lines of that instant beyond "
                                 f"page_limit may be missing")
                boundary = None
                if forward:
                    start = edge + 1
                else:
                    end = edge
            else:
                boundary = page.filter(pl.col("ns") == edge)
                if forward:
                    start = edge
                else:
                    end = edge + 1
        return (pl.concat(pages) if pages else pl.DataFrame(schema=PAGE_SCHEMA)), False, reached
