"""What the engine's phases take for any number of jobs (`Evidence`), and the coverage of files."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from faultline.collectors import files as filecol
from faultline.logparse import TS_DTYPE
from faultline.taxonomy import SOURCES

PROGRESS_SCHEMA = {"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "file": pl.String,
                   "last_progress": pl.Int64}
STATS_SCHEMA = {"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "node": pl.String,
                "rank": pl.Int32, "lines": pl.Int64}
COVERAGE_SCHEMA = {"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "source": pl.String,
                   "status": pl.String, "rows": pl.Int64, "reason": pl.String}
JOBS_SCHEMA = {"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "state": pl.String,
               "exit_code": pl.Int32, "signal": pl.Int32, "start_time": TS_DTYPE, "end_time": TS_DTYPE}


@dataclass
class Evidence:
    """What the phases need, for any number of jobs."""

    jobs: pl.DataFrame
    symptoms: pl.DataFrame
    stats: pl.DataFrame
    coverage: pl.DataFrame
    files: list[filecol.FileReport] = field(default_factory=list)
    progress: pl.DataFrame | None = None  # job x file: the last line that showed training progress


def file_coverage(reports: list[filecol.FileReport], key: dict) -> pl.DataFrame:
    """One coverage row per source: ok if any file of it had lines; files with problems are named."""
    rows = []
    for source in SOURCES:
        mine = [r for r in reports if r.source == source]
        if not mine:
            rows.append({**key, "source": source, "status": "not_configured", "rows": 0, "reason": "no file of this kind given"})
            continue
        lines = sum(r.lines for r in mine)
        notes = [f"{Path(r.path).name}: {r.status}" + (f" ({r.note()})" if r.note() else "")
                 for r in mine if r.status != "ok" or r.note()]
        # A file that could not be read whole (unreadable, truncated archive, binary) leaves the source
        # incomplete: `error`, with the rows that were read, so nothing downstream takes it as whole.
        status = "error" if any(r.status == "error" for r in mine) else ("ok" if lines else "empty")
        rows.append({**key, "source": source, "status": status, "rows": lines, "reason": "; ".join(notes)[:1000]})
    return pl.DataFrame(rows, schema=COVERAGE_SCHEMA)
