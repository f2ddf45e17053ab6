"""Collect one Kubernetes + Kueue cluster x window: Kueue Workloads as jobs, and for the failed ones their
pods (nodes, container states), container logs, Events of the pods and their nodes, node conditions.

Each failed job is fetched on its own (a few in flight): a job whose pods cannot be listed, or one of
whose logs fails, gets a coverage error with the reason and the other jobs still land. Pods already
deleted are attributed through the placements the recorder (and earlier collects) kept: a job's nodes
are those of its live pods and of its recorded placements.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from urllib.parse import quote

import polars as pl

from faultline.collectors import kubernetes as k8s
from faultline.collectors import kueue
from faultline.collectors.loki import RAW_SCHEMA
from faultline.fleet.config import ClusterConfig
from faultline.taxonomy import FAILED_STATES, SOURCES
from faultline.warehouse.schema import JOB_KEY, TABLES

COVERAGE_SCHEMA = TABLES["coverage"]


@dataclass
class JobPods:
    """What one failed job's pods said."""
    key: dict
    lines: list[pl.DataFrame] = field(default_factory=list)
    placements: list[dict] = field(default_factory=list)
    gpus: dict = field(default_factory=dict)          # node -> GPUs its pods asked for
    pods_error: str | None = None                      # the pods could not be listed: nothing else is known
    log_errors: list[str] = field(default_factory=list)
    event_errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    containers: int = 0


@dataclass
class K8sCollected:
    jobs: pl.DataFrame
    allocations: pl.DataFrame
    raw: pl.DataFrame
    coverage: pl.DataFrame
    placements: pl.DataFrame
    errors: list[str]


def _gpus(pod: dict) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        limits = ((c.get("resources") or {}).get("limits") or {})
        for k, v in limits.items():
            if k.endswith("/gpu"):
                try:
                    total += int(v)
                except (TypeError, ValueError):
                    pass
    return total


def placement_rows(pods: list[dict], key: dict, seen_at: datetime) -> list[dict]:
    """pod -> node of the pods that were bound to a node."""
    rows = []
    for p in pods:
        meta, spec = p.get("metadata") or {}, p.get("spec") or {}
        if spec.get("nodeName") and meta.get("uid"):
            rows.append({**key, "namespace": meta.get("namespace"), "pod": meta.get("name"), "uid": meta["uid"],
                         "node": spec["nodeName"], "gpus": _gpus(p), "seen_at": seen_at})
    return rows


def list_pods(client: k8s.KubeClient, namespace: str, selector: str) -> list[dict]:
    return client.list(f"/api/v1/namespaces/{quote(namespace)}/pods", {"labelSelector": selector})


def fetch_job(client: k8s.KubeClient, target: dict, window: tuple[datetime, datetime],
              logs: k8s.PodLogSettings | None, selectors: k8s.PodLogSettings, now: datetime) -> JobPods:
    key = {k: target[k] for k in JOB_KEY}
    out = JobPods(key)
    selector = k8s.pod_selector(selectors, target["owner_kind"], target["owner_name"])
    if selector is None:
        out.notes.append(f"no pod selector for owner kind {target['owner_kind']!r} (pod_selectors in the logs config)")
        return out
    ns = target["namespace"]
    try:
        pods = list_pods(client, ns, selector)
    except k8s.KubeError as exc:
        out.pods_error = f"kubernetes: pods of {ns} {selector}: {exc}"[:400]
        return out
    if not pods:
        out.notes.append(f"no pods match {selector} in {ns} (deleted?)")
    out.placements = placement_rows(pods, key, now)
    for r in out.placements:
        out.gpus[r["node"]] = out.gpus.get(r["node"], 0) + r["gpus"]
    rows = [r for p in pods for r in k8s.pod_status_lines(p)]
    since, until = window
    if logs is not None:
        for p in pods:
            _pod_logs(client, p, since, logs, out)
        if logs.events:
            for p in pods:
                name = (p.get("metadata") or {}).get("name")
                try:
                    ev = client.list(f"/api/v1/namespaces/{quote(ns)}/events",
                                     {"fieldSelector": f"involvedObject.name={name}"})
                    rows += k8s.event_rows(ev, (p.get("spec") or {}).get("nodeName"), f"k8s:events/pod/{ns}/{name}",
                                           since, until)
                except k8s.KubeError as exc:
                    out.event_errors.append(f"events of pod {name}: {exc}")
            for node in sorted({r["node"] for r in out.placements}):
                try:
                    ev = client.list(f"/api/v1/namespaces/{quote(logs.node_events_namespace)}/events",
                                     {"fieldSelector": f"involvedObject.kind=Node,involvedObject.name={node}"})
                    rows += k8s.event_rows(ev, node, f"k8s:events/node/{node}", since, until)
                    rows += k8s.node_condition_rows(client.get(f"/api/v1/nodes/{quote(node)}"), until)
                except k8s.KubeNotFound:
                    out.notes.append(f"node {node} no longer exists")
                except k8s.KubeError as exc:
                    out.event_errors.append(f"node {node}: {exc}")
    out.lines.append(k8s.lines_frame(rows))
    return out


def _pod_logs(client: k8s.KubeClient, pod: dict, since: datetime, s: k8s.PodLogSettings, out: JobPods) -> None:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    ns, name, node = meta.get("namespace"), meta.get("name"), spec.get("nodeName")
    if not node:
        return  # never scheduled: no container ran, no log to ask for
    restarted = {c.get("name"): bool(c.get("restartCount") or (c.get("lastState") or {}).get("terminated"))
                 for c in (status.get("containerStatuses") or [])}
    for c in spec.get("containers") or []:
        cname = c.get("name")
        if s.containers and cname not in s.containers:
            continue
        out.containers += 1
        for previous in ((False, True) if s.previous and restarted.get(cname) else (False,)):
            file = f"k8s:{ns}/{name}/{cname}" + (":previous" if previous else "")
            try:
                text = client.log(ns, name, cname, previous=previous, since=since, limit_bytes=s.limit_bytes)
            except k8s.KubeBadRequest as exc:  # no previous container (garbage-collected), or not started yet
                out.notes.append(f"{file}: {exc}"[:200])
                continue
            except k8s.KubeNotFound:
                out.notes.append(f"pod {ns}/{name} is gone: no log")
                return
            except k8s.KubeError as exc:
                out.log_errors.append(f"{file}: {exc}")
                continue
            frame = k8s.log_lines(text, node, file)
            if len(text.encode()) >= s.limit_bytes:
                # the kubelet keeps the first limitBytes; a failure is at the end: ask for the last lines too
                tail = _log_end(client, ns, name, cname, previous, since, s, node, file, out)
                seen = frame.head(frame.height - 1)  # the head's last line may be cut in the middle
                frame = pl.concat([seen, tail.join(seen, on=["ts", "line"], how="anti")])
                out.notes.append(f"{file}: longer than limit_bytes={s.limit_bytes}: its first {s.limit_bytes} bytes "
                                 f"and last {tail.height} lines were read")
            out.lines.append(frame)


def _log_end(client, ns, name, cname, previous, since, s, node, file, out) -> pl.DataFrame:
    """The last lines of a log longer than limit_bytes: tailLines, fewer while the answer is still cut
    (limitBytes keeps the start of what tailLines selects)."""
    lines = s.tail_lines
    for _ in range(4):
        try:
            text = client.log(ns, name, cname, previous=previous, since=since, limit_bytes=s.limit_bytes,
                              tail_lines=lines)
        except k8s.KubeError as exc:
            out.notes.append(f"{file}: the end of the log could not be read: {exc}"[:200])
            return pl.DataFrame(schema=k8s.LINE_SCHEMA)
        if len(text.encode()) < s.limit_bytes:
            return k8s.log_lines(text, node, file)
        lines = max(1, lines // 4)
    out.notes.append(f"{file}: even its last {lines * 4} lines exceed limit_bytes: the end was not read")
    return pl.DataFrame(schema=k8s.LINE_SCHEMA)


def _coverage(job: JobPods, logs_on: bool) -> list[dict]:
    """ok / empty / error / not_configured for each source of one job."""
    frame = pl.concat(job.lines) if job.lines else pl.DataFrame(schema=k8s.LINE_SCHEMA)
    counts = dict(frame.group_by("source").len().iter_rows()) if frame.height else {}
    note = "; ".join(job.notes)[:300]
    rows = [{**job.key, "source": "scheduler", "status": "ok", "rows": 0, "reason": "kueue"},
            {**job.key, "source": "syslog", "status": "not_configured", "rows": 0,
             "reason": "a Kubernetes cluster: node syslog comes from a log store (Loki), not the API"}]
    for source, errors, configured in (("applog", job.log_errors, logs_on), ("k8s_event", job.event_errors, True)):
        n = int(counts.get(source, 0))
        if not configured:
            rows.append({**job.key, "source": source, "status": "not_configured", "rows": 0,
                         "reason": "no source configured"})
        elif job.pods_error or errors:
            why = job.pods_error or f"kubernetes: {len(errors)} request(s) failed: " + "; ".join(errors)
            rows.append({**job.key, "source": source, "status": "error", "rows": n, "reason": why[:400]})
        else:
            rows.append({**job.key, "source": source, "status": "ok" if n else "empty", "rows": n,
                         "reason": note if n else ("no lines for this job" + (f"; {note}" if note else ""))})
    rows += [{**job.key, "source": s, "status": "not_configured", "rows": 0, "reason": "not read from Kubernetes"}
             for s in SOURCES if s not in {r["source"] for r in rows}]
    return rows


def collect(cluster: ClusterConfig, start: datetime, end: datetime, margin_minutes: float = 15,
            known: pl.DataFrame | None = None, placements: pl.DataFrame | None = None,
            http=None, env: dict | None = None, sleep=None, now: datetime | None = None,
            job_id: str | None = None) -> K8sCollected:
    """Workloads that ended in [start, end) (new or changed against `known`) and what their pods say; with
    `job_id` (`<namespace>/<workload>`), that one workload whenever it ended."""
    from faultline.fleet.collect import new_or_changed  # collect imports this module

    now = now or datetime.now(timezone.utc)
    api = k8s.KubeSettings.from_config(cluster.kubernetes)
    sched = kueue.KueueSettings.from_config(cluster.scheduler)
    logs_on = bool(cluster.logs) and cluster.logs.get("kind") == "kubernetes"
    logs = k8s.PodLogSettings.from_config(cluster.logs) if logs_on else None
    selectors = logs or k8s.PodLogSettings()
    client = k8s.KubeClient(api, http=http, env=env, sleep=sleep)
    try:
        # the scheduler failing fails the collect (retried by Prefect; the cursor stays)
        items = kueue.find_workload(client, job_id) if job_id else kueue.list_workloads(client, sched)
        jobs, targets, wl_lines = kueue.workloads_to_frames(items, cluster.name)
        ended = pl.col("end_time").is_not_null()
        jobs = jobs.filter(ended if job_id else ended & (pl.col("end_time") >= start) & (pl.col("end_time") < end))
        recorded = _recorded(placements, jobs)
        jobs = jobs.drop("nodes").join(recorded, on=JOB_KEY, how="left").with_columns(
            nodes=pl.col("nodes").fill_null(pl.lit([], pl.List(pl.String))))
        jobs = jobs.with_columns(num_nodes=pl.col("nodes").list.len().cast(pl.Int32)).select(list(TABLES["jobs"]))
        jobs = new_or_changed(jobs, known)
        failed = jobs.filter(pl.col("state").is_in(list(FAILED_STATES)))
        todo = targets.join(failed.select(*JOB_KEY, "start_time", "submit_time", "end_time"), on=JOB_KEY)
        tail = timedelta(minutes=selectors.tail_minutes)

        def one(t: dict) -> JobPods:
            began = t["start_time"] or t["submit_time"] or t["end_time"]
            window = (began - timedelta(minutes=margin_minutes), t["end_time"] + tail)
            try:
                return fetch_job(client, t, window, logs, selectors, now)
            except Exception as exc:  # noqa: BLE001 - one job's surprise must not lose the others
                got = JobPods({k: t[k] for k in JOB_KEY})
                got.pods_error = f"kubernetes: {type(exc).__name__}: {exc}"[:400]
                return got

        rows = todo.to_dicts()
        with ThreadPoolExecutor(max_workers=max(1, min(selectors.max_parallel, len(rows) or 1)),
                                thread_name_prefix="k8s") as pool:
            got = list(pool.map(one, rows))
    finally:
        client.close()
    return _assemble(cluster.name, jobs, failed, got, wl_lines, recorded, logs_on)


def _recorded(placements: pl.DataFrame | None, jobs: pl.DataFrame) -> pl.DataFrame:
    """JOB_KEY -> nodes (sorted) of the placements recorded for these jobs."""
    schema = {"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "nodes": pl.List(pl.String)}
    if placements is None or placements.height == 0:
        return pl.DataFrame(schema=schema)
    return (placements.join(jobs.select(JOB_KEY), on=JOB_KEY, how="semi")
            .group_by(JOB_KEY).agg(nodes=pl.col("node").unique().sort()).cast(schema))


def _assemble(cluster: str, jobs: pl.DataFrame, failed: pl.DataFrame, got: list[JobPods], wl_lines: pl.DataFrame,
              recorded: pl.DataFrame, logs_on: bool) -> K8sCollected:
    place = pl.DataFrame([r for g in got for r in g.placements], schema=PLACEMENT_ROW)
    live = place.group_by(JOB_KEY).agg(live=pl.col("node").unique())
    jobs = (jobs.join(live, on=JOB_KEY, how="left")
            .with_columns(nodes=pl.col("nodes").list.concat(pl.col("live").fill_null(pl.lit([], pl.List(pl.String))))
                          .list.unique().list.sort())
            .drop("live"))
    gpus = pl.DataFrame([{**g.key, "node": n, "gpus": v} for g in got for n, v in g.gpus.items()],
                        schema={"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "node": pl.String,
                                "gpus": pl.Int32})
    allocs = (jobs.select(*JOB_KEY, node=pl.col("nodes")).explode("node").drop_nulls("node")
              .join(gpus, on=[*JOB_KEY, "node"], how="left")
              .select(*JOB_KEY, "node", ranks=pl.lit(None, pl.List(pl.Int32)), gpus="gpus").cast(TABLES["allocations"]))
    jobs = jobs.join(allocs.group_by(JOB_KEY).agg(g=pl.col("gpus").sum()), on=JOB_KEY, how="left").with_columns(
        num_nodes=pl.col("nodes").list.len().cast(pl.Int32),
        num_gpus=pl.when(pl.col("g") > 0).then(pl.col("g")).cast(pl.Int32)).select(list(TABLES["jobs"]))
    parts = []
    for g in got:
        for frame in g.lines:
            if frame.height:
                parts.append(frame.with_columns(**{k: pl.lit(v) for k, v in g.key.items()}))
    sched = wl_lines.join(failed.select(JOB_KEY), on=JOB_KEY, how="semi").select(
        *JOB_KEY, node=pl.lit(None, pl.String), source=pl.lit("scheduler"),
        file=pl.format("k8s:workload/{}", "job_id"), ts="ts", line="line")
    raw = pl.concat([sched.cast(RAW_SCHEMA), *[p.select(list(RAW_SCHEMA)).cast(RAW_SCHEMA) for p in parts]])
    cov = pl.DataFrame([r for g in got for r in _coverage(g, logs_on)], schema=COVERAGE_SCHEMA)
    errors = [f"kubernetes job {g.key['job_id']}: {g.pods_error or '; '.join(g.log_errors + g.event_errors)}"[:300]
              for g in got if g.pods_error or g.log_errors or g.event_errors]
    return K8sCollected(jobs, allocs, raw, cov, place, errors)


PLACEMENT_ROW = {"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "namespace": pl.String,
                 "pod": pl.String, "uid": pl.String, "node": pl.String, "gpus": pl.Int32, "seen_at": TABLES["logs"]["ts"]}
