"""The nightly report, end to end: read the window, write the trend tables back, write one HTML file,
return the markdown artifact and the action table (the flow publishes both to Prefect)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from pathlib import Path

import polars as pl

from faultline.fleet.config import FleetConfig
from faultline.report import actions as act_mod, artifact, compare, data, html, trends
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
    src = data.load(wh, start, end, ruleset)
    diagnoses = src.diagnoses
    node_day = trends.node_day(diagnoses, src.symptoms)
    outcome_day = trends.outcome_day(diagnoses)
    days = (end - start).days + 1
    lemons = trends.lemons(diagnoses, days, lemon_k)
    actions = act_mod.actions(diagnoses, src.node_events)
    rate = act_mod.failure_rate(src.jobs, diagnoses)
    # the last 24 h = the report's last day (it runs the night after), against the 7 days before
    now = datetime.combine(end + timedelta(days=1), time(), tzinfo=timezone.utc)
    vs = compare.of(src.history_jobs, src.history_diagnoses, now)
    batch = f"report-{start.isoformat()}-{end.isoformat()}"
    if node_day.height:
        wh.write("trends_node_day", node_day, batch)
    if outcome_day.height:
        wh.write("trends_outcome_day", outcome_day, batch)
    generated = datetime.now(timezone.utc)
    page = html.render_report(diagnoses, outcome_day=outcome_day, lemons=lemons,
                              generated_at=generated, lemon_window_days=days, lemon_k=lemon_k,
                              actions=actions, rate=rate, comparison=vs)
    path = html.write_report(cfg.reports_dir / f"faultline-report-{end.isoformat()}.html", page)
    markdown = artifact.render_markdown(diagnoses, lemons=lemons, report_path=path, generated_at=generated,
                                        lemon_window_days=days, lemon_k=lemon_k, actions=actions, rate=rate,
                                        comparison=vs)
    return ReportOut(start, end, path, markdown, diagnoses.height, actions)
