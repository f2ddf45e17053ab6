"""The collect step over lines of one job, whatever they come from (files on disk, an upload, lines that
arrived over HTTP): blocks of lines in -> Evidence out.

Every line is counted for who spoke (node from the line, else the file's or client's node; rank
likewise) and for training progress; only lines holding a rule literal are parsed in full and matched;
symptoms are ordered by block, then rule, then line. Memory: the candidate lines and per-rank counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from itertools import accumulate
from pathlib import Path

import polars as pl

from faultline import native
from faultline.collectors import files as filecol
from faultline.limits import CLI_READ, ReadLimits
from faultline.evidence import (JOBS_SCHEMA, PROGRESS_SCHEMA, STATS_SCHEMA, Evidence, file_coverage)
from faultline.logparse import (PROGRESS, TS_DTYPE, detail_exprs, identity_exprs, line_times, progress_lines,
                                with_identity_keys)
from faultline.rules.extract import KEY, LOG_SCHEMA, SYMPTOM_SCHEMA, extract_logs, prefilter_expr, prefilter_literals
from faultline.rules.model import Ruleset

PARSE_BATCH_ROWS = 1 << 17  # lines of small files parsed together (a 16 MiB block alone is about this)
EXTRACT_BATCH_ROWS = 1 << 18  # candidate lines gathered before one extract (bounds memory)


def _own_copy(s: pl.Expr) -> pl.Expr:
    """The same strings in buffers of their own. A filtered or parsed String column still points into
    the whole block it came from (Polars' string views share buffers), so a few kept candidate lines
    would keep every 16 MiB block of a big file alive: 3 GB of memory for a 2 GB log. A replace copies
    (an empty match at the start, replaced by nothing: the value is unchanged)."""
    return s.str.replace("^", "")


def unquote(line: pl.Expr) -> pl.Expr:
    """A log quoted in a reply (`> ` or `>> ` before every line: mailing lists, forum and issue replies;
    or each line in markdown's inline-code backticks) reads as the log itself; a quote marker says nothing
    about who spoke or what failed."""
    return line.str.replace(r"^(?:>[ \t]?)+", "").str.replace(r"^`([^`\n]*)`\s*$", "${1}")


@dataclass
class JobMeta:
    cluster: str = "local"
    job_id: str = "job"
    attempt: int = 0
    state: str = "UNKNOWN"
    exit_code: int | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None


def _joined_routes(heights: list[int], routes: list) -> tuple[pl.Series, pl.Series] | None:
    """The (row, literal) routes of frames stacked in order, or None unless every frame has its own: each
    frame's rows shifted by the heights before it (a Series sum, not a loop over the candidates)."""
    if not routes or any(r is None for r in routes):
        return None
    offsets = accumulate(heights[:-1], initial=0)
    rows = pl.concat([pl.Series(r, dtype=pl.UInt32) + off for (r, _), off in zip(routes, offsets)])
    return rows, pl.concat([pl.Series(lt, dtype=pl.UInt32) for _, lt in routes])


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
        self._progress: list[pl.DataFrame] = []
        self._dcounts: list[pl.DataFrame] = []  # lines per who-spoke key, from the native scanner
        self._dcand: list[pl.DataFrame] = []  # candidate lines, from the native scanner
        self._dcand_routes: list = []  # for each, its (row, literal) routes from the reader, or None
        self._pending_routes: list = []  # likewise for each frame of _pending
        self._drows = 0
        self._blocks = 0
        self.bytes_read = 0  # text bytes of all files read so far (the job's ReadLimits count these)
        self.lines_read = 0

    def report(self, name: str, source: str, node: str | None, rank: int | None) -> filecol.FileReport:
        rep = filecol.FileReport(name, source, node, rank)
        self.reports.append(rep)
        return rep

    def read_file(self, path: Path, rep: filecol.FileReport, limits: ReadLimits = CLI_READ,
                  block_bytes: int = filecol.BLOCK_BYTES, max_line: int = filecol.MAX_LINE,
                  reader: native.Reader | None = None) -> None:
        """One file on disk through the collect step, within the job's `limits`. Whatever stopped the
        reading (damage, a limit) is on `rep`, with what was read before it kept: never raised. `reader`:
        this file's native read, already started (native.prestart); used if it reads what this would."""
        left_bytes, left_lines = limits.job_bytes - self.bytes_read, limits.job_lines - self.lines_read
        if left_bytes <= 0 or left_lines <= 0:
            what = f"{limits.job_bytes} bytes of text" if left_bytes <= 0 else f"{limits.job_lines} lines"
            rep.status, rep.reason = "error", f"not read: the job's limit of {what} was reached by earlier files"
            return
        file_cap = limits.file_bytes if filecol.is_compressed(path) else left_bytes
        cap = min(file_cap, left_bytes)
        seq = 0
        quoted = filecol.looks_quoted(path)  # read by the Polars path, which takes the quote marks off
        scanner = None if quoted else native.scanner(tuple(self.literals))
        router = native.router(tuple(self.ruleset.log_routes[0])) if scanner is not None else None
        if reader is not None and (scanner is None or reader.rep is not rep
                                   or reader.key != (path, scanner, block_bytes, max_line, cap, left_lines, router)):
            reader.close()
            reader = None
        try:
            if scanner is not None:  # the native pass, in a thread ahead of this one: no frame of every line
                reader = reader or native.Reader(path, rep, scanner, block_bytes, max_line, cap, left_lines, router)
                for d in reader:
                    seq = self.add_digest(d, rep, seq)
                if reader.line_cut:
                    self._line_cut_note(rep, limits)
                else:
                    self._cut_note(rep, cap, file_cap, left_bytes)
                return
            for block in filecol.read_blocks(path, rep, block_bytes, max_line, max_bytes=cap):
                if block.height >= left_lines:
                    block, left_lines = block.head(left_lines), 0
                else:
                    left_lines -= block.height
                seq = self.add(block, rep, seq, quoted=quoted)
                if left_lines == 0:
                    self._line_cut_note(rep, limits)
                    break
            else:
                self._cut_note(rep, cap, file_cap, left_bytes)
        except filecol.READ_ERRORS as exc:  # unreadable, corrupt archive, ...
            rep.status, rep.reason = "error", f"{type(exc).__name__}: {exc}"[:300]
        finally:
            if reader is not None:
                reader.close()
            self.bytes_read += rep.bytes
            self.lines_read += rep.lines

    @staticmethod
    def _line_cut_note(rep: filecol.FileReport, limits: ReadLimits) -> None:
        rep.status = "error"
        rep.reason = f"cut after line {rep.lines}: the job's limit of {limits.job_lines} lines was reached"

    @staticmethod
    def _cut_note(rep: filecol.FileReport, cap: int, file_cap: int, left_bytes: int) -> None:
        if rep.cut_at is not None:
            which = ("the limit of decompressed bytes per file" if cap == file_cap and cap < left_bytes
                     else "the job's limit of bytes of text")
            rep.status = "error"
            rep.reason = f"cut after {rep.cut_at} bytes of text (line {rep.lines}): {which} ({cap} bytes) was reached"

    def add_digest(self, d: native.Digest, rep: filecol.FileReport, seq0: int) -> int:
        """One piece of one file as the native scanner saw it (what `add` and `_parse` make of a block's
        frame, without one). Returns the next seq."""
        rep.replaced_chars += d.replaced
        rep.truncated_lines += d.truncated
        if d.lines == 0:
            return seq0
        rep.lines += d.lines
        fnode, frank = pl.lit(rep.node, pl.String), pl.lit(rep.rank, pl.Int32)
        keys = pl.Series("_k", d.keys, dtype=pl.String)
        self._dcounts.append(pl.DataFrame([keys, pl.Series("lines", d.counts, dtype=pl.Int64)])
                             .with_columns(_fnode=fnode, _frank=frank))
        if d.cand_index:
            self._dcand.append(pl.DataFrame([
                pl.Series("line", d.cand_text, dtype=pl.String), keys.gather(d.cand_key),
                pl.Series("seq", d.cand_index, dtype=pl.Int64) + seq0]).with_columns(
                source=pl.lit(rep.source), file=pl.lit(rep.path), _fnode=fnode, _frank=frank,
                _rts=pl.lit(None, TS_DTYPE), _blk=pl.lit(self._blocks, pl.Int64)))
            self._dcand_routes.append(None if d.route_rows is None else (d.route_rows, d.route_lits))
        last = d.progress
        if d.unsure_index:  # non-ASCII lines holding "loss": the regex itself decides
            unsure = pl.DataFrame({"i": d.unsure_index, "line": d.unsure_text}).filter(
                pl.col("i") > last, pl.col("line").str.contains(PROGRESS))
            if unsure.height:
                last = int(unsure["i"].max())
        if last >= 0:
            self._progress.append(pl.DataFrame({**self.key, "file": rep.path, "last_progress": seq0 + last},
                                               schema={"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32,
                                                       "file": pl.String, "last_progress": pl.Int64}))
        self._blocks += 1
        self._drows += len(d.keys) + len(d.cand_index)
        if self._drows >= PARSE_BATCH_ROWS:
            self._resolve_digests()
        return seq0 + d.lines

    def _resolve_digests(self) -> None:
        if not self._dcounts:
            return
        counts = pl.concat(self._dcounts, how="vertical")
        cand = pl.concat(self._dcand, how="vertical") if self._dcand else None
        routes = _joined_routes([c.height for c in self._dcand], self._dcand_routes)
        self._dcounts.clear()
        self._dcand.clear()
        self._dcand_routes.clear()
        self._drows = 0
        self._resolve(counts, cand, own=False, routes=routes)

    def add(self, block: pl.DataFrame, rep: filecol.FileReport, seq0: int, quoted: bool = False) -> int:
        """One block of one file: column `line`, optionally `_fnode`/`_frank`/`_fsource` (what the client
        said per line) and `_rts` (the time a source received the line); `quoted`: the file is a quoted
        log, whose quote marks come off. Returns the next seq."""
        n = block.height
        if n == 0:
            return seq0
        if quoted:
            block = block.with_columns(line=unquote(pl.col("line")))
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
        routes = _joined_routes([c.height for c in self._pending], self._pending_routes)
        self._pending.clear()
        self._pending_routes.clear()
        sym = extract_logs(cand.drop("_blk"), self.ruleset, self.literals, prefiltered=True, routes=routes)
        if sym.height:
            # the line's local_rank, GPU and time, for symptom lines only (a capture of the rule wins, as in
            # extract; the line's own time wins over the time a source received it)
            d = detail_exprs(self.year)
            sym = sym.with_columns(local_rank=pl.coalesce("local_rank", d["local_rank"]),
                                   gpu=pl.coalesce("gpu", d["gpu"]),
                                   ts=pl.coalesce(pl.lit(line_times(sym["line"], self.year)), "ts"))
            sym = (sym.join(cand.select("file", "seq", "_blk"), on=["file", "seq"], how="left", maintain_order="left")
                   .sort("_blk", maintain_order=True).drop("_blk"))
        self._symptoms.append(sym)

    def _parse(self) -> None:
        """Who spoke every line, progress, candidates. Node and rank come from each distinct identity key
        (`logparse.with_identity_keys`: most lines share a few hundred prefixes), counted per key before they
        are parsed; only candidate lines are given their node and rank row by row."""
        if not self._raw:
            return
        raw = pl.concat(self._raw, how="vertical")
        self._raw.clear()
        # The passes over every line run on Polars' streaming engine, which splits them over the cores.
        lines = with_identity_keys(raw.lazy()).collect(engine="streaming").lazy()
        job = {"cluster": pl.lit(self.job.cluster), "job_id": pl.lit(self.job.job_id),
               "attempt": pl.lit(self.job.attempt, pl.Int32)}
        counts, progress, cand = pl.collect_all([
            lines.group_by("_k", "_fnode", "_frank").agg(lines=pl.len().cast(pl.Int64)),
            progress_lines(lines).select(**job, file="file", seq="seq")
            .group_by([*KEY, "file"]).agg(last_progress=pl.col("seq").max()),
            lines.filter(prefilter_expr(self.literals))], engine="streaming")
        self._progress.append(progress)
        self._resolve(counts, cand if cand.height else None, own=True)

    def _resolve(self, counts: pl.DataFrame, cand: pl.DataFrame | None, own: bool, routes=None) -> None:
        """Node and rank of each distinct key (`counts`: _k, _fnode, _frank, lines) into per-rank stats, and
        of the candidate lines (`cand`) into the lines extract will read. `own`: the candidates' strings
        still share their block's buffers (see _own_copy). local_rank, gpu and the line's time are read
        after extract, from the symptom lines only (_flush). `routes`: the candidates' (row, literal) pairs
        found by the native reader (the join below keeps the candidates' order and number), or None."""
        job = {"cluster": pl.lit(self.job.cluster), "job_id": pl.lit(self.job.job_id),
               "attempt": pl.lit(self.job.attempt, pl.Int32)}
        who = counts.select("_k").unique().with_columns(**identity_exprs(column="_k")).with_columns(
            node=_own_copy(pl.col("node")))
        self._stats.append(counts.join(who, on="_k", how="left").select(
            **job, node=pl.coalesce("node", "_fnode"), rank=pl.coalesce("rank", "_frank"), lines="lines"))
        if cand is not None and cand.height:
            cand = (cand.join(who, on="_k", how="left", maintain_order="left")
                    .with_columns(**job, node=pl.coalesce("node", "_fnode"), rank=pl.coalesce("rank", "_frank"),
                                  local_rank=pl.lit(None, pl.Int32), gpu=pl.lit(None, pl.Int32),
                                  ts=pl.col("_rts").cast(TS_DTYPE)))
            cand = cand.select(*LOG_SCHEMA, "_blk")
            self._pending.append(cand.with_columns(line=_own_copy(pl.col("line"))) if own else cand)
            self._pending_routes.append(routes)
            if sum(c.height for c in self._pending) >= EXTRACT_BATCH_ROWS:
                self._flush()

    def evidence(self) -> Evidence:
        self._parse()
        self._resolve_digests()
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
        progress = (pl.concat(self._progress).group_by([*KEY, "file"]).agg(pl.col("last_progress").max())
                    if self._progress else pl.DataFrame(schema=PROGRESS_SCHEMA))
        return Evidence(jobs=jobs, symptoms=symptoms, stats=stats.cast(STATS_SCHEMA),
                        coverage=file_coverage(self.reports, self.key), files=self.reports,
                        progress=progress.cast(PROGRESS_SCHEMA))
