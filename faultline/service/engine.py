"""The engine for the service: log lines held in memory or in the session store -> one diagnosis.

`faultline.pipeline.collect_files` streams files from disk; a session's evidence is lines that arrived
over HTTP (with node, rank and source said by the client, or Loki labels), so the service needs the
same collect step over line frames. `LineCollector` is that step, built only on the engine's public
pieces (`logparse.identity_exprs/detail_exprs`, `extract.prefilter_*`/`extract_logs`,
`pipeline.file_coverage`, `pipeline.run_engine`), and it does what `collect_files` does, in the same
order: every line counted for who spoke (node from the line, else the file's or client's node; rank
likewise), only lines holding a rule literal parsed in full and matched, symptoms ordered by block
(one file = one block), then rule, then line. A file's name gives the same hints as a file on disk
(`collectors.files.hints`: `node-a/syslog` is node-a's syslog), an explicit node/rank/source wins.

Both `POST /v1/diagnose` (files, read through `collectors.files.read_blocks`) and every session
attribution (lines from DuckDB) go through it. `tests/test_sessions.py` asserts that the verdict
equals `faultline diagnose` on the same lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

import polars as pl

from faultline.collectors import files as filecol
from faultline.logparse import TS_DTYPE, detail_exprs, identity_exprs, year_hint
from faultline.pipeline import (JOBS_SCHEMA, PARSE_BATCH_ROWS, STATS_SCHEMA, EXTRACT_BATCH_ROWS, Evidence,
                                file_coverage, run_phases)
from faultline.rules.decide import DecideConfig
from faultline.rules.extract import KEY, LOG_SCHEMA, SYMPTOM_SCHEMA, extract_logs, prefilter_expr, prefilter_literals
from faultline.rules.model import Ruleset
from faultline.rules.report import ReportConfig

YEAR_SAMPLE_BYTES = 1 << 20


@dataclass
class JobMeta:
    cluster: str = "local"
    job_id: str = "job"
    attempt: int = 0
    state: str = "UNKNOWN"
    exit_code: int | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None


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


class LineCollector:
    """Blocks of lines of one job -> Evidence. Memory: the candidate lines and per-rank counts only."""

    def __init__(self, ruleset: Ruleset, job: JobMeta, year: int):
        self.ruleset, self.job, self.year = ruleset, job, year
        self.literals = prefilter_literals(ruleset)
        self.key = {"cluster": job.cluster, "job_id": job.job_id, "attempt": job.attempt}
        self.reports: list[filecol.FileReport] = []
        self._raw: list[pl.DataFrame] = []
        self._pending: list[pl.DataFrame] = []
        self._symptoms: list[pl.DataFrame] = []
        self._stats: list[pl.DataFrame] = []
        self._blocks = 0

    def report(self, name: str, source: str, node: str | None, rank: int | None) -> filecol.FileReport:
        rep = filecol.FileReport(name, source, node, rank)
        self.reports.append(rep)
        return rep

    def add(self, block: pl.DataFrame, rep: filecol.FileReport, seq0: int) -> int:
        """One block of one file: column `line`, optionally `_fnode`/`_frank`/`_fsource` (what the client
        said per line) and `_rts` (the time a source received the line). Returns the next seq."""
        n = block.height
        if n == 0:
            return seq0
        cols = {"source": pl.lit(rep.source), "_fnode": pl.lit(rep.node, pl.String),
                "_frank": pl.lit(rep.rank, pl.Int32), "_rts": pl.lit(None, TS_DTYPE)}
        extra = {k: v for k, v in cols.items() if k not in block.columns}
        if "_fsource" in block.columns:
            extra["source"] = pl.coalesce(pl.col("_fsource"), pl.lit(rep.source))
        self._raw.append(block.with_columns(
            **extra, file=pl.lit(rep.path), seq=pl.int_range(seq0, seq0 + n, dtype=pl.Int64),
            _blk=pl.lit(self._blocks, pl.Int64)).select(
            "line", "source", "file", "seq", pl.col("_fnode").cast(pl.String), pl.col("_frank").cast(pl.Int32),
            pl.col("_rts").cast(TS_DTYPE), "_blk"))
        self._blocks += 1
        rep.lines += n
        if sum(r.height for r in self._raw) >= PARSE_BATCH_ROWS:
            self._parse()
        return seq0 + n

    def _flush(self) -> None:
        if not self._pending:
            return
        cand = pl.concat(self._pending, how="vertical")
        self._pending.clear()
        sym = extract_logs(cand.drop("_blk"), self.ruleset, self.literals)
        if sym.height:
            sym = (sym.join(cand.select("file", "seq", "_blk"), on=["file", "seq"], how="left", maintain_order="left")
                   .sort("_blk", maintain_order=True).drop("_blk"))
        self._symptoms.append(sym)

    def _parse(self) -> None:
        if not self._raw:
            return
        ident = identity_exprs()
        lines = pl.concat(self._raw, how="vertical").with_columns(
            node=pl.coalesce(ident["node"], pl.col("_fnode")), rank=pl.coalesce(ident["rank"], pl.col("_frank")),
            cluster=pl.lit(self.job.cluster), job_id=pl.lit(self.job.job_id),
            attempt=pl.lit(self.job.attempt, pl.Int32))
        self._raw.clear()
        self._stats.append(lines.group_by([*KEY, "node", "rank"]).agg(lines=pl.len().cast(pl.Int64)))
        cand = lines.filter(prefilter_expr(self.literals))
        if cand.height:
            d = detail_exprs(self.year)
            cand = cand.with_columns(local_rank=d["local_rank"], gpu=d["gpu"],
                                     ts=pl.coalesce(d["ts"], pl.col("_rts")))  # the line's own time wins
            self._pending.append(cand.select(*LOG_SCHEMA, "_blk"))
            if sum(c.height for c in self._pending) >= EXTRACT_BATCH_ROWS:
                self._flush()

    def evidence(self) -> Evidence:
        self._parse()
        self._flush()
        for rep in self.reports:
            if rep.status == "ok" and rep.lines == 0:
                rep.status, rep.reason = "empty", "file has no lines"
        symptoms = (pl.concat(self._symptoms, how="vertical") if self._symptoms
                    else pl.DataFrame(schema=SYMPTOM_SCHEMA))
        stats = (pl.concat(self._stats).group_by([*KEY, "node", "rank"]).agg(pl.col("lines").sum())
                 if self._stats else pl.DataFrame(schema=STATS_SCHEMA))
        j = self.job
        jobs = pl.DataFrame([{**self.key, "state": j.state, "exit_code": j.exit_code, "signal": None,
                              "start_time": j.start_time, "end_time": j.end_time}], schema=JOBS_SCHEMA)
        return Evidence(jobs=jobs, symptoms=symptoms, stats=stats.cast(STATS_SCHEMA),
                        coverage=file_coverage(self.reports, self.key), files=self.reports)


def attribute(ev: Evidence, ruleset: Ruleset, max_drain: int = 2, diagnosed_at: str | None = None) -> dict:
    """The engine's phases over one job's evidence -> its diagnosis."""
    return run_phases(ev, ruleset, DecideConfig(), ReportConfig(max_drain=max_drain), diagnosed_at)[0]


def collect_uploaded_files(root: Path, paths: list[Path], ruleset: Ruleset, job: JobMeta) -> Evidence:
    """Files written under `root` (an upload) -> Evidence, each file named relative to `root` (as uploaded)."""
    paths = sorted(paths, key=lambda p: file_order(str(p.relative_to(root))))
    year = year_of([filecol.sample_text(p, YEAR_SAMPLE_BYTES) for p in paths])
    col = LineCollector(ruleset, job, year)
    for path in paths:
        source, node, rank = filecol.hints(path)
        rep = col.report(str(path.relative_to(root)), source, node, rank)
        seq = 0
        try:
            for block in filecol.read_blocks(path, rep):
                seq = col.add(block, rep, seq)
        except filecol.READ_ERRORS as exc:  # unreadable, corrupt archive, ...
            rep.status, rep.reason = "error", f"{type(exc).__name__}: {exc}"[:300]
    return col.evidence()
