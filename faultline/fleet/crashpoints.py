"""Named failure points between the writes of collect and diagnose, for the tests that kill runs.

`point(name)` does nothing in normal runs. A test arms it either in-process (`arm(fn)`: fn(name) may
raise `SimulatedKill`, a BaseException, so no `except Exception` cleanup runs: what a kill leaves) or
in a subprocess through the environment (`FAULTLINE_KILL_AT=collect.jobs`: the process SIGKILLs
itself there, for real).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

ENV = "FAULTLINE_KILL_AT"
POINTS = ("collect.jobs", "collect.logs", "collect.coverage", "collect.committed",
          "diagnose.diagnoses", "diagnose.symptoms", "diagnose.committed")

_hook: Callable[[str], None] | None = None


class SimulatedKill(BaseException):
    """A run killed at a failure point (a BaseException: cleanup for ordinary errors does not run)."""


def arm(hook: Callable[[str], None] | None) -> None:
    global _hook
    _hook = hook


def point(name: str) -> None:
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if _hook is not None:
        _hook(name)
