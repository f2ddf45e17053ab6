"""The engine end to end: evidence tables of many jobs in, one diagnosis per job out.

A single job from files is a fleet of one through the same phases.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import polars as pl

from faultline import native
from faultline.collect_lines import JobMeta, LineCollector
from faultline.collectors import files as filecol
from faultline.evidence import Evidence
from faultline.limits import CLI_READ, ReadLimits
from faultline.logparse import year_hint
from faultline.rules.decide import DecideConfig, active_symptoms, candidates, decide
from faultline.rules.extract import extract_jobs
from faultline.rules.model import Ruleset
from faultline.rules.refine import filter_symptoms, refine
from faultline.rules.report import ReportConfig, build_diagnoses


@dataclass
class Result:
    diagnoses: list[dict]
    symptoms: pl.DataFrame  # after filter and refine: what the symptoms table stores


def run_engine(ev: Evidence, ruleset: Ruleset, decide_cfg: DecideConfig = DecideConfig(),
               report_cfg: ReportConfig = ReportConfig(), diagnosed_at: str | None = None) -> Result:
    """extract (scheduler rows) -> filter -> refine -> decide -> report, for every job of `ev` at once."""
    symptoms = pl.concat([ev.symptoms, extract_jobs(ev.jobs, ruleset)], how="vertical")
    symptoms = filter_symptoms(symptoms, ev.jobs)
    refined = refine(symptoms, ruleset, ev.progress, ev.stats)
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
                  max_line: int = filecol.MAX_LINE, exit_code: int | None = None,
                  read_limits: ReadLimits = CLI_READ, prestarted: native.Prestarted | None = None) -> Evidence:
    """Stream the files of one job through the collect step; keep only symptoms and per-rank stats.
    Whatever could not be read (a missing path, an unreadable folder, a FIFO, text past a limit of
    `read_limits`) is in the coverage. `prestarted`: the read of the first file, already started by
    `native.prestart(paths, ...)` (read_file checks that it reads what it would itself)."""
    files, problems = (prestarted.files, prestarted.problems) if prestarted else filecol.expand(paths)
    col = LineCollector(ruleset, JobMeta(cluster, job_id, attempt, state, exit_code), _job_year(files))
    col.reports += problems
    try:
        for i, path in enumerate(files):
            if i == 0 and prestarted is not None:
                col.reports.append(prestarted.rep)
                col.read_file(path, prestarted.rep, read_limits, block_bytes, max_line, reader=prestarted.reader)
                continue
            source, node, rank = filecol.hints(path)
            col.read_file(path, col.report(str(path), source, node, rank), read_limits, block_bytes, max_line)
    finally:
        if prestarted is not None:
            prestarted.close()
    return col.evidence()


def adopt_spoken_job_id(ev: Evidence) -> Evidence:
    """A job id guessed from a folder name yields to the Slurm id the job's own lines name
    (`*** JOB 55595933 ON ...`): the guess would make the filter phase drop those lines as another
    job's. Where several ids are spoken (a reused output file), the last one in file order ran last."""
    # only captures that name a job or step are parsed (a key of the JSON extract encodes is that text)
    names = pl.col("captures").str.contains('"job"', literal=True) | pl.col("captures").str.contains('"step"', literal=True)
    spoken = (ev.symptoms.sort("file", "seq").filter(names)
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
