"""The engine for the service: log lines held in memory or in the session store -> one diagnosis.

A session's evidence is lines that arrived over HTTP (with node, rank and source said by the client, or
Loki labels); they go through the same collect step as files on disk (`faultline.collect_lines`,
which `pipeline.collect_files` uses too). A file's name gives the same hints as a file on disk
(`collectors.files.hints`: `node-a/syslog` is node-a's syslog), an explicit node/rank/source wins.

Both `POST /v1/diagnose` (files, read through `collectors.files.read_blocks`) and every session
attribution (lines from DuckDB) go through it. `tests/test_sessions.py` asserts that the verdict
equals `faultline diagnose` on the same lines.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

import polars as pl

from faultline.collectors import files as filecol
from faultline.collect_lines import JobMeta, LineCollector  # noqa: F401 - the service's names for them
from faultline.limits import CLI_READ, ReadLimits
from faultline.logparse import year_hint
from faultline.pipeline import Evidence, run_phases
from faultline.rules.decide import DecideConfig
from faultline.rules.model import Ruleset
from faultline.rules.report import ReportConfig

YEAR_SAMPLE_BYTES = 1 << 20


def file_order(name: str) -> tuple:
    """Files are read in the order `faultline diagnose` reads a folder's files: by path parts."""
    return PurePosixPath(name).parts


def year_of(samples: list[pl.Series], fallback: datetime | None = None) -> int:
    """The year of timestamps without one (syslog `Nov 20 10:02:00`): the first file (in order) whose
    first MiB carries full timestamps decides, as for `faultline diagnose`; else the fallback's year."""
    for s in samples:
        y = year_hint(s)
        if y:
            return y
    return (fallback or datetime.now(timezone.utc)).year


def attribute(ev: Evidence, ruleset: Ruleset, max_drain: int = 2, diagnosed_at: str | None = None) -> dict:
    """The engine's phases over one job's evidence -> its diagnosis."""
    return run_phases(ev, ruleset, DecideConfig(), ReportConfig(max_drain=max_drain), diagnosed_at)[0]


def collect_uploaded_files(root: Path, paths: list[Path], ruleset: Ruleset, job: JobMeta,
                           limits: ReadLimits = CLI_READ) -> Evidence:
    """Files written under `root` (an upload) -> Evidence, each file named relative to `root` (as uploaded).
    `limits`: the request's (Settings.read_limits): text past them is cut, and the coverage says where."""
    paths = sorted(paths, key=lambda p: file_order(str(p.relative_to(root))))
    year = year_of([filecol.sample_text(p, YEAR_SAMPLE_BYTES) for p in paths])
    col = LineCollector(ruleset, job, year)
    for path in paths:
        source, node, rank = filecol.hints(path)
        col.read_file(path, col.report(str(path.relative_to(root)), source, node, rank), limits)
    return col.evidence()
