"""Kubernetes and Kueue objects for the fake API server, shaped as the API returns them (invented names)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

T0 = datetime(2026, 3, 2, 10, 0, 0, tzinfo=timezone.utc)


def iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(ns: str, name: str, node: str | None, labels: dict, container: str = "pytorch", phase: str = "Failed",
        terminated: dict | None = None, last: dict | None = None, restarts: int = 0, gpus: int = 8,
        reason: str | None = None, message: str | None = None, conditions: list | None = None) -> dict:
    status = {"phase": phase, "startTime": iso(T0), "conditions": conditions or []}
    if reason:
        status["reason"], status["message"] = reason, message or ""
    cs = {"name": container, "restartCount": restarts, "ready": False, "image": "registry.example/train:1.4",
          "state": {"terminated": terminated} if terminated else {"running": {"startedAt": iso(T0)}},
          "lastState": {"terminated": last} if last else {}}
    status["containerStatuses"] = [cs] if node else []
    spec = {"containers": [{"name": container, "image": "registry.example/train:1.4",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": ns, "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{ns}/{name}")),
                         "labels": labels, "creationTimestamp": iso(T0)}, "spec": spec, "status": status}


def terminated(reason: str, code: int, at: datetime, signal: int | None = None) -> dict:
    t = {"reason": reason, "exitCode": code, "startedAt": iso(T0 + timedelta(seconds=4)), "finishedAt": iso(at),
         "containerID": "containerd://" + uuid.uuid4().hex}
    if signal:
        t["signal"] = signal
    return t


def event(ns: str, kind: str, name: str, reason: str, message: str, at: datetime, type_: str = "Warning",
          component: str = "kubelet", host: str | None = None, count: int = 1) -> dict:
    return {"metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": ns},
            "involvedObject": {"kind": kind, "name": name, "namespace": ns if kind != "Node" else "",
                               "apiVersion": "v1"},
            "reason": reason, "message": message, "type": type_, "count": count,
            "source": {"component": component, **({"host": host} if host else {})},
            "firstTimestamp": iso(at), "lastTimestamp": iso(at), "eventTime": None,
            "reportingComponent": component, "reportingInstance": host or ""}


def node(name: str, ready: str = "True", since: datetime = T0 - timedelta(days=3), reason: str = "KubeletReady",
         message: str = "kubelet is posting ready status") -> dict:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
                 "message": "kubelet has sufficient memory available", "lastTransitionTime": iso(since)},
                {"type": "Ready", "status": ready, "reason": reason, "message": message,
                 "lastHeartbeatTime": iso(since), "lastTransitionTime": iso(since)}]}}


def condition(type_: str, status: str, reason: str, message: str, at: datetime) -> dict:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": iso(at),
            "observedGeneration": 1}


def workload(ns: str, name: str, owner_kind: str, owner_name: str, conditions: list, pods: int = 4,
             queue: str = "team-a-queue", cq: str = "gpu-cq", requeues: int | None = None) -> dict:
    status = {"conditions": conditions,
              "admission": {"clusterQueue": cq, "podSetAssignments": [
                  {"name": "worker", "count": pods, "flavors": {"nvidia.com/gpu": "h100", "cpu": "default"}}]}}
    if requeues is not None:
        status["requeueState"] = {"count": requeues}
    return {"metadata": {"name": name, "namespace": ns, "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
                         "creationTimestamp": iso(T0 - timedelta(minutes=2)),
                         "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": owner_kind, "name": owner_name,
                                              "uid": str(uuid.uuid4()), "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": {"queueName": queue, "podSets": [{"name": "worker", "count": pods}], "active": True},
            "status": status}


def finished_failed(at: datetime, message: str = "PyTorchJob llama is failed because 1 Worker replica(s) failed.",
                    admitted: datetime = T0) -> list:
    return [condition("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue gpu-cq", admitted),
            condition("Admitted", "True", "Admitted", "The workload is admitted", admitted),
            condition("PodsReady", "True", "Started", "All pods reached readiness", admitted + timedelta(minutes=1)),
            condition("Finished", "True", "Failed", message, at)]
