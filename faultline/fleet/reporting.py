"""The nightly report: trend tables written back to the warehouse, one HTML file, a markdown summary."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path

import polars as pl

from faultline import report_html, trends
from faultline.fleet.config import FleetConfig
from faultline.warehouse.store import Warehouse


@dataclass
class ReportOut:
    start: date
    end: date
    html_path: Path
    markdown: str
    jobs: int
    actions: pl.DataFrame | None = None


def build_report(cfg: FleetConfig, start: date, end: date, ruleset: str | None = None, lemon_k: int = 3) -> ReportOut:
    wh = Warehouse(cfg.warehouse_dir)
    where, params = ("ruleset = ?", [ruleset]) if ruleset else (None, None)
    diagnoses = trends.current(wh.read_window("diagnoses", start, end, where=where, params=params))
    symptoms = wh.read_window("symptoms", start, end, where=where, params=params)
    node_day = trends.node_day(diagnoses, symptoms)
    outcome_day = trends.outcome_day(diagnoses)
    days = (end - start).days + 1
    lemons = trends.lemons(diagnoses, days, lemon_k)
    events = wh.read_window("node_events", start, None)
    actions = trends.actions(diagnoses, events)
    jobs = wh.read_window("jobs", start, end)
    rate = trends.failure_rate(jobs, diagnoses)
    batch = f"report-{start.isoformat()}-{end.isoformat()}"
    if node_day.height:
        wh.write("trends_node_day", node_day, batch)
    if outcome_day.height:
        wh.write("trends_outcome_day", outcome_day, batch)
    generated = datetime.now(timezone.utc)
    html = report_html.render_report(diagnoses, outcome_day=outcome_day, lemons=lemons,
                                     generated_at=generated, lemon_window_days=days, lemon_k=lemon_k,
                                     actions=actions, rate=rate)
    path = report_html.write_report(cfg.reports_dir / f"faultline-report-{end.isoformat()}.html", html)
    markdown = report_html.render_markdown(diagnoses, lemons=lemons, report_path=path, generated_at=generated,
                                           lemon_window_days=days, lemon_k=lemon_k, actions=actions, rate=rate)
    return ReportOut(start, end, path, markdown, diagnoses.height, actions)
