"""Diagnose every failed job of a window at once, from the warehouse, through the same engine
as a single job. Pure functions from frames to frames; the flows do the reading and writing."""

from __future__ import annotations

import json
from datetime import datetime

import polars as pl

from faultline.pipeline import Evidence, Result, run_engine
from faultline.rules.decide import DecideConfig
from faultline.logparse import detail_exprs, progress_lines
from faultline.rules.extract import extract_logs, prefilter_expr, prefilter_literals
from faultline.rules.metric import extract_metrics
from faultline.rules.model import Ruleset
from faultline.rules.report import ReportConfig
from faultline.taxonomy import FAILED_STATES
from faultline.warehouse.schema import JOB_KEY, TABLES


def with_line_details(lines: pl.DataFrame, year: int) -> pl.DataFrame:
    """The time a line carries wins over the receive time; GPU and local rank from its prefix."""
    detail = detail_exprs(year)
    return lines.with_columns(local_rank=detail["local_rank"], gpu=detail["gpu"],
                              ts=pl.coalesce(detail["ts"], pl.col("ts")))


def evidence_from_tables(jobs: pl.DataFrame, logs: pl.DataFrame, coverage: pl.DataFrame,
                         ruleset: Ruleset, metrics: pl.DataFrame | None = None) -> Evidence:
    """Failed jobs with their lines and coverage -> the engine's evidence (extract runs here)."""
    failed = jobs.filter(pl.col("state").is_in(list(FAILED_STATES)))
    logs = logs.join(failed.select(JOB_KEY), on=JOB_KEY, how="semi")
    stats = logs.group_by([*JOB_KEY, "node", "rank"]).agg(lines=pl.len().cast(pl.Int64))
    literals = prefilter_literals(ruleset)
    candidates = logs.filter(prefilter_expr(literals))
    year = int(failed["end_time"].dt.year().max() or 1970)
    symptoms = extract_logs(with_line_details(candidates, year), ruleset, literals)
    if metrics is not None and metrics.height:  # metric rules: symptoms of the same shape, decided alike
        symptoms = pl.concat([symptoms, extract_metrics(metrics, failed, ruleset)])
    cov = coverage.join(failed.select(JOB_KEY), on=JOB_KEY, how="semi").select(
        *JOB_KEY, "source", "status", "rows", "reason")
    progress = (progress_lines(logs)
                .group_by([*JOB_KEY, "file"]).agg(last_progress=pl.col("seq").max()))
    return Evidence(jobs=failed.select(*JOB_KEY, "state", "exit_code", "signal", "start_time", "end_time"),
                    symptoms=symptoms, stats=stats, coverage=cov, progress=progress)


def diagnoses_frame(result: Result, jobs: pl.DataFrame, ruleset_version: str) -> pl.DataFrame:
    """The engine's JSON diagnoses -> the diagnoses table (flat columns for SQL + the JSON itself)."""
    rows = [{
        "cluster": d["cluster"], "job_id": d["job_id"], "attempt": d["attempt"], "ruleset": ruleset_version,
        "outcome": d["outcome"], "domain": d["domain"], "root_cause": d["root_cause"],
        "culprit_nodes": d["culprit"]["nodes"], "culprit_ranks": d["culprit"]["ranks"],
        "culprit_gpus": d["culprit"]["gpus"], "affected_nodes": d["affected"]["nodes"],
        "ambiguous": d["ambiguous"], "confidence": d["confidence"], "confidence_reason": d["confidence_reason"],
        "action": d["recommended_action"]["action"], "action_targets": d["recommended_action"]["targets"],
        "candidates": json.dumps(d["candidates"]), "evidence": json.dumps(d["evidence"]),
        "coverage": json.dumps(d["coverage"]), "diagnosed_at": d["diagnosed_at"],
        "diagnosis": json.dumps(d, sort_keys=True),
    } for d in result.diagnoses]
    schema = {k: v for k, v in TABLES["diagnoses"].items()
              if k not in ("queue", "end_time", "num_nodes", "num_gpus", "gpu_hours", "diagnosed_at", "inputs")}
    frame = pl.DataFrame(rows, schema={**schema, "diagnosed_at": pl.String})
    frame = frame.with_columns(diagnosed_at=pl.col("diagnosed_at").str.to_datetime(
        "%Y-%m-%dT%H:%M:%SZ", time_unit="us", strict=False).dt.replace_time_zone("UTC"))
    # inputs: the batch of the jobs row diagnosed (its logs and coverage came with it), when known
    inputs = pl.col("_batch") if "_batch" in jobs.columns else pl.lit(None, pl.String)
    info = jobs.select(*JOB_KEY, "queue", "end_time", "num_nodes", "num_gpus",
                       gpu_hours=(pl.col("num_gpus").cast(pl.Float64)
                                  * (pl.col("end_time") - pl.col("start_time")).dt.total_seconds() / 3600),
                       inputs=inputs)
    return frame.join(info, on=JOB_KEY, how="left").select(list(TABLES["diagnoses"]))


def symptoms_frame(result: Result, ruleset_version: str) -> pl.DataFrame:
    return result.symptoms.with_columns(ruleset=pl.lit(ruleset_version)).select(list(TABLES["symptoms"]))


def diagnose_tables(jobs: pl.DataFrame, logs: pl.DataFrame, coverage: pl.DataFrame, ruleset: Ruleset,
                    max_drain: int = 2, diagnosed_at: datetime | None = None,
                    metrics: pl.DataFrame | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(diagnoses, symptoms) for every failed job in `jobs`; `metrics` (the metrics table's rows of their
    nodes) feeds the metric rules."""
    ev = evidence_from_tables(jobs, logs, coverage, ruleset, metrics)
    at = diagnosed_at.strftime("%Y-%m-%dT%H:%M:%SZ") if diagnosed_at else None
    result = run_engine(ev, ruleset, DecideConfig(), ReportConfig(max_drain=max_drain), at)
    return diagnoses_frame(result, jobs, ruleset.version), symptoms_frame(result, ruleset.version)


def verdict_changes(old: pl.DataFrame, new: pl.DataFrame) -> pl.DataFrame:
    """Jobs whose verdict differs between two rulesets: outcome, culprit nodes or ambiguity."""
    cols = ["outcome", "culprit_nodes", "ambiguous", "confidence", "root_cause", "evidence"]
    both = old.select(*JOB_KEY, *cols).join(new.select(*JOB_KEY, *cols), on=JOB_KEY, how="full",
                                            suffix="_new", coalesce=True)
    changed = ((pl.col("outcome") != pl.col("outcome_new")).fill_null(True)
               | (pl.col("culprit_nodes").list.join(",") != pl.col("culprit_nodes_new").list.join(",")).fill_null(True)
               | (pl.col("ambiguous") != pl.col("ambiguous_new")).fill_null(True))
    return both.filter(changed).sort(JOB_KEY)
