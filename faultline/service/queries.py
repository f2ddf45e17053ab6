"""Stored diagnoses, read from the warehouse (read-only).

The SQL is built from constant text only; every value a client sends is a bound parameter.
A job attempt may have diagnoses of several rulesets (a backtest stores its candidate's beside the
baseline's): the one of the service's own ruleset is preferred, else the newest written; a client
can pin one with `ruleset`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

from faultline.warehouse.store import Warehouse

SUMMARY_COLUMNS = ("cluster", "job_id", "attempt", "ruleset", "outcome", "domain", "root_cause", "culprit_nodes",
                   "culprit_ranks", "culprit_gpus", "affected_nodes", "ambiguous", "confidence", "confidence_reason",
                   "action", "action_targets", "queue", "end_time", "num_nodes", "num_gpus", "gpu_hours",
                   "diagnosed_at")
# newest job end first; for one job, its latest attempt
ORDER_RECENT = "end_time DESC NULLS LAST, diagnosed_at DESC NULLS LAST, cluster, job_id, attempt DESC"
ORDER_LATEST_ATTEMPT = "attempt DESC"
_RELATIVE = re.compile(r"^(\d{1,6})([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
SINCE_RANGE = (date(1970, 1, 1), date(9000, 1, 1))  # a `since` outside this is refused (400), never a crash


@dataclass(frozen=True)
class Filters:
    cluster: str | None = None
    job_id: str | None = None
    attempt: int | None = None
    outcome: str | None = None
    since: datetime | None = None
    ruleset: str | None = None


def parse_since(text: str, now: datetime) -> datetime:
    """`24h`, `30m`, `7d`, `90s` before `now`, or an ISO date/time (UTC when it names no zone).
    ValueError (or OverflowError) on anything else, and on a time outside SINCE_RANGE."""
    m = _RELATIVE.match(text.strip())
    if m:
        t = now - timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})  # OverflowError before year 1
    else:
        t = datetime.fromisoformat(text.strip())
        t = t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)
    if not SINCE_RANGE[0] <= t.date() < SINCE_RANGE[1]:
        raise ValueError(f"since {t.date()} is outside {SINCE_RANGE[0]} .. {SINCE_RANGE[1]}")
    return t


def build_query(f: Filters, prefer_ruleset: str, limit: int, columns: tuple[str, ...], order: str) -> tuple[str, list]:
    """SQL over `diagnoses_all` and its parameters: one row per job attempt (the preferred ruleset's,
    else the newest written), filtered, ordered, limited."""
    assert order in (ORDER_RECENT, ORDER_LATEST_ATTEMPT)
    assert all(re.fullmatch(r"[a-z_]+", c) for c in columns)
    inner, params = [], []
    if f.cluster is not None:
        inner.append("cluster = ?")
        params.append(f.cluster)
    if f.job_id is not None:
        inner.append("job_id = ?")
        params.append(f.job_id)
    if f.attempt is not None:
        inner.append("attempt = ?")
        params.append(f.attempt)
    if f.since is not None:
        inner.append("date >= ?")  # the partition day (the job's end day, UTC): prunes files
        params.append(f.since.astimezone(timezone.utc).date())
        inner.append("end_time >= ?")
        params.append(f.since)
    if f.ruleset is not None:
        inner.append("ruleset = ?")
        params.append(f.ruleset)
    params.append(prefer_ruleset)
    outer = ""
    if f.outcome is not None:  # after choosing each job's diagnosis, never before
        outer = " WHERE outcome = ?"
        params.append(f.outcome)
    params.append(limit)
    sql = (f"SELECT {', '.join(columns)} FROM (SELECT * FROM diagnoses_all WHERE {' AND '.join(inner) or 'true'} "
           "QUALIFY row_number() OVER (PARTITION BY cluster, job_id, attempt "
           "ORDER BY (ruleset = ?) DESC, _written_at DESC, _batch DESC) = 1)"
           f"{outer} ORDER BY {order} LIMIT ?")
    return sql, params


def _plain(v):
    if isinstance(v, datetime):
        return v.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(v, date):
        return v.isoformat()
    return v


def summary_row(row: dict) -> dict:
    return {k: _plain(row[k]) for k in SUMMARY_COLUMNS}


def _open(warehouse_dir: Path) -> Warehouse | None:
    """The warehouse, or None before anything was ever stored (no warehouse folder yet)."""
    if not Path(warehouse_dir).is_dir():
        return None
    return Warehouse(warehouse_dir, create=False)


def latest_diagnosis(warehouse_dir: Path, cluster: str, job_id: str, prefer_ruleset: str,
                     attempt: int | None = None, ruleset: str | None = None) -> dict | None:
    """The stored diagnosis of the job's latest (or the given) attempt, as POST /v1/diagnose returns it."""
    wh = _open(warehouse_dir)
    if wh is None:
        return None
    sql, params = build_query(Filters(cluster=cluster, job_id=job_id, attempt=attempt, ruleset=ruleset),
                              prefer_ruleset, 1, ("diagnosis",), ORDER_LATEST_ATTEMPT)
    df = wh.sql(sql, params)
    if df.height == 0 or df["diagnosis"][0] is None:
        return None
    return json.loads(df["diagnosis"][0])


def recent_diagnoses(warehouse_dir: Path, filters: Filters, prefer_ruleset: str, limit: int) -> list[dict]:
    wh = _open(warehouse_dir)
    if wh is None:
        return []
    sql, params = build_query(filters, prefer_ruleset, limit, SUMMARY_COLUMNS, ORDER_RECENT)
    return [summary_row(r) for r in wh.sql(sql, params).to_dicts()]
