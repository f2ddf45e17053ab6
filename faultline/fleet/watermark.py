"""Watermarked collect and diagnose: nothing is lost to a missed, failed or killed run, nothing is done twice.

collect   keeps a cursor per cluster and source (the scheduler) in the warehouse's commit log: the
          time before which every ended job has been committed. Each run reads the scheduler from
          `cursor - scheduler_lag_minutes` (jobs reach sacct or the API minutes after they end) to
          now, keeps only the job attempts the warehouse lacks or holds with another scheduler row,
          fetches their logs and commits jobs, allocations, logs and coverage as one transaction
          whose commit row carries the new cursor. A run that misses its slot or dies is caught up by
          the next one; a re-run finds nothing new and writes nothing.
          A job whose logs failed (Loki down) is held back, not committed, and retried by the next
          runs until `logs_retry_minutes` after its end; the cursor does not pass it meanwhile.
diagnose  diagnoses every failed job of a committed collect batch that no committed diagnose batch of
          the current ruleset covers yet (within `diagnose_horizon_days` of its commit), unless a
          committed diagnosis of this ruleset already has the same inputs (the jobs row's batch): a
          re-collected, changed job is diagnosed again, a diagnose killed half-way redoes only what it
          had not committed. Diagnoses and their symptoms commit together.

Everything runs over frames per cluster and day (Polars joins, DuckDB scans); no loop over jobs or lines.
"""

from __future__ import annotations

import re
import uuid
from datetime import date, datetime, timedelta, timezone

import polars as pl

from faultline.fleet import crashpoints
from faultline.fleet.collect import LOG_SOURCES, collect_cluster, with_job_date
from faultline.fleet.config import FleetConfig
from faultline.fleet.diagnose import diagnose_tables
from faultline.rules.model import Ruleset
from faultline.taxonomy import FAILED_STATES
from faultline.warehouse.schema import JOB_KEY, TABLES
from faultline.warehouse.store import Warehouse

SOURCE = "scheduler"
PLACEMENT_DAYS = 30  # how far back recorded placements are read for a Kubernetes job ending in the window
INPUT_KINDS = ("collect", "job")  # commits whose jobs rows diagnose takes as input


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def _utc(t: datetime | str | None) -> datetime | None:
    if t is None:
        return None
    t = datetime.fromisoformat(t) if isinstance(t, str) else t
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def stamp(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%S")


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def unique_batch(*parts: str) -> str:
    """A batch name never used before: a batch is written once, so no write replaces another's rows. Parts
    are made file-name safe (a Kubernetes job id `ns/name`, a heterogeneous or array Slurm job `4711+0`,
    `4711_[1-3]`)."""
    return "-".join([*(_UNSAFE.sub("_", p) for p in parts), uuid.uuid4().hex[:8]])


def day_pieces(start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
    """[start, end) cut at UTC midnights: one piece per day partition."""
    out, t = [], start
    while t < end:
        midnight = datetime.combine(t.date() + timedelta(days=1), datetime.min.time(), tzinfo=timezone.utc)
        out.append((t, min(end, midnight)))
        t = min(end, midnight)
    return out


def new_placements(rows: pl.DataFrame | None, recorded: pl.DataFrame | None) -> pl.DataFrame:
    """The pod placements of `rows` not recorded yet (a re-run writes nothing twice)."""
    if rows is None or rows.height == 0:
        return pl.DataFrame(schema=TABLES["placements"])
    rows = rows.unique(["cluster", "uid"], keep="first", maintain_order=True).select(list(TABLES["placements"]))
    if recorded is None or recorded.height == 0:
        return rows
    return rows.join(recorded.select("cluster", "uid"), on=["cluster", "uid"], how="anti")


def cursor(wh: Warehouse, cluster: str) -> datetime | None:
    """The collect cursor of `cluster`: every job that ended before it (less the scheduler's lag) is committed."""
    got = wh.read("commits", "cluster = ? AND kind = 'collect' AND cursor IS NOT NULL", [cluster])
    return got["cursor"].max() if got.height else None


def cursors(wh: Warehouse) -> pl.DataFrame:
    """cluster, source, cursor, last commit: the watermarks, for operators (`faultline cursors`)."""
    got = wh.read("commits", "kind = 'collect'")
    return (got.group_by("cluster").agg(source=pl.lit(SOURCE), cursor=pl.col("cursor").max(),
                                        last_commit=pl.col("committed_at").max(), batches=pl.len(),
                                        jobs=pl.col("jobs").sum())
            .sort("cluster"))


# ------------------------------------------------------------------ collect

def collect(cfg: FleetConfig, cluster_name: str, now: datetime | None = None,
            start: datetime | None = None, end: datetime | None = None) -> dict:
    """One cluster from its cursor to `now` (or the explicit window [start, end), e.g. a backfill: it moves
    the cursor only when it starts at or before it). Returns counts for the flow's result."""
    ccfg = next((c for c in cfg.clusters if c.name == cluster_name), None)
    if ccfg is None:
        raise ValueError(f"cluster {cluster_name!r} is not configured")
    wh = Warehouse(cfg.warehouse_dir)
    now = _utc(now) or utcnow()
    cur = cursor(wh, cluster_name)
    if start is None:
        base = cur or now - timedelta(minutes=cfg.initial_lookback_minutes)
        read_from, read_to = base - timedelta(minutes=cfg.scheduler_lag_minutes), now
    else:
        read_from, read_to = _utc(start), _utc(end) or now
    advances = cur is None or read_from <= cur
    retry_after = now - timedelta(minutes=cfg.logs_retry_minutes)
    hold: datetime | None = None
    out = {"cluster": cluster_name, "start": read_from.isoformat(), "end": read_to.isoformat(), "jobs": 0,
           "failed": 0, "held": 0, "allocations": 0, "logs": 0, "coverage": 0, "metrics": 0, "batches": [],
           "errors": []}
    pieces = day_pieces(read_from, read_to)
    for n, (a, b) in enumerate(pieces):
        known = wh.read_window("jobs", a, b - timedelta(microseconds=1), [cluster_name])
        # placements are filed by the day they were seen (a backfill records them today, after its window)
        recorded = (wh.read_window("placements", a - timedelta(days=PLACEMENT_DAYS), max(b, utcnow()) + timedelta(days=1),
                                   [cluster_name]) if ccfg.kind == "kubernetes" else None)
        got = collect_cluster(ccfg, a, b, cfg.margin_minutes, known, recorded)
        out["errors"] += got.errors
        # jobs whose logs failed, recent enough to wait for the source: not committed, retried next run
        bad = (got.coverage.filter(pl.col("source").is_in(list(LOG_SOURCES)) & (pl.col("status") == "error"))
               .select(JOB_KEY).unique())
        held = got.jobs.join(bad, on=JOB_KEY, how="semi").filter(pl.col("end_time") >= retry_after)
        if held.height:
            first = held["end_time"].min()
            hold = first if hold is None else min(hold, first)
            keep = lambda f: f.join(held.select(JOB_KEY), on=JOB_KEY, how="anti")  # noqa: E731
            got.jobs, got.allocations, got.logs, got.coverage = (keep(got.jobs), keep(got.allocations),
                                                                 keep(got.logs), keep(got.coverage))
            out["held"] += held.height
        new_cursor = cur
        if advances:
            reach = b if hold is None else min(b, hold)
            new_cursor = reach if cur is None else max(cur, reach)
        events = got.node_events if got.node_events is not None else pl.DataFrame(schema=TABLES["node_events"])
        events = events.filter(pl.col("ts").is_not_null())
        if events.height:  # the ones not committed yet
            seen = wh.read_window("node_events", a, b - timedelta(microseconds=1), [cluster_name],
                                  columns=["cluster", "node", "ts", "kind"])
            events = events.join(seen, on=["cluster", "node", "ts", "kind"], how="anti")
        placed = new_placements(got.placements, recorded)
        if got.jobs.height == 0 and events.height == 0 and (new_cursor == cur or n < len(pieces) - 1):
            continue  # nothing new: only the last piece records how far the cursor got
        failed = int(got.jobs.filter(pl.col("state").is_in(list(FAILED_STATES))).height)
        dates = sorted(set(got.jobs["end_time"].dt.date().to_list()))
        batch = unique_batch("collect", cluster_name, stamp(a), stamp(b))
        with wh.transaction(batch, [cluster_name], "collect", source=SOURCE, read_from=a, read_to=b,
                            cursor=new_cursor, jobs=got.jobs.height, failed=failed, dates=dates) as tx:
            tx.write("jobs", got.jobs.with_columns(date=pl.col("end_time").dt.date()))
            crashpoints.point("collect.jobs")
            out["allocations"] += tx.write("allocations", with_job_date(got.allocations, got.jobs))
            out["logs"] += tx.write("logs", with_job_date(got.logs, got.jobs))
            crashpoints.point("collect.logs")
            out["coverage"] += tx.write("coverage", with_job_date(got.coverage, got.jobs))
            crashpoints.point("collect.coverage")
            if events.height:
                tx.write("node_events", events.with_columns(date=pl.col("ts").dt.date()))
            if placed.height:  # pods seen live: their nodes stay known after the pods are deleted
                tx.write("placements", placed.with_columns(date=pl.col("seen_at").dt.date()))
            if got.metrics is not None and got.metrics.height:  # partitioned by the sample's own day
                out["metrics"] += tx.write(
                    "metrics", got.metrics.with_columns(date=pl.col("ts").dt.date()))
        crashpoints.point("collect.committed")
        cur = new_cursor
        out["jobs"] += got.jobs.height
        out["failed"] += failed
        out["batches"].append(batch)
    out["cursor"] = cur.isoformat() if cur else None
    return out


# ------------------------------------------------------------------ diagnose
def job_metrics(wh: Warehouse, cluster: str, jobs: pl.DataFrame, day: date) -> pl.DataFrame:
    """The metrics rows of these jobs' nodes: a job that ended `day` may have started days before, so its
    samples lie in those days' partitions too."""
    first = jobs["start_time"].min() if "start_time" in jobs.columns else None
    nodes = jobs["nodes"].explode().drop_nulls().unique().to_list() if "nodes" in jobs.columns else []
    if not nodes:
        return pl.DataFrame(schema=TABLES["metrics"])
    since = (first.date() if first else day) - timedelta(days=1)
    return wh.read_window("metrics", since, day, [cluster]).filter(pl.col("node").is_in(nodes))



def _current_rows(wh: Warehouse, cluster: str, jobs: pl.DataFrame) -> pl.DataFrame:
    """`jobs` (with _batch) kept only where their row is the newest committed one of the job."""
    if jobs.height == 0:
        return jobs
    d0, d1 = jobs["date"].min(), jobs["date"].max()
    newest = wh.read_window("jobs", d0, d1, [cluster], columns=[*JOB_KEY, "_batch"])
    return jobs.join(newest, on=[*JOB_KEY, "_batch"], how="semi")


def _not_diagnosed(wh: Warehouse, cluster: str, jobs: pl.DataFrame, ruleset: str) -> pl.DataFrame:
    """`jobs` without a committed diagnosis of `ruleset` made from the same inputs (jobs row batch)."""
    if jobs.height == 0:
        return jobs
    d0, d1 = jobs["date"].min(), jobs["date"].max()
    done = wh.read_window("diagnoses", d0, d1, [cluster], where="ruleset = ?", params=[ruleset],
                          columns=[*JOB_KEY, "inputs"])
    same = done.filter(pl.col("inputs").is_not_null()).rename({"inputs": "_batch"})
    legacy = done.filter(pl.col("inputs").is_null()).select(JOB_KEY)  # schema 1: no inputs recorded
    return (jobs.join(same, on=[*JOB_KEY, "_batch"], how="anti")
            .join(legacy, on=JOB_KEY, how="anti"))


def pending(wh: Warehouse, cluster: str, ruleset: str, now: datetime, horizon_days: float
            ) -> tuple[pl.DataFrame, list[str]]:
    """(failed jobs to diagnose, with their jobs row's `_batch`; the input batches this run covers)."""
    commits = wh.read("commits", "cluster = ? AND committed_at >= ?",
                      [cluster, now - timedelta(days=horizon_days)])
    covered = set(commits.filter(pl.col("ruleset") == ruleset).explode("covers")["covers"].drop_nulls().to_list())
    todo = commits.filter(pl.col("kind").is_in(list(INPUT_KINDS)) & (pl.col("failed").fill_null(0) > 0)
                          & ~pl.col("batch").is_in(list(covered)))
    batches = todo["batch"].to_list()
    if not batches:
        return pl.DataFrame(), []
    dates = todo.explode("dates")["dates"].drop_nulls()
    jobs = wh.read_window("jobs", dates.min(), dates.max(), [cluster], batches=batches)
    jobs = jobs.filter(pl.col("state").is_in(list(FAILED_STATES)))
    jobs = _not_diagnosed(wh, cluster, _current_rows(wh, cluster, jobs), ruleset)
    return jobs, batches


def _diagnose_day(cfg: FleetConfig, wh: Warehouse, cluster: str, day: date, mine: pl.DataFrame,
                  ruleset: Ruleset) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(diagnoses, symptoms) of one end day's jobs, `cfg.diagnose_batch_jobs` jobs at a time: only one
    batch's log lines are in memory (the verdicts, small, are gathered). A job's verdict depends on its
    own evidence only, so batching changes no verdict."""
    step = max(1, cfg.diagnose_batch_jobs)
    mine = mine.sort(JOB_KEY)
    out_d, out_s = [], []
    for lo in range(0, mine.height, step):
        part = mine.slice(lo, step)
        keys = part.select(*JOB_KEY, "_batch")
        ids = part["job_id"].unique().to_list()

        def read(t: str) -> pl.DataFrame:  # the scan filters by job id, then the exact key and batch
            return wh.read_window(t, day, day, [cluster], batches=set(keys["_batch"].to_list()),
                                  where="list_contains(?::VARCHAR[], job_id)", params=[ids]
                                  ).join(keys, on=[*JOB_KEY, "_batch"], how="semi")

        d, s = diagnose_tables(part, read("logs"), read("coverage"), ruleset, cfg.max_drain,
                               metrics=job_metrics(wh, cluster, part, day))
        out_d.append(d)
        out_s.append(s)
    return pl.concat(out_d), pl.concat(out_s)


def diagnose_day(cfg: FleetConfig, wh: Warehouse, cluster: str, day: date | None, jobs: pl.DataFrame,
                 ruleset: Ruleset, covers: list[str], now: datetime, kind: str = "diagnose") -> int:
    """One transaction: the verdicts of `jobs` that ended `day` (None: none, only `covers`), committed
    with `covers`, the input batches then fully handled. Returns the number of diagnoses."""
    batch = unique_batch(kind, ruleset.version, cluster, day.isoformat() if day else stamp(now))
    with wh.transaction(batch, [cluster], kind, ruleset=ruleset.version, covers=covers,
                        jobs=0, failed=0) as tx:
        if day is None:  # nothing to diagnose: record that the inputs are covered
            return 0
        mine = jobs.filter(pl.col("date") == day)
        diagnoses, symptoms = _diagnose_day(cfg, wh, cluster, day, mine, ruleset)
        dated = mine.select(*JOB_KEY, "date")
        tx.info.update(jobs=diagnoses.height, failed=diagnoses.height)
        tx.write("diagnoses", diagnoses.join(dated, on=JOB_KEY))
        crashpoints.point("diagnose.diagnoses")
        tx.write("symptoms", symptoms.join(dated, on=JOB_KEY))
        crashpoints.point("diagnose.symptoms")
    crashpoints.point("diagnose.committed")
    return diagnoses.height


def diagnose_jobs(cfg: FleetConfig, wh: Warehouse, cluster: str, jobs: pl.DataFrame, ruleset: Ruleset,
                  covers: list[str], now: datetime, kind: str = "diagnose") -> int:
    """Diagnose `jobs` (committed rows with `_batch`), one transaction per end day; the last commit
    lists `covers`, the input batches now fully handled. Returns the number of diagnoses."""
    days = sorted(jobs["date"].unique().to_list()) if jobs.height else []
    n = 0
    for i, day in enumerate(days or [None]):
        last = i == len(days or [None]) - 1
        n += diagnose_day(cfg, wh, cluster, day, jobs, ruleset, covers if last else [], now, kind)
    return n


def pending_day(wh: Warehouse, cluster: str, day: date, batches: list[str], ruleset: str) -> pl.DataFrame:
    """The failed jobs of `batches` that ended `day` still without a verdict of `ruleset` (a partition
    task's share of `pending`, read again where the task runs)."""
    jobs = wh.read_window("jobs", day, day, [cluster], batches=batches)
    jobs = jobs.filter(pl.col("state").is_in(list(FAILED_STATES)))
    return _not_diagnosed(wh, cluster, _current_rows(wh, cluster, jobs), ruleset)


def diagnose(cfg: FleetConfig, cluster: str, ruleset: Ruleset, now: datetime | None = None) -> dict:
    """Every collected failed job of `cluster` not yet diagnosed with `ruleset` (see the module's doc)."""
    wh = Warehouse(cfg.warehouse_dir)
    now = _utc(now) or utcnow()
    jobs, covers = pending(wh, cluster, ruleset.version, now, cfg.diagnose_horizon_days)
    if not covers:
        return {"cluster": cluster, "diagnosed": 0, "ruleset": ruleset.version, "outcomes": {}}
    n = diagnose_jobs(cfg, wh, cluster, jobs, ruleset, covers, now)
    return {"cluster": cluster, "diagnosed": n, "ruleset": ruleset.version, "batches": len(covers)}


def diagnose_window(cfg: FleetConfig, cluster: str, start: datetime, end: datetime, ruleset: Ruleset) -> dict:
    """The committed failed jobs of `cluster` that ended in [start, end) (a backtest), each once per ruleset
    and inputs. Covers nothing: the scheduled diagnose still sees its own pending batches."""
    wh = Warehouse(cfg.warehouse_dir)
    start, end = _utc(start), _utc(end)
    jobs = wh.read_window("jobs", start, end - timedelta(microseconds=1), [cluster],
                          where="end_time >= ? AND end_time < ?", params=[start, end])
    jobs = _not_diagnosed(wh, cluster, jobs.filter(pl.col("state").is_in(list(FAILED_STATES))), ruleset.version)
    n = diagnose_jobs(cfg, wh, cluster, jobs, ruleset, [], utcnow(), kind="diagnose") if jobs.height else 0
    return {"cluster": cluster, "day": start.date().isoformat(), "diagnosed": n, "ruleset": ruleset.version}


def backfill(cfg: FleetConfig, since: datetime, ruleset: Ruleset, until: datetime | None = None,
             clusters: list[str] | None = None) -> list[dict]:
    """History: collect [since, until) day by day for each cluster (committed per day, the cursor moved
    when contiguous), then diagnose what is pending. Re-running it is a no-op."""
    until = _utc(until) or utcnow()
    out = []
    for c in cfg.clusters:
        if clusters and c.name not in clusters:
            continue
        got = collect(cfg, c.name, now=until, start=_utc(since), end=until)
        got["diagnosed"] = diagnose(cfg, c.name, ruleset, now=until)["diagnosed"]
        out.append(got)
    return out


def as_date(d) -> date:
    return d if isinstance(d, date) else date.fromisoformat(str(d)[:10])
