"""The placement recorder: pod -> node of every admitted Kueue workload, recorded while the pods exist.

A finished job's pods are often deleted (ttlSecondsAfterFinished, cleanPodPolicy, a JobSet's restart),
and with them the only record of which nodes the job ran on. Run every minute or so (the
`record-placements` deployment), the recorder lists the workloads of each Kubernetes cluster, the pods
of the admitted ones (the same label selectors as collect), and writes the placements not recorded yet
to the `placements` table (key: cluster + pod uid; a re-run writes nothing twice; each write is one
atomic file per partition). Collect reads them back for jobs whose pods are gone, and records the pods
it sees itself, so a pod that lived between two recorder runs is still caught when its job failed.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import polars as pl

from faultline.collectors import kubernetes as k8s
from faultline.collectors import kueue
from faultline.fleet.config import FleetConfig
from faultline.fleet.k8s_jobs import PLACEMENT_ROW, list_pods, placement_rows
from faultline.fleet.watermark import new_placements, stamp, unique_batch
from faultline.warehouse.schema import JOB_KEY, TABLES
from faultline.warehouse.store import Warehouse

LOOKBACK_DAYS = 30  # placements already recorded are looked up this far back


def record(cfg: FleetConfig, cluster_name: str, http=None, env: dict | None = None,
           now: datetime | None = None) -> dict:
    """One pass over one cluster: {cluster, workloads, pods, written, errors}."""
    c = next((c for c in cfg.clusters if c.name == cluster_name), None)
    if c is None or c.kind != "kubernetes":
        raise ValueError(f"cluster {cluster_name!r} is not a configured Kubernetes cluster")
    now = now or datetime.now(timezone.utc)
    logs = k8s.PodLogSettings.from_config(c.logs) if c.logs and c.logs.get("kind") == "kubernetes" \
        else k8s.PodLogSettings()
    client = k8s.KubeClient(k8s.KubeSettings.from_config(c.kubernetes), http=http, env=env)
    rows, errors = [], []
    try:
        items = kueue.list_workloads(client, kueue.KueueSettings.from_config(c.scheduler))
        jobs, targets, _ = kueue.workloads_to_frames(items, c.name)
        admitted = jobs.filter(pl.col("start_time").is_not_null()).select(JOB_KEY)
        for t in targets.join(admitted, on=JOB_KEY, how="semi").iter_rows(named=True):
            selector = k8s.pod_selector(logs, t["owner_kind"], t["owner_name"])
            if selector is None:
                continue
            try:
                pods = list_pods(client, t["namespace"], selector)
            except k8s.KubeError as exc:  # one workload's pods failing leaves the others recorded
                errors.append(f"{t['job_id']}: {exc}"[:300])
                continue
            rows += placement_rows(pods, {k: t[k] for k in JOB_KEY}, now)
    finally:
        client.close()
    frame = pl.DataFrame(rows, schema=PLACEMENT_ROW).select(list(TABLES["placements"]))
    wh = Warehouse(cfg.warehouse_dir)
    known = wh.read_window("placements", now - timedelta(days=LOOKBACK_DAYS), now + timedelta(days=1), [c.name],
                           columns=["cluster", "uid"])
    fresh = new_placements(frame, known)
    if fresh.height:
        wh.write("placements", fresh.with_columns(date=pl.col("seen_at").dt.date()),
                 unique_batch("placements", c.name, stamp(now)))
    return {"cluster": c.name, "workloads": admitted.height, "pods": frame.height, "written": fresh.height,
            "errors": errors}
