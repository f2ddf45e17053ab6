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


def load(wh: Warehouse, start: date, end: date, ruleset: str | None = None) -> ReportData:
    """The report window's frames; with `ruleset`, only that ruleset's verdicts and symptoms."""
    where, params = ("ruleset = ?", [ruleset]) if ruleset else (None, None)
    return ReportData(
        diagnoses=trends.current(wh.read_window("diagnoses", start, end, where=where, params=params)),
        symptoms=wh.read_window("symptoms", start, end, where=where, params=params),
        node_events=wh.read_window("node_events", start, None),
        jobs=wh.read_window("jobs", start, end),
    )
