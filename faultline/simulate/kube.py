"""A small Kubernetes + Kueue cluster for the simulator and the demo, with its truth.

Written as a kubectl snapshot (faultline.collectors.kube_snapshot: workloads, pods, events, nodes as
`kubectl get -o json` prints them, container logs as `kubectl logs --timestamps`), so the demo collects it
through the same Kubernetes collector as a live cluster. One day of PyTorchJobs under Kueue on eight
8-GPU nodes: most complete; the failures are a worker OOMKilled by the kubelet (the others time out in
NCCL: the OOMKilled pod's node is the culprit, a workload fault), a Kueue eviction for PodsReadyTimeout
(a worker that never got GPUs), a Kueue preemption, and a node that went NotReady under a running job.
Kept apart from the Slurm simulator (faultline.simulate.sim): its own files and truth rows.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import polars as pl

CLUSTER = "kube"
NS = "ml"
NODES = [f"kube-gpu{i:02d}" for i in range(1, 9)]
WD = ("[rank{r}]:[E{md} {hms}.{us:06d}000 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective operation "
      "timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=2097152, NumelOut=2097152, Timeout(ms)=600000) "
      "ran for 600{ms:03d} milliseconds before timing out.")


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _nano(t: datetime) -> str:
    frac = f"{t.microsecond:06d}000".rstrip("0")
    return t.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + "Z"


def _uid(*parts) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "/".join(map(str, parts))))


def _cond(type_, status, reason, message, at):
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": _iso(at)}


class _Snap:
    def __init__(self, root: Path):
        self.root, self.workloads, self.pods, self.events, self.truth = root, [], [], [], []
        self.logs: dict[str, list[str]] = {}

    def log(self, pod: str, lines: list[tuple[datetime, str]], previous: bool = False) -> None:
        key = f"{pod}/pytorch{'.previous' if previous else ''}.log"
        self.logs[key] = [f"{_nano(t)} {line}\n" for t, line in lines]

    def event(self, kind, name, reason, message, at, type_="Warning", component="kubelet", host=None, ns=NS):
        self.events.append({
            "apiVersion": "v1", "kind": "Event", "metadata": {"name": f"{name}.{_uid(name, reason, at)[:16]}",
                                                             "namespace": ns},
            "involvedObject": {"kind": kind, "name": name, "namespace": "" if kind == "Node" else ns},
            "reason": reason, "message": message, "type": type_, "count": 1,
            "source": {"component": component, **({"host": host} if host else {})},
            "firstTimestamp": _iso(at), "lastTimestamp": _iso(at)})

    def write(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        nodes = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}, "status": {"conditions": [
            _cond("Ready", "True", "KubeletReady", "kubelet is posting ready status", self.t0 - timedelta(days=5))]}}
            for n in NODES]
        for n in nodes:
            if n["metadata"]["name"] in self.not_ready:
                n["status"]["conditions"] = [_cond("Ready", "Unknown", "NodeStatusUnknown",
                                                   "Kubelet stopped posting node status.",
                                                   self.not_ready[n["metadata"]["name"]])]
        for name, items in (("workloads.json", self.workloads), ("pods.json", self.pods),
                            ("events.json", self.events), ("nodes.json", nodes)):
            (self.root / name).write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
                                          encoding="utf-8")
        for key, lines in self.logs.items():
            p = self.root / "logs" / NS / key
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("".join(lines), encoding="utf-8")


def _pod(name, job, node, term=None, last=None, restarts=0, phase="Failed", t0=None, conditions=()):
    cs = {"name": "pytorch", "restartCount": restarts, "ready": False,
          "state": {"terminated": term} if term else {"running": {"startedAt": _iso(t0)}},
          "lastState": {"terminated": last} if last else {}}
    spec = {"containers": [{"name": "pytorch", "image": "registry.example/train:2.1",
                            "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "uid": _uid(NS, name),
                         "labels": {"training.kubeflow.org/job-name": job}},
            "spec": spec, "status": {"phase": phase, "startTime": _iso(t0), "conditions": list(conditions),
                                     "containerStatuses": [cs] if node else []}}


def _term(reason, code, start, end):
    return {"reason": reason, "exitCode": code, "startedAt": _iso(start), "finishedAt": _iso(end)}


def _workload(job, conds, pods, t0):
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": f"pytorchjob-{job}-{_uid(job)[:5]}", "namespace": NS, "uid": _uid("wl", job),
                         "creationTimestamp": _iso(t0 - timedelta(minutes=1)),
                         "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": job,
                                              "uid": _uid("pj", job), "controller": True}]},
            "spec": {"queueName": "ml-queue", "podSets": [{"name": "worker", "count": pods}]},
            "status": {"conditions": conds, "admission": {"clusterQueue": "gpu-cq", "podSetAssignments": [
                {"name": "worker", "count": pods, "flavors": {"nvidia.com/gpu": "h100"}}]}}}


def _admitted(t0):
    return [_cond("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue gpu-cq", t0),
            _cond("Admitted", "True", "Admitted", "The workload is admitted", t0)]


def simulate_kube(out: Path, day: str, seed: int = 0, completed: int = 6) -> pl.DataFrame:
    """Write the snapshot to `<out>/kube` and return its truth rows (cluster, job_id, attempt, state, outcome,
    culprit_nodes, culprit_ranks, culprit_rank_nodes, root_cause, end_time)."""
    rng = np.random.default_rng([seed, 11])
    snap = _Snap(Path(out) / CLUSTER)
    snap.t0 = datetime.fromisoformat(day).replace(tzinfo=timezone.utc) + timedelta(hours=8)
    snap.not_ready = {}
    truth = []

    def job(name, t0, nodes, state, outcome, culprit=(), why=""):
        wl = snap.workloads[-1]
        truth.append({"cluster": CLUSTER, "job_id": f"{NS}/{wl['metadata']['name']}", "attempt": 0, "state": state,
                      "outcome": outcome, "culprit_nodes": list(culprit), "culprit_ranks": [],
                      "culprit_rank_nodes": [], "root_cause": why,
                      "end_time": max(datetime.fromisoformat(c["lastTransitionTime"].replace("Z", "+00:00"))
                                      for c in wl["status"]["conditions"])})

    def steps(r, t0, n):
        return [(t0 + timedelta(seconds=20 + 30 * k, microseconds=int(rng.integers(0, 999999))),
                 f"[rank{r}]: step {k * 10} loss {3.2 - 0.01 * k:.3f}") for k in range(n)]

    t = snap.t0
    for k in range(completed):  # finished fine
        name, picks = f"sft-{k}", [NODES[(2 * k + i) % len(NODES)] for i in range(2)]
        end = t + timedelta(minutes=40)
        for r, n in enumerate(picks):
            snap.pods.append(_pod(f"{name}-worker-{r}", name, n, _term("Completed", 0, t, end), phase="Succeeded",
                                  t0=t))
            snap.log(f"{name}-worker-{r}", steps(r, t, 5))
        snap.workloads.append(_workload(name, _admitted(t) + [_cond("Finished", "True", "Succeeded",
                                                                     "Job finished successfully", end)], 2, t))
        job(name, t, picks, "COMPLETED", "healthy", why="The job completed")
        t += timedelta(minutes=50)

    # 1. one worker OOMKilled; the others time out in NCCL
    name, picks, t0 = "pretrain-oom", NODES[0:4], t
    oom = t0 + timedelta(minutes=6, seconds=int(rng.integers(0, 50)))
    for r, n in enumerate(picks):
        pname = f"{name}-worker-{r}"
        if r == 2:
            snap.pods.append(_pod(pname, name, n, _term("OOMKilled", 137, t0, oom), t0=t0))
            snap.log(pname, steps(r, t0, 10))
        else:
            at = oom + timedelta(minutes=10, seconds=r)
            snap.pods.append(_pod(pname, name, n, _term("Error", 134, t0, at + timedelta(seconds=30)), t0=t0))
            snap.log(pname, steps(r, t0, 10) + [(at, WD.format(r=r, md=at.strftime("%m%d"), hms=at.strftime("%H:%M:%S"),
                                                               us=at.microsecond, seq=4410, ms=r))])
    end = oom + timedelta(minutes=11)
    snap.workloads.append(_workload(name, _admitted(t0) + [_cond(
        "Finished", "True", "Failed", f"PyTorchJob {name} is failed because 1 Worker replica(s) failed.", end)], 4, t0))
    job(name, t0, picks, "FAILED", "host_oom", [picks[2]],
        f"Container of {name}-worker-2 on {picks[2]} OOMKilled (memory limit)")
    t += timedelta(minutes=30)

    # 2. PodsReadyTimeout: a worker never got GPUs
    name, t0 = "eval-wait", t
    snap.pods.append(_pod(f"{name}-worker-0", name, NODES[4], phase="Running", t0=t0))
    snap.log(f"{name}-worker-0", [(t0 + timedelta(seconds=15), "waiting for 2 workers to join the rendezvous")])
    snap.pods.append(_pod(f"{name}-worker-1", name, None, phase="Pending", t0=t0))
    snap.event("Pod", f"{name}-worker-1", "FailedScheduling", "0/8 nodes are available: 8 Insufficient nvidia.com/gpu. "
               "preemption: 0/8 nodes are available: 8 No preemption victims found for incoming pod.",
               t0 + timedelta(seconds=30), component="default-scheduler")
    at = t0 + timedelta(minutes=5)
    wl = _workload(name, [_cond("QuotaReserved", "False", "Pending", "couldn't assign flavors to pod set worker", at),
                          _cond("Admitted", "False", "NoReservation", "The workload has no reservation", at),
                          _cond("Evicted", "True", "PodsReadyTimeout", "", at)], 2, t0)
    wl["status"]["conditions"][-1]["message"] = f"Exceeded the PodsReady timeout {NS}/{wl['metadata']['name']}"
    snap.workloads.append(wl)
    job(name, t0, [NODES[4]], "FAILED", "scheduler_preemption_cancel", why="Kueue evicted it: pods not ready in time")
    t += timedelta(minutes=20)

    # 3. preempted by Kueue for a higher-priority workload
    name, t0 = "sweep-lowprio", t
    at = t0 + timedelta(minutes=12)
    for r, n in enumerate(NODES[5:7]):
        snap.pods.append(_pod(f"{name}-worker-{r}", name, n, _term("Error", 143, t0, at + timedelta(seconds=20)),
                              t0=t0))
        snap.log(f"{name}-worker-{r}", steps(r, t0, 8))
    snap.workloads.append(_workload(name, _admitted(t0) + [_cond(
        "Evicted", "True", "Preempted", "Preempted to accommodate a workload (UID: 5f0e, JobUID: 77ab) due to "
        "prioritization in the ClusterQueue", at)], 2, t0))
    job(name, t0, NODES[5:7], "PREEMPTED", "scheduler_preemption_cancel", why="Kueue preempted it")
    t += timedelta(minutes=30)

    # 4. a node goes NotReady under a running job
    name, t0, picks = "finetune-node", t, NODES[6:8]
    lost = t0 + timedelta(minutes=9)
    snap.not_ready[picks[1]] = lost
    snap.event("Node", picks[1], "NodeNotReady", f"Node {picks[1]} status is now: NodeNotReady", lost,
               type_="Normal", component="node-controller", ns="default")
    for r, n in enumerate(picks):
        pname = f"{name}-worker-{r}"
        snap.pods.append(_pod(pname, name, n, _term("Error", 1, t0, lost + timedelta(minutes=11)), t0=t0))
        at = lost + timedelta(minutes=10)
        snap.log(pname, steps(r, t0, 8) + ([(at, WD.format(r=r, md=at.strftime("%m%d"), hms=at.strftime("%H:%M:%S"),
                                                           us=at.microsecond, seq=880, ms=7))] if r == 0 else []))
    snap.workloads.append(_workload(name, _admitted(t0) + [_cond(
        "Finished", "True", "Failed", f"PyTorchJob {name} is failed because 1 Worker replica(s) failed.",
        lost + timedelta(minutes=12))], 2, t0))
    job(name, t0, picks, "FAILED", "node_failure", [picks[1]], f"Node {picks[1]} went NotReady")

    snap.write()
    return pl.DataFrame(truth, schema={"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32,
                                       "state": pl.String, "outcome": pl.String, "culprit_nodes": pl.List(pl.String),
                                       "culprit_ranks": pl.List(pl.Int32), "culprit_rank_nodes": pl.List(pl.String),
                                       "root_cause": pl.String, "end_time": pl.Datetime("us", "UTC")})


def kube_cluster_config(out: Path) -> dict:
    """The demo's fleet-config entry for the snapshot."""
    return {"name": CLUSTER, "kind": "kubernetes", "kubernetes": {"snapshot": str(Path(out) / CLUSTER)},
            "scheduler": {"kind": "kueue"}, "logs": {"kind": "kubernetes"}}
