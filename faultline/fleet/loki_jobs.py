"""Each failed job's lines straight from a live Loki: one query per job (per template), a few jobs in flight.

A job whose query fails (after retries) gets a note, not an exception: the other jobs' lines still land
and coverage says which job's logs are missing and why.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone

import polars as pl

from faultline.collectors import loki
from faultline.collectors.loki_http import LokiClient, LokiError
from faultline.warehouse.schema import JOB_KEY

# One row per job that has something to say: error (its logs failed; coverage `error`) or note (e.g. cut short).
NOTES_SCHEMA = {"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "error": pl.String,
                "note": pl.String}


@dataclass(frozen=True)
class JobQuery:
    job: dict                  # the job's key and query fields
    queries: tuple[str, ...]   # rendered LogQL
    start_ns: int
    end_ns: int


def plan(failed: pl.DataFrame, s: loki.LokiSettings, margin_minutes: float,
         now: datetime | None = None) -> list[JobQuery]:
    """What to ask Loki for each job: [start - margin, end + tail). A job that never started is read from its
    submit time; one still running up to now."""
    now = now or datetime.now(timezone.utc)
    cols = [c for c in ("name", "user", "queue", "nodes") if c in failed.columns]
    windows = failed.select(
        *JOB_KEY, *cols,
        start_ns=(pl.coalesce("start_time", "submit_time", "end_time").dt.epoch("ns")
                  - int(margin_minutes * 60e9)),
        end_ns=pl.coalesce(pl.col("end_time").dt.epoch("ns"), pl.lit(int(now.timestamp() * 1e9)))
        + int(s.tail_minutes * 60e9))
    out = []
    for job in windows.iter_rows(named=True):  # per job: a handful of strings each
        fields = loki.query_fields(job)
        queries = tuple(loki.render_query(t, fields) for t in s.queries
                        if "{nodes_regex}" not in t or fields["nodes_regex"])  # no nodes: nothing to select by
        if job["start_ns"] is not None and queries:
            out.append(JobQuery({**job, "attempt": int(job["attempt"])}, queries, job["start_ns"], job["end_ns"]))
    return out


def _fetch_job(client: LokiClient, q: JobQuery, s: loki.LokiSettings) -> tuple[pl.DataFrame, str | None, str | None]:
    """(raw lines, error, note) of one job; lines fetched before an error are kept (the error says so)."""
    parts, labels, notes, error = [], {}, [], None
    budget = s.max_lines_per_job
    for query in q.queries:
        got = client.fetch(query, q.start_ns, q.end_ns, budget)
        parts.append(got.lines)
        labels.update(got.labels)
        notes += got.notes
        budget -= got.lines.height
        if got.error:
            got_lines = sum(p.height for p in parts)
            error = f"loki: {got.error}"[:400] + (f" ({got_lines} lines fetched before it)" if got_lines else "")
            break
        if got.truncated or budget <= 0:
            break
    lines = pl.concat(parts) if parts else pl.DataFrame(schema=loki.PAGE_SCHEMA)
    if len(parts) > 1:  # two templates may select the same stream: its lines would come twice
        lines = lines.unique(maintain_order=True)
    lines = lines.sort(["stream", "ns"], maintain_order=True)  # each stream in time order, as a file would be
    raw = loki.lines_to_raw(lines, labels, q.job, s.node_label, s.source_label)
    return raw, error, "; ".join(dict.fromkeys(notes)) or None


def _guarded(client: LokiClient, q: JobQuery, s: loki.LokiSettings) -> tuple[pl.DataFrame, str | None, str | None]:
    try:
        return _fetch_job(client, q, s)
    except Exception as exc:  # noqa: BLE001 - whatever fails one job must not lose the other jobs
        return pl.DataFrame(schema=loki.RAW_SCHEMA), f"loki: {type(exc).__name__}: {exc}"[:400], None


def fetch(logs_config: dict, failed: pl.DataFrame, margin_minutes: float,
          env: dict | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Raw lines (RAW_SCHEMA) of the failed jobs and their notes (NOTES_SCHEMA)."""
    s = loki.LokiSettings.from_config(logs_config)
    jobs = plan(failed, s, margin_minutes)
    if not jobs:
        return pl.DataFrame(schema=loki.RAW_SCHEMA), pl.DataFrame(schema=NOTES_SCHEMA)
    try:
        client = LokiClient(s, env=env)
    except (LokiError, OSError) as exc:  # a missing secret or an unreadable CA file fails every job alike
        reason = f"loki: {exc}"
        notes = pl.DataFrame([{**{k: j.job[k] for k in JOB_KEY}, "error": reason, "note": None} for j in jobs],
                             schema=NOTES_SCHEMA)
        return pl.DataFrame(schema=loki.RAW_SCHEMA), notes
    with client, ThreadPoolExecutor(max_workers=min(s.max_parallel, len(jobs)),
                                    thread_name_prefix="loki") as pool:
        results = list(pool.map(lambda q: _guarded(client, q, s), jobs))
    raw = pl.concat([r for r, _, _ in results]) if results else pl.DataFrame(schema=loki.RAW_SCHEMA)
    notes = [{**{k: q.job[k] for k in JOB_KEY}, "error": e, "note": n}
             for q, (_, e, n) in zip(jobs, results) if e or n]
    return raw, pl.DataFrame(notes, schema=NOTES_SCHEMA)
