"""The warehouse reads behind the nightly report: the only queries of `faultline.report`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta

import polars as pl

from faultline.report import trends
from faultline.warehouse.store import Warehouse


@dataclass
class ReportData:
    diagnoses: pl.DataFrame    # one verdict per job attempt ending in [start, end]
    symptoms: pl.DataFrame
    node_events: pl.DataFrame  # from `start` on: was a blamed node drained since?
    jobs: pl.DataFrame         # every job attempt ending in [start, end]: the denominator
    history_jobs: pl.DataFrame       # the 8 days up to `end` (last 24 h + 7-day baseline), whatever the window
    history_diagnoses: pl.DataFrame


def load(wh: Warehouse, start: date, end: date, ruleset: str | None = None) -> ReportData:
    """The report window's frames; with `ruleset`, only that ruleset's verdicts and symptoms."""
    where, params = ("ruleset = ?", [ruleset]) if ruleset else (None, None)
    diagnoses = trends.current(wh.read_window("diagnoses", start, end, where=where, params=params))
    jobs = wh.read_window("jobs", start, end)
    h0 = end - timedelta(days=8)  # compare.RECENT + compare.BASELINE, in whole days
    if h0 >= start:
        keep = pl.col("end_time").dt.date() >= h0
        hist_jobs, hist_diag = jobs.filter(keep), diagnoses.filter(keep)
    else:
        hist_jobs = wh.read_window("jobs", h0, end)
        hist_diag = trends.current(wh.read_window("diagnoses", h0, end, where=where, params=params))
    return ReportData(
        diagnoses=diagnoses,
        symptoms=wh.read_window("symptoms", start, end, where=where, params=params),
        node_events=wh.read_window("node_events", start, None),
        jobs=jobs, history_jobs=hist_jobs, history_diagnoses=hist_diag,
    )
