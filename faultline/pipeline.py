"""The engine end to end: evidence tables of many jobs in, one diagnosis per job out.

A single job from files is a fleet of one through the same phases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import polars as pl

from faultline.collectors import files as filecol
from faultline.logparse import PROGRESS, TS_DTYPE, detail_exprs, identity_exprs, year_hint
from faultline.rules.decide import DecideConfig, active_symptoms, candidates, decide
from faultline.rules.extract import KEY, LOG_SCHEMA, SYMPTOM_SCHEMA, extract_jobs, extract_logs, prefilter_expr, prefilter_literals
from faultline.rules.model import Ruleset
from faultline.rules.refine import filter_symptoms, refine
from faultline.rules.report import ReportConfig, build_diagnoses
from faultline.taxonomy import SOURCES

PROGRESS_SCHEMA = {"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "file": pl.String,
                   "last_progress": pl.Int64}
STATS_SCHEMA = {"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "node": pl.String,
                "rank": pl.Int32, "lines": pl.Int64}
COVERAGE_SCHEMA = {"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "source": pl.String,
                   "status": pl.String, "rows": pl.Int64, "reason": pl.String}
PARSE_BATCH_ROWS = 1 << 17  # lines of small files parsed together (a 16 MiB block alone is about this)
EXTRACT_BATCH_ROWS = 1 << 18  # candidate lines gathered before one extract (bounds memory)
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


@dataclass
class Result:
    diagnoses: list[dict]
    symptoms: pl.DataFrame  # after filter and refine: what the symptoms table stores


def run_engine(ev: Evidence, ruleset: Ruleset, decide_cfg: DecideConfig = DecideConfig(),
               report_cfg: ReportConfig = ReportConfig(), diagnosed_at: str | None = None) -> Result:
    """extract (scheduler rows) -> filter -> refine -> decide -> report, for every job of `ev` at once."""
    symptoms = pl.concat([ev.symptoms, extract_jobs(ev.jobs, ruleset)], how="vertical")
    symptoms = filter_symptoms(symptoms, ev.jobs)
    refined = refine(symptoms, ruleset, ev.progress)
    verdict = decide(refined, ev.stats, ev.jobs, decide_cfg, ev.coverage)
    cand = candidates(active_symptoms(refined, ev.stats), decide_cfg)
    meta = {"version": ruleset.version, "packs": list(ruleset.packs)}
    diagnoses = build_diagnoses(verdict, refined, cand, ev.stats, ev.coverage, meta, report_cfg, diagnosed_at)
    return Result(diagnoses, refined)


def run_phases(ev: Evidence, ruleset: Ruleset, decide_cfg: DecideConfig = DecideConfig(),
               report_cfg: ReportConfig = ReportConfig(), diagnosed_at: str | None = None) -> list[dict]:
    return run_engine(ev, ruleset, decide_cfg, report_cfg, diagnosed_at).diagnoses


def _job_year(paths: list[Path]) -> int:
    for p in paths:
        y = year_hint(filecol.sample_text(p))
        if y:
            return y
    # No full timestamp anywhere: the newest file's modification year is the best honest guess.
    mtimes = [p.stat().st_mtime for p in paths if p.exists()]
    return datetime.fromtimestamp(max(mtimes) if mtimes else 0, timezone.utc).year


def collect_files(paths: list[str | Path], ruleset: Ruleset, job_id: str = "job", cluster: str = "local",
                  attempt: int = 0, state: str = "UNKNOWN", block_bytes: int = filecol.BLOCK_BYTES,
                  max_line: int = filecol.MAX_LINE, exit_code: int | None = None) -> Evidence:
    """Stream the files of one job through parse + extract; keep only symptoms and per-rank stats."""
    files, reports = filecol.expand(paths)
    year = _job_year(files)
    literals = prefilter_literals(ruleset)
    key = {"cluster": cluster, "job_id": job_id, "attempt": attempt}
    symptom_parts, stat_parts, progress_parts = [], [], []
    # Blocks of many small files are parsed together (a 64-node job has 100+ files; per-call overhead
    # would dominate), and their candidate lines extracted together. Symptoms keep the order they had
    # when each block was extracted on its own: by block, then rule, then line.
    raw: list[pl.DataFrame] = []
    pending: list[pl.DataFrame] = []
    n_blocks = 0

    def flush() -> None:
        if not pending:
            return
        cand = pl.concat(pending, how="vertical")
        pending.clear()
        sym = extract_logs(cand, ruleset, literals)
        if sym.height:
            sym = (sym.join(cand.select("file", "seq", "_blk"), on=["file", "seq"], how="left", maintain_order="left")
                   .sort("_blk", maintain_order=True).drop("_blk"))
        symptom_parts.append(sym)

    def parse() -> None:
        if not raw:
            return
        ident = identity_exprs()
        # Every line is counted for who spoke; only lines holding a rule literal are parsed in
        # full and matched. A line's time is the one it carries, or none (never borrowed).
        lines = pl.concat(raw, how="vertical").with_columns(
            node=pl.coalesce(ident["node"], pl.col("_fnode")), rank=pl.coalesce(ident["rank"], pl.col("_frank")),
            cluster=pl.lit(cluster), job_id=pl.lit(job_id), attempt=pl.lit(attempt, pl.Int32))
        raw.clear()
        stat_parts.append(lines.group_by([*KEY, "node", "rank"]).agg(lines=pl.len().cast(pl.Int64)))
        progress_parts.append(lines.filter(pl.col("line").str.contains(PROGRESS))
                              .group_by([*KEY, "file"]).agg(last_progress=pl.col("seq").max()))
        cand = lines.filter(prefilter_expr(literals))
        if cand.height:
            pending.append(cand.with_columns(**detail_exprs(year)).select(*LOG_SCHEMA, "_blk"))
            if sum(c.height for c in pending) >= EXTRACT_BATCH_ROWS:
                flush()

    for path in files:
        source, node, rank = filecol.hints(path)
        rep = filecol.FileReport(str(path), source, node, rank)
        reports.append(rep)
        seq0 = 0
        try:
            for block in filecol.read_blocks(path, rep, block_bytes, max_line):
                n = block.height
                raw.append(block.with_columns(
                    source=pl.lit(source), file=pl.lit(str(path)), seq=pl.int_range(seq0, seq0 + n, dtype=pl.Int64),
                    _fnode=pl.lit(node, pl.String), _frank=pl.lit(rank, pl.Int32), _blk=pl.lit(n_blocks, pl.Int64)))
                n_blocks += 1
                seq0 += n
                rep.lines += n
                if sum(r.height for r in raw) >= PARSE_BATCH_ROWS:
                    parse()
        except filecol.READ_ERRORS as exc:  # unreadable, corrupt archive, ...
            rep.status, rep.reason = "error", f"{type(exc).__name__}: {exc}"[:300]
        if rep.status == "ok" and rep.lines == 0:
            rep.status, rep.reason = "empty", "file has no lines"
    parse()
    flush()
    symptoms = pl.concat(symptom_parts, how="vertical") if symptom_parts else pl.DataFrame(schema=SYMPTOM_SCHEMA)
    stats = (pl.concat(stat_parts).group_by([*KEY, "node", "rank"]).agg(pl.col("lines").sum())
             if stat_parts else pl.DataFrame(schema=STATS_SCHEMA))
    jobs = pl.DataFrame([{**key, "state": state, "exit_code": exit_code, "signal": None,
                          "start_time": None, "end_time": None}], schema=JOBS_SCHEMA)
    progress = (pl.concat(progress_parts).group_by([*KEY, "file"]).agg(pl.col("last_progress").max())
                if progress_parts else pl.DataFrame(schema=PROGRESS_SCHEMA))
    return Evidence(jobs=jobs, symptoms=symptoms, stats=stats.cast(STATS_SCHEMA),
                    coverage=file_coverage(reports, key), files=reports, progress=progress.cast(PROGRESS_SCHEMA))


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


def adopt_spoken_job_id(ev: Evidence) -> Evidence:
    """A job id guessed from a folder name yields to the Slurm id the job's own lines name
    (`*** JOB 55595933 ON ...`): the guess would make the filter phase drop those lines as another
    job's. Where several ids are spoken (a reused output file), the last one in file order ran last."""
    spoken = (ev.symptoms.sort("file", "seq")
              .select(pl.coalesce(pl.col("captures").str.json_path_match("$.job"),
                                  pl.col("captures").str.json_path_match("$.step")).str.extract(r"^(\d+)"))
              .to_series().drop_nulls())
    if spoken.len() == 0:
        return ev
    job_id = pl.lit(spoken[-1])
    return Evidence(*(f.with_columns(job_id=job_id) for f in (ev.jobs, ev.symptoms, ev.stats, ev.coverage)),
                    files=ev.files, progress=None if ev.progress is None else ev.progress.with_columns(job_id=job_id))


def diagnose_files(paths: list[str | Path], ruleset: Ruleset, *, job_id_guessed: bool = False, **kw) -> dict:
    """One job's diagnosis from its files. `job_id_guessed`: the id came from a folder or file name,
    not from the user or the scheduler, so the job's own Slurm lines may correct it."""
    decide_cfg = kw.pop("decide_cfg", DecideConfig())
    report_cfg = kw.pop("report_cfg", ReportConfig())
    diagnosed_at = kw.pop("diagnosed_at", None)
    ev = collect_files(paths, ruleset, **kw)
    if job_id_guessed:
        ev = adopt_spoken_job_id(ev)
    return run_phases(ev, ruleset, decide_cfg, report_cfg, diagnosed_at)[0]
