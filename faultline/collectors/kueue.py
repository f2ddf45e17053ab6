"""Collector: Kueue Workloads (`kueue.x-k8s.io/v1beta1`), the job unit of a Kubernetes cluster.

A Workload is one row of the `jobs` table: job_id `<namespace>/<workload>`, name the job that owns it
(`PyTorchJob/llama-sft`), queue its LocalQueue (the ClusterQueue it was admitted to is in raw_state's
companion line), state normalised from its conditions:

    Finished True, reason Succeeded                         COMPLETED
    Finished True, other reasons (Failed, OutOfSync)        FAILED
    Evicted True, reason Preempted / ClusterQueueStopped /
      LocalQueueStopped / AdmissionCheck                    PREEMPTED   (the scheduler took it back; requeued)
    Evicted True, reason InactiveWorkload / Deactivated     CANCELLED   (spec.active=false: a person, or the
                                                                         requeuing limit)
    Evicted True, reason PodsReadyTimeout                   FAILED      (its pods never all became ready: a
                                                                         failed start, the cause is in the pods)
    Evicted True, reason NodeFailures                       NODE_FAIL
    Evicted True, reason MaximumExecutionTimeExceeded       TIMEOUT
    Admitted True                                           RUNNING
    otherwise                                               PENDING

raw_state is `<Condition>:<Reason>` (e.g. `Evicted:PodsReadyTimeout`). The time a job ended is the
transition time of the deciding condition; it started when it was Admitted (else QuotaReserved).
Each condition also becomes a `scheduler` line the rules read (packs/kubernetes/kueue.yaml):

    workload <ns>/<name>: Condition: Evicted True, Reason: PodsReadyTimeout, Message: Exceeded the PodsReady ...
    workload <ns>/<name>: Admission: ClusterQueue <cq>, PodSet <ps> x<count> flavors <res>=<flavor>, ...

A workload keeps only its latest conditions: an evicted workload that was requeued and admitted again
reads as its new attempt (requeueState.count is the attempt number), not as the eviction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

import polars as pl

from faultline.collectors.kubernetes import KubeClient, parse_time
from faultline.warehouse.schema import TABLES

API = "/apis/kueue.x-k8s.io/v1beta1"

EVICTED_STATES = {
    "Preempted": "PREEMPTED", "ClusterQueueStopped": "PREEMPTED", "LocalQueueStopped": "PREEMPTED",
    "AdmissionCheck": "PREEMPTED", "InactiveWorkload": "CANCELLED", "Deactivated": "CANCELLED",
    "PodsReadyTimeout": "FAILED", "NodeFailures": "NODE_FAIL", "MaximumExecutionTimeExceeded": "TIMEOUT",
}
TARGET_SCHEMA = {"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "namespace": pl.String,
                 "workload": pl.String, "owner_kind": pl.String, "owner_name": pl.String}
LINE_SCHEMA = {"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "ts": TABLES["logs"]["ts"],
               "line": pl.String}


@dataclass(frozen=True)
class KueueSettings:
    """`scheduler: {kind: kueue, namespaces: [...]}`: which namespaces' workloads (empty: all namespaces)."""
    namespaces: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, section: dict) -> "KueueSettings":
        unknown = sorted(set(section) - {"kind", "namespaces", "node_events"})
        if unknown:
            raise ValueError(f"unknown key(s) {unknown}")
        ns = section.get("namespaces", [])
        if not isinstance(ns, list) or not all(isinstance(n, str) and n for n in ns):
            raise ValueError("namespaces must be a list of namespace names (empty or absent: all namespaces)")
        return cls(tuple(ns))


def _cond(wl: dict) -> dict[str, dict]:
    return {c.get("type"): c for c in (wl.get("status") or {}).get("conditions") or [] if isinstance(c, dict)}


def normalise(wl: dict) -> tuple[str, str, datetime | None]:
    """(state, raw_state, the time that state began) of one Workload."""
    conds = _cond(wl)
    fin, ev, adm = conds.get("Finished"), conds.get("Evicted"), conds.get("Admitted")
    if fin and fin.get("status") == "True":
        reason = fin.get("reason") or ""
        return ("COMPLETED" if reason == "Succeeded" else "FAILED"), f"Finished:{reason}", \
            parse_time(fin.get("lastTransitionTime"))
    if ev and ev.get("status") == "True":
        reason = ev.get("reason") or ""
        return EVICTED_STATES.get(reason, "PREEMPTED"), f"Evicted:{reason}", parse_time(ev.get("lastTransitionTime"))
    if adm and adm.get("status") == "True":
        return "RUNNING", "Admitted", None
    qr = conds.get("QuotaReserved")
    return "PENDING", f"Pending:{(qr or {}).get('reason') or 'NoQuota'}", None


def owner(wl: dict) -> tuple[str | None, str | None]:
    """The job a Workload stands for: its controller owner reference (a pod group: the group label)."""
    meta = wl.get("metadata") or {}
    refs = [r for r in meta.get("ownerReferences") or [] if isinstance(r, dict)]
    ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    if ref:
        if ref.get("kind") == "Pod":  # a pod group: the workload is named after the group
            group = (meta.get("labels") or {}).get("kueue.x-k8s.io/pod-group-name") or meta.get("name")
            return "Pod", group
        return ref.get("kind"), ref.get("name")
    return None, None


def workload_lines(wl: dict, job_id: str) -> list[dict]:
    """The workload's conditions and admission as scheduler lines."""
    meta, status = wl.get("metadata") or {}, wl.get("status") or {}
    prefix = f"workload {meta.get('namespace')}/{meta.get('name')}"
    out = []
    adm = status.get("admission") or {}
    if adm:
        parts = [f"ClusterQueue {adm.get('clusterQueue')}"]
        for ps in adm.get("podSetAssignments") or []:
            flavors = ",".join(f"{k}={v}" for k, v in sorted((ps.get("flavors") or {}).items()))
            parts.append(f"PodSet {ps.get('name')} x{ps.get('count', '?')} flavors {flavors or '-'}")
        qr = _cond(wl).get("QuotaReserved") or {}
        out.append({"ts": parse_time(qr.get("lastTransitionTime")), "line": f"{prefix}: Admission: " + ", ".join(parts)})
    for c in status.get("conditions") or []:
        if not isinstance(c, dict):
            continue
        msg = " ".join(str(c.get("message") or "").split())[:500]
        out.append({"ts": parse_time(c.get("lastTransitionTime")),
                    "line": f"{prefix}: Condition: {c.get('type')} {c.get('status')}, Reason: {c.get('reason')}, "
                            f"Message: {msg}"})
    return [{"job_id": job_id, **r} for r in out]


def workloads_to_frames(items: list[dict], cluster: str) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Workload objects -> (jobs rows without nodes, targets: where each job's pods are, scheduler lines)."""
    jobs, targets, lines = [], [], []
    for wl in items:
        meta, spec, status = wl.get("metadata") or {}, wl.get("spec") or {}, wl.get("status") or {}
        if not meta.get("name") or not meta.get("namespace"):
            continue
        state, raw, ended = normalise(wl)
        conds = _cond(wl)
        started = next((parse_time(c.get("lastTransitionTime")) for k in ("Admitted", "QuotaReserved")
                        if (c := conds.get(k)) and c.get("status") == "True"), None)
        kind, name = owner(wl)
        job_id = f"{meta['namespace']}/{meta['name']}"
        attempt = int(((status.get("requeueState") or {}).get("count")) or 0)
        counts = [int(ps.get("count") or 0) for ps in spec.get("podSets") or [] if isinstance(ps, dict)]
        jobs.append({"cluster": cluster, "job_id": job_id, "attempt": attempt, "scheduler": "kueue",
                     "name": f"{kind}/{name}" if kind else meta["name"], "user": None,
                     "queue": spec.get("queueName") or None, "state": state, "raw_state": raw,
                     "exit_code": None, "signal": None, "submit_time": parse_time(meta.get("creationTimestamp")),
                     "start_time": started if state != "PENDING" else None, "end_time": ended,
                     "num_nodes": None, "num_gpus": None, "pods": sum(counts)})
        targets.append({"cluster": cluster, "job_id": job_id, "attempt": attempt, "namespace": meta["namespace"],
                        "workload": meta["name"], "owner_kind": kind, "owner_name": name})
        lines += [{"cluster": cluster, "attempt": attempt, **r} for r in workload_lines(wl, job_id)]
    schema = {**TABLES["jobs"], "pods": pl.Int64}
    schema.pop("nodes")
    frame = pl.DataFrame(jobs, schema=schema)
    return (frame.drop("pods").with_columns(nodes=pl.lit([], pl.List(pl.String))).select(list(TABLES["jobs"])),
            pl.DataFrame(targets, schema=TARGET_SCHEMA), pl.DataFrame(lines, schema=LINE_SCHEMA))


def list_workloads(client: KubeClient, settings: KueueSettings) -> list[dict]:
    if not settings.namespaces:
        return client.list(f"{API}/workloads")
    out = []
    for ns in settings.namespaces:
        out += client.list(f"{API}/namespaces/{quote(ns)}/workloads")
    return out


def find_workload(client: KubeClient, job_id: str) -> list[dict]:
    """The Workload of a job id `<namespace>/<name>` (custom resources take metadata.name field selectors)."""
    ns, _, name = job_id.partition("/")
    if not ns or not name:
        raise ValueError(f"a Kubernetes job id is <namespace>/<workload>, got {job_id!r}")
    return client.list(f"{API}/namespaces/{quote(ns)}/workloads", {"fieldSelector": f"metadata.name={name}"})
