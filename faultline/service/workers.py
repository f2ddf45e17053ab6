"""Diagnoses run in worker threads, never on the event loop, at most `size` at once.

A request waits for a free worker at most `queue_timeout_s`, then gets a 503 (`Busy`). A started
diagnosis runs to its end even if its client went away (a thread cannot be stopped halfway), and
keeps its worker until then, so the bound holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread

T = TypeVar("T")


class Busy(Exception):
    def __init__(self, waited_s: float, size: int, what: str = "diagnosis workers"):
        super().__init__(f"all {size} {what} stayed busy for {waited_s:.1f} s")
        self.waited_s, self.size = waited_s, size


class WorkerPool:
    """Create it inside the event loop that uses it (the app's lifespan does)."""

    def __init__(self, size: int, queue_timeout_s: float):
        self.size, self.queue_timeout_s = size, queue_timeout_s
        self._slots = anyio.Semaphore(size)
        self._threads = anyio.CapacityLimiter(size)  # own threads: never share the default pool's tokens
        self.running = 0
        self.waiting = 0

    async def run(self, fn: Callable[..., T], *args) -> tuple[T, float, float]:
        """fn(*args) in a worker thread -> (result, seconds queued, seconds running)."""
        t0 = time.perf_counter()
        self.waiting += 1
        try:
            try:
                self._slots.acquire_nowait()
            except anyio.WouldBlock:
                with anyio.fail_after(self.queue_timeout_s):
                    await self._slots.acquire()
        except TimeoutError:
            raise Busy(time.perf_counter() - t0, self.size) from None
        finally:
            self.waiting -= 1
        t1 = time.perf_counter()
        self.running += 1
        try:
            result = await anyio.to_thread.run_sync(fn, *args, limiter=self._threads)
        finally:
            self.running -= 1
            self._slots.release()
        return result, t1 - t0, time.perf_counter() - t1
