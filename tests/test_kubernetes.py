"""Kubernetes + Kueue collectors against the fake API server (tests/k8s_fake.py): paging, 410 Gone, selectors,
logs (previous, sinceTime, limitBytes, timestamps), events, node conditions, auth, faults, placements, and the
diagnoses they lead to."""

from __future__ import annotations

import json
import socket
from datetime import datetime, timedelta, timezone

import polars as pl
import pytest
import yaml

from faultline.collectors import kubernetes as k8s
from faultline.collectors import kueue
from faultline.fleet import k8s_jobs, watermark
from faultline.fleet.collect import collect_cluster
from faultline.fleet.config import ConfigError, load_config, write_config
from faultline.fleet.diagnose import diagnose_tables
from faultline.warehouse.store import Warehouse
from tests.k8s_fake import FakeKube
from tests.k8s_objects import T0, condition, event, finished_failed, iso, node, pod, terminated, workload

NS = "team-a"
LLAMA = {"training.kubeflow.org/job-name": "llama", "training.kubeflow.org/replica-type": "worker"}
START, END = T0 - timedelta(hours=1), T0 + timedelta(hours=3)
OOM_AT = T0 + timedelta(minutes=5)
WD = ("[rank{r}]:[E302 10:15:0{r}.000000000 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective "
      "operation timeout: WorkNCCL(SeqNum=2210, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, "
      "Timeout(ms)=600000) ran for 600041 milliseconds before timing out.")


def pytorchjob(fake: FakeKube) -> None:
    """PyTorchJob llama: worker-1 on gpu-a2 OOMKilled at 10:05 (restarted once, then killed again); the other
    pods time out in NCCL at 10:15 and are SIGKILLed by the runtime."""
    nodes = {0: "gpu-a1", 1: "gpu-a2", 2: "gpu-a3", 3: "gpu-a4"}
    for r, n in nodes.items():
        fake.nodes[n] = node(n)
        name = f"llama-worker-{r}"
        lines = [(T0 + timedelta(seconds=30), f"[rank{r}]: step 10 loss 2.31")]
        if r == 1:
            fake.add_pod(pod(NS, name, n, LLAMA, terminated=terminated("OOMKilled", 137, OOM_AT),
                             last=terminated("OOMKilled", 137, OOM_AT - timedelta(minutes=3)), restarts=1),
                         logs={"pytorch": lines}, previous={"pytorch": lines + [(OOM_AT - timedelta(minutes=3),
                                                                                  "[rank1]: loading shard 7")]})
        else:
            fake.add_pod(pod(NS, name, n, LLAMA, terminated=terminated("Error", 137, T0 + timedelta(minutes=16))),
                         logs={"pytorch": lines + [(T0 + timedelta(minutes=15, seconds=r), WD.format(r=r))]})
    fake.events.append(event(NS, "Pod", "llama-worker-1", "BackOff", "Back-off restarting failed container pytorch "
                             "in pod llama-worker-1_team-a", OOM_AT - timedelta(minutes=2), host="gpu-a2"))
    fake.workloads.append(workload(NS, "pytorchjob-llama-4b1c2", "PyTorchJob", "llama",
                                   finished_failed(T0 + timedelta(minutes=17))))


def bert_pods_ready_timeout(fake: FakeKube) -> None:
    """PyTorchJob bert: admitted, one pod never scheduled (no GPUs free), evicted for PodsReadyTimeout."""
    labels = {"training.kubeflow.org/job-name": "bert"}
    fake.nodes["gpu-b1"] = node("gpu-b1")
    fake.add_pod(pod(NS, "bert-worker-0", "gpu-b1", labels, phase="Running"), logs={"pytorch": [
        (T0 + timedelta(seconds=20), "waiting for rendezvous of 2 workers")]})
    fake.add_pod(pod(NS, "bert-worker-1", None, labels, phase="Pending", conditions=[
        condition("PodScheduled", "False", "Unschedulable", "0/6 nodes are available: 6 Insufficient nvidia.com/gpu.",
                  T0)]))
    fake.events.append(event(NS, "Pod", "bert-worker-1", "FailedScheduling", "0/6 nodes are available: 6 Insufficient "
                             "nvidia.com/gpu. preemption: 0/6 nodes are available: 6 No preemption victims found for "
                             "incoming pod.", T0 + timedelta(minutes=1), component="default-scheduler"))
    at = T0 + timedelta(minutes=10)
    fake.workloads.append(workload(NS, "pytorchjob-bert-9d8e7", "PyTorchJob", "bert", [
        condition("QuotaReserved", "False", "Pending", "couldn't assign flavors", at),
        condition("Admitted", "False", "NoReservation", "The workload has no reservation", at),
        condition("PodsReady", "False", "WaitForStart", "Not all pods are ready or succeeded", T0),
        condition("Evicted", "True", "PodsReadyTimeout", f"Exceeded the PodsReady timeout {NS}/pytorchjob-bert-9d8e7",
                  at),
        condition("Requeued", "False", "PodsReadyTimeout", f"Exceeded the PodsReady timeout {NS}/pytorchjob-bert-9d8e7",
                  at)], pods=2))


@pytest.fixture
def fake():
    f = FakeKube()
    url = f.start()
    f.url = url
    yield f
    f.stop()


def kubeconfig(tmp_path, url: str, token: str = "good-token") -> str:
    p = tmp_path / "kubeconfig"
    p.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fleet",
        "clusters": [{"name": "c1", "cluster": {"server": url}}],
        "users": [{"name": "collector", "user": {"token": token}}],
        "contexts": [{"name": "fleet", "context": {"cluster": "c1", "user": "collector", "namespace": NS}}]}))
    return str(p)


def cluster_cfg(tmp_path, url: str, token: str = "good-token", **logs) -> dict:
    return {"name": "kube", "kind": "kubernetes",
            "kubernetes": {"kubeconfig": kubeconfig(tmp_path, url, token), "timeout_s": 1, "retries": 1,
                           "backoff_s": 0, "page_limit": 2},
            "scheduler": {"kind": "kueue", "namespaces": [NS]},
            "logs": {"kind": "kubernetes", **logs}}


def collect(tmp_path, url, token="good-token", **logs):
    data = tmp_path / "data"
    write_config(data, [cluster_cfg(tmp_path, url, token, **logs)])
    cfg = load_config(data)
    return cfg, collect_cluster(cfg.clusters[0], START, END, cfg.margin_minutes)


def cov(got, source) -> dict:
    return {r["job_id"]: (r["status"], r["reason"]) for r in
            got.coverage.filter(pl.col("source") == source).iter_rows(named=True)}


def client(url, **kw) -> k8s.KubeClient:
    import httpx
    return k8s.KubeClient(k8s.KubeSettings(timeout_s=1, retries=1, backoff_s=0, **kw),
                          http=httpx.Client(base_url=url, headers={"Authorization": "Bearer good-token"}, timeout=1))


# ------------------------------------------------------------------ the API client against the fake server

def test_lists_are_paged_with_limit_and_continue_and_selected_by_label(fake):
    for i in range(5):
        fake.add_pod(pod(NS, f"a-{i}", "gpu-a1", {"app": "a"}))
    fake.add_pod(pod(NS, "other", "gpu-a1", {"app": "b"}))
    c = client(fake.url, page_limit=2)
    got = c.list(f"/api/v1/namespaces/{NS}/pods", {"labelSelector": "app=a"})
    assert [p["metadata"]["name"] for p in got] == [f"a-{i}" for i in range(5)]
    asked = [q for path, q in fake.requests if path.endswith("/pods")]
    assert [q.get("limit") for q in asked] == ["2"] * 3 and "continue" not in asked[0] and "continue" in asked[2]
    assert c.list(f"/api/v1/namespaces/{NS}/pods", {"fieldSelector": "metadata.name=other"})[0]["metadata"]["labels"] \
        == {"app": "b"}
    with pytest.raises(k8s.KubeError, match="field label not supported: spec.bogus"):
        c.list(f"/api/v1/namespaces/{NS}/pods", {"fieldSelector": "spec.bogus=1"})


def test_an_expired_continue_token_restarts_the_list_once_then_is_reported(fake):
    for i in range(5):
        fake.add_pod(pod(NS, f"a-{i}", "gpu-a1", {"app": "a"}))
    c = client(fake.url, page_limit=2)
    fake.fault("expire", 1, "continue=")
    got = c.list(f"/api/v1/namespaces/{NS}/pods")
    assert len(got) == 5  # no duplicate of the first page after the restart
    fake.fault("expire", 2, "continue=")
    with pytest.raises(k8s.KubeError, match="HTTP 410: Expired: The provided continue parameter is too old.*again"):
        c.list(f"/api/v1/namespaces/{NS}/pods")


def test_logs_with_timestamps_since_and_limit_and_previous(fake):
    lines = [(T0 + timedelta(seconds=s, microseconds=120), f"line {s}") for s in range(5)]
    fake.add_pod(pod(NS, "p", "gpu-a1", {}), logs={"pytorch": lines})
    c = client(fake.url)
    text = c.log(NS, "p", "pytorch", since=T0 + timedelta(seconds=2))
    frame = k8s.log_lines(text, "gpu-a1", "f")
    assert frame["line"].to_list() == ["line 2", "line 3", "line 4"]
    assert frame["ts"][0] == T0 + timedelta(seconds=2, microseconds=120)
    assert len(c.log(NS, "p", "pytorch", limit_bytes=40)) == 40
    with pytest.raises(k8s.KubeBadRequest, match='previous terminated container "pytorch" in pod "p" not found'):
        c.log(NS, "p", "pytorch", previous=True)
    with pytest.raises(k8s.KubeNotFound, match='pods "gone" not found'):
        c.log(NS, "gone", "pytorch")


def test_retries_cure_a_passing_500_and_give_up_with_the_reason(fake):
    fake.add_pod(pod(NS, "p", "gpu-a1", {}))
    c = client(fake.url)
    fake.fault("500", 1, "/pods")
    assert len(c.list(f"/api/v1/namespaces/{NS}/pods")) == 1
    fake.fault("503", 2, "/pods")
    with pytest.raises(k8s.KubeError, match="HTTP 503: ServiceUnavailable.*gave up after 2 attempts"):
        c.list(f"/api/v1/namespaces/{NS}/pods")


# ------------------------------------------------------------------ auth

def test_kubeconfig_token_file_ca_data_and_refused_exec_plugins(tmp_path):
    (tmp_path / "tok").write_text("from-file\n")
    doc = {"current-context": "b", "clusters": [{"name": "c", "cluster": {"server": "https://api.example:6443/",
                                                                            "insecure-skip-tls-verify": True}}],
           "users": [{"name": "u", "user": {"tokenFile": "tok"}},
                     {"name": "e", "user": {"exec": {"command": "aws", "apiVersion": "client.authentication.k8s.io/v1"}}}],
           "contexts": [{"name": "b", "context": {"cluster": "c", "user": "u"}},
                        {"name": "x", "context": {"cluster": "c", "user": "e"}}]}
    p = tmp_path / "config"
    p.write_text(yaml.safe_dump(doc))
    conn = k8s.from_kubeconfig(p)
    assert (conn.server, conn.token, conn.verify) == ("https://api.example:6443", "from-file", False)
    with pytest.raises(k8s.KubeError, match="exec plugin"):
        k8s.from_kubeconfig(p, "x")
    with pytest.raises(k8s.KubeError, match="no context 'nope'"):
        k8s.from_kubeconfig(p, "nope")


def test_in_cluster_service_account(tmp_path):
    with pytest.raises(k8s.KubeError, match="KUBERNETES_SERVICE_HOST"):
        k8s.in_cluster({}, tmp_path)
    with pytest.raises(k8s.KubeError, match="service account files"):
        k8s.in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, tmp_path)


def test_refused_credentials_are_coverage_errors_with_the_api_message(fake, tmp_path):
    pytorchjob(fake)
    with pytest.raises(k8s.KubeError, match="HTTP 401: Unauthorized"):
        collect(tmp_path, fake.url, token="stale-token")  # the scheduler itself: the collect fails, nothing lost
    fake.tokens["no-logs"] = {"list pods", "list events", "get nodes", "list workloads"}
    _, got = collect(tmp_path, fake.url, token="no-logs")
    status, reason = cov(got, "applog")[f"{NS}/pytorchjob-llama-4b1c2"]
    assert status == "error" and 'cannot get resource "pods/log"' in reason and "Forbidden" in reason
    assert cov(got, "k8s_event")[f"{NS}/pytorchjob-llama-4b1c2"][0] == "ok"  # the states and events still came


# ------------------------------------------------------------------ collect: what the pods say

def test_collect_a_failed_pytorchjob(fake, tmp_path):
    pytorchjob(fake)
    _, got = collect(tmp_path, fake.url)
    assert got.errors == []
    job = got.jobs.row(0, named=True)
    assert (job["job_id"], job["name"], job["state"], job["raw_state"], job["queue"]) == (
        f"{NS}/pytorchjob-llama-4b1c2", "PyTorchJob/llama", "FAILED", "Finished:Failed", "team-a-queue")
    assert job["nodes"] == ["gpu-a1", "gpu-a2", "gpu-a3", "gpu-a4"] and job["num_gpus"] == 32
    assert job["start_time"] == T0 and job["end_time"] == T0 + timedelta(minutes=17)
    logs = got.logs
    oom = logs.filter(pl.col("line").str.contains("Reason: OOMKilled"))
    assert set(oom["node"]) == {"gpu-a2"} and oom.height == 2  # state and last state
    assert logs.filter(pl.col("file").str.ends_with(":previous"))["line"].to_list()[-1] == "[rank1]: loading shard 7"
    assert logs.filter(pl.col("line").str.contains("Watchdog caught"))["node"].sort().to_list() == \
        ["gpu-a1", "gpu-a3", "gpu-a4"]
    assert logs.filter(pl.col("source") == "scheduler")["line"].str.contains("Admission: ClusterQueue gpu-cq").any()
    assert logs.filter(pl.col("line").str.contains("BackOff"))["node"].to_list() == ["gpu-a2"]
    assert {s: v[0] for s, v in {s: cov(got, s)[job["job_id"]] for s in ("applog", "k8s_event", "syslog")}.items()} \
        == {"applog": "ok", "k8s_event": "ok", "syslog": "not_configured"}
    # paging: 4 pods at page_limit 2 is 2 requests
    assert sum(1 for p, _ in fake.requests if p.endswith("/pods")) == 2


@pytest.mark.parametrize("fault, reason", [
    ("500", "HTTP 500: InternalError"), ("timeout", "timed out after 1 s"), ("malformed", "response is not JSON"),
    ("drop", "cannot reach"), ("partial", "HTTP 500")])
def test_a_failing_job_gets_a_coverage_error_and_the_others_are_collected(fake, tmp_path, fault, reason):
    pytorchjob(fake)
    bert_pods_ready_timeout(fake)
    fake.hang_s = 1.5
    where = "training.kubeflow.org%2Fjob-name%3Dllama"
    if fault == "partial":  # the second page of llama's pods fails, every retry
        fake.fault("500", 2, "continue=")
    else:
        fake.fault(fault, 2, where)
    _, got = collect(tmp_path, fake.url)
    llama, bert = f"{NS}/pytorchjob-llama-4b1c2", f"{NS}/pytorchjob-bert-9d8e7"
    status, why = cov(got, "k8s_event")[llama]
    assert status == "error" and reason in why and cov(got, "applog")[llama][0] == "error"
    assert cov(got, "k8s_event")[bert][0] == "ok" and cov(got, "applog")[bert][0] == "ok"
    assert any(llama in e for e in got.errors)


def test_a_server_that_is_down_fails_the_collect_with_the_reason(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(k8s.KubeError, match="cannot reach"):
        collect(tmp_path, f"http://127.0.0.1:{port}")


def test_one_log_failing_keeps_the_others_and_says_which(fake, tmp_path):
    pytorchjob(fake)
    fake.fault("500", 2, "/pods/llama-worker-3/log")
    _, got = collect(tmp_path, fake.url)
    status, why = cov(got, "applog")[f"{NS}/pytorchjob-llama-4b1c2"]
    assert status == "error" and "llama-worker-3/pytorch" in why and "1 request(s) failed" in why
    assert set(got.logs.filter(pl.col("source") == "applog")["node"]) == {"gpu-a1", "gpu-a2", "gpu-a3"}


# ------------------------------------------------------------------ verdicts

def test_oomkilled_pod_is_the_culprit_and_a_pods_ready_timeout_is_the_schedulers(fake, tmp_path, ruleset):
    pytorchjob(fake)
    bert_pods_ready_timeout(fake)
    _, got = collect(tmp_path, fake.url)
    diagnoses, _ = diagnose_tables(got.jobs, got.logs, got.coverage, ruleset)
    d = {r["job_id"]: r for r in diagnoses.iter_rows(named=True)}
    llama = d[f"{NS}/pytorchjob-llama-4b1c2"]
    assert llama["outcome"] == "host_oom" and llama["culprit_nodes"] == ["gpu-a2"], llama["root_cause"]
    assert set(llama["affected_nodes"]) >= {"gpu-a1", "gpu-a3", "gpu-a4"} and "gpu-a2" not in llama["affected_nodes"]
    assert llama["action"] == "fix_and_resubmit"  # a workload culprit never drains a node
    bert = d[f"{NS}/pytorchjob-bert-9d8e7"]
    assert bert["outcome"] == "scheduler_preemption_cancel" and bert["culprit_nodes"] == []
    assert any(e["rule_id"] == "kueue.evicted_pods_ready_timeout" for e in json.loads(bert["evidence"]))


def test_a_node_that_went_not_ready_is_the_culprit(fake, tmp_path, ruleset):
    labels = {"jobset.sigs.k8s.io/jobset-name": "sweep"}
    gone = T0 + timedelta(minutes=8)
    for i, n in enumerate(("gpu-c1", "gpu-c2")):
        fake.nodes[n] = node(n) if i == 0 else node(n, "Unknown", gone, "NodeStatusUnknown",
                                                     "Kubelet stopped posting node status.")
        fake.add_pod(pod(NS, f"sweep-w-{i}", n, labels, terminated=terminated("Error", 1, gone + timedelta(minutes=10))),
                     logs={"pytorch": [(gone + timedelta(minutes=9), WD.format(r=0))]} if i == 0 else {})
    fake.events.append(event("default", "Node", "gpu-c2", "NodeNotReady", "Node gpu-c2 status is now: NodeNotReady",
                             gone, type_="Normal", component="node-controller"))
    wl = workload(NS, "jobset-sweep-1a2b3", "JobSet", "sweep", finished_failed(gone + timedelta(minutes=11)), pods=2)
    fake.workloads.append(wl)
    _, got = collect(tmp_path, fake.url)
    diagnoses, _ = diagnose_tables(got.jobs, got.logs, got.coverage, ruleset)
    d = diagnoses.row(0, named=True)
    assert d["outcome"] == "node_failure" and d["culprit_nodes"] == ["gpu-c2"], d["root_cause"]
    assert "gpu-c1" not in d["culprit_nodes"]


def test_kueue_states_are_normalised():
    def state(conds):
        return kueue.normalise({"status": {"conditions": conds}})[:2]
    at = T0
    assert state(finished_failed(at)) == ("FAILED", "Finished:Failed")
    assert state([condition("Finished", "True", "Succeeded", "Job finished successfully", at)])[0] == "COMPLETED"
    for reason, want in [("Preempted", "PREEMPTED"), ("PodsReadyTimeout", "FAILED"), ("InactiveWorkload", "CANCELLED"),
                         ("Deactivated", "CANCELLED"), ("AdmissionCheck", "PREEMPTED"), ("NodeFailures", "NODE_FAIL"),
                         ("MaximumExecutionTimeExceeded", "TIMEOUT")]:
        assert state([condition("Evicted", "True", reason, "", at)]) == (want, f"Evicted:{reason}")
    assert state([condition("Admitted", "True", "Admitted", "", at)])[0] == "RUNNING"
    assert state([condition("QuotaReserved", "False", "Pending", "", at)])[0] == "PENDING"
    # evicted, requeued and admitted again: the eviction is over
    assert state([condition("Evicted", "False", "QuotaReserved", "", at),
                  condition("Admitted", "True", "Admitted", "", at)])[0] == "RUNNING"


# ------------------------------------------------------------------ placements and the warehouse

def test_placements_attribute_a_job_whose_pods_are_gone(fake, tmp_path, ruleset):
    from faultline.fleet.placement import record

    pytorchjob(fake)
    wl = fake.workloads[0]
    fin = wl["status"]["conditions"].pop()  # running: the recorder sees its pods
    data = tmp_path / "data"
    write_config(data, [cluster_cfg(tmp_path, fake.url)])
    cfg = load_config(data)
    first = record(cfg, "kube", now=T0 + timedelta(minutes=3))
    assert first["pods"] == 4 and first["written"] == 4
    assert record(cfg, "kube", now=T0 + timedelta(minutes=4))["written"] == 0  # dedup on re-run
    wl["status"]["conditions"].append(fin)
    for i in range(4):
        fake.delete_pod(NS, f"llama-worker-{i}")
    got = watermark.collect(cfg, "kube", now=T0 + timedelta(hours=1))
    assert got["failed"] == 1
    wh = Warehouse(cfg.warehouse_dir)
    jobs = wh.read("jobs")
    assert jobs["nodes"][0].to_list() == ["gpu-a1", "gpu-a2", "gpu-a3", "gpu-a4"]
    assert sorted(wh.read("allocations")["node"].to_list()) == ["gpu-a1", "gpu-a2", "gpu-a3", "gpu-a4"]
    assert wh.read("placements").height == 4
    again = watermark.collect(cfg, "kube", now=T0 + timedelta(hours=1, minutes=10))
    assert again["jobs"] == 0 and wh.read("placements").height == 4


def test_collect_records_the_placements_it_sees(fake, tmp_path):
    pytorchjob(fake)
    data = tmp_path / "data"
    write_config(data, [cluster_cfg(tmp_path, fake.url)])
    cfg = load_config(data)
    watermark.collect(cfg, "kube", now=T0 + timedelta(hours=1))
    wh = Warehouse(cfg.warehouse_dir)
    placed = wh.read("placements")
    assert sorted(placed["pod"].to_list()) == [f"llama-worker-{i}" for i in range(4)]
    assert dict(zip(placed["pod"], placed["node"]))["llama-worker-1"] == "gpu-a2"
    # a backfill of the same window (placements filed today, after it): the pods gone, nothing changes
    for i in range(4):
        fake.delete_pod(NS, f"llama-worker-{i}")
    again = watermark.collect(cfg, "kube", now=T0 + timedelta(hours=1), start=START, end=T0 + timedelta(hours=1))
    assert again["jobs"] == 0 and wh.read("jobs")["nodes"][0].len() == 4


# ------------------------------------------------------------------ config

def test_config_reports_every_error_at_once(tmp_path):
    data = tmp_path / "data"
    write_config(data, [
        {"name": "k", "kind": "kubernetes", "kubernetes": {"in_cluster": "yes", "page_limit": 0},
         "scheduler": {"kind": "kueue", "namespaces": "team-a"}, "logs": {"kind": "kubernetes", "limit_bytes": -1}},
        {"name": "s", "scheduler": {"kind": "kueue"}},
        {"name": "t", "kind": "mesos", "scheduler": {"kind": "sacct"}}])
    with pytest.raises(ConfigError) as err:
        load_config(data)
    msg = str(err.value)
    for part in ("cluster 'k': scheduler (kind kueue): namespaces must be a list",
                 "cluster 'k': logs (kind kubernetes): limit_bytes must be an integer >= 1",
                 "cluster 'k': kubernetes: in_cluster must be true or false", "page_limit must be an integer >= 1",
                 "cluster 's': scheduler.kind must be one of ('sacct_files', 'sacct', 'slurmrestd')",
                 "cluster 't': kind must be one of ('slurm', 'kubernetes')"):
        assert part in msg, msg
    assert len(msg.splitlines()) == 5



def test_diagnose_one_kubernetes_job_on_demand(fake, tmp_path, ruleset):
    from faultline.fleet.single import JobNotFound, diagnose_one

    pytorchjob(fake)
    data = tmp_path / "data"
    write_config(data, [cluster_cfg(tmp_path, fake.url)])
    cfg = load_config(data)
    d = diagnose_one(cfg, "kube", f"{NS}/pytorchjob-llama-4b1c2", ruleset)
    assert d["outcome"] == "host_oom" and d["culprit"]["nodes"] == ["gpu-a2"]
    assert {c["source"]: c["status"] for c in d["coverage"]}["k8s_event"] == "ok"
    assert Warehouse(cfg.warehouse_dir).read("placements").height == 4
    with pytest.raises(JobNotFound):
        diagnose_one(cfg, "kube", f"{NS}/no-such-workload", ruleset)
    with pytest.raises(JobNotFound, match="<namespace>/<workload>"):
        diagnose_one(cfg, "kube", "12345", ruleset)


def test_the_simulated_kueue_cluster_read_from_its_kubectl_snapshot_scores_right(tmp_path, ruleset):
    from faultline.evaluate import fleet_scores
    from faultline.simulate.kube import kube_cluster_config, simulate_kube

    truth = simulate_kube(tmp_path / "sim", "2025-03-03", seed=3)
    write_config(tmp_path / "data", [kube_cluster_config(tmp_path / "sim")])
    cfg = load_config(tmp_path / "data")
    lo, hi = truth["end_time"].min() - timedelta(hours=1), truth["end_time"].max() + timedelta(hours=1)
    got = collect_cluster(cfg.clusters[0], lo, hi, cfg.margin_minutes)
    assert got.errors == [] and got.jobs.height == truth.height
    diagnoses, _ = diagnose_tables(got.jobs, got.logs, got.coverage, ruleset)
    sc = fleet_scores(diagnoses, truth)
    assert (sc["jobs"], sc["outcome_right"], sc["culprit_right"], sc["wrong_blames"]) == (4, 4, 2, 0), sc
    evicted = diagnoses.filter(pl.col("job_id").str.contains("eval-wait")).row(0, named=True)
    assert evicted["outcome"] == "scheduler_preemption_cancel" and evicted["culprit_nodes"] == []


def _pki(tmp_path):
    """A CA, a server certificate for 127.0.0.1 and a client certificate (CN collector), as PEM bytes."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress

    now = datetime.now(timezone.utc)

    def make(cn, issuer=None, ca=False, san=None):
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        b = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer[0].subject if issuer else name)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(san))]), critical=False)
        cert = b.sign(issuer[1] if issuer else key, hashes.SHA256())
        pem = lambda c, k: (c.public_bytes(serialization.Encoding.PEM),  # noqa: E731
                            k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))
        return cert, key, pem(cert, key)

    ca = make("fake-kube-ca", ca=True)
    server = make("kube-apiserver", (ca[0], ca[1]), san="127.0.0.1")
    user = make("collector", (ca[0], ca[1]))
    return ca[2], server[2], user[2]


def test_tls_with_the_kubeconfigs_ca_data_and_client_certificate(tmp_path):
    import base64
    import ssl

    (ca_pem, _), (srv_crt, srv_key), (cl_crt, cl_key) = _pki(tmp_path)
    for name, data in (("ca.crt", ca_pem), ("srv.crt", srv_crt), ("srv.key", srv_key)):
        (tmp_path / name).write_bytes(data)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "srv.crt", tmp_path / "srv.key")
    tls.load_verify_locations(tmp_path / "ca.crt")
    tls.verify_mode = ssl.CERT_OPTIONAL
    fake = FakeKube(tokens={"x509:collector": {"*"}})
    url = fake.start(tls)
    try:
        fake.add_pod(pod(NS, "p", "gpu-a1", {"app": "a"}))
        b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
        doc = {"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
               "clusters": [{"name": "k", "cluster": {"server": url, "certificate-authority-data": b64(ca_pem)}}],
               "users": [{"name": "u", "user": {"client-certificate-data": b64(cl_crt), "client-key-data": b64(cl_key)}}]}
        (tmp_path / "kc").write_text(yaml.safe_dump(doc))
        c = k8s.KubeClient(k8s.KubeSettings(kubeconfig=str(tmp_path / "kc"), timeout_s=2, retries=0))
        assert [p["metadata"]["name"] for p in c.list(f"/api/v1/namespaces/{NS}/pods")] == ["p"]
        c.close()
        # the same server, a CA that did not sign it: refused, with the reason
        doc["clusters"][0]["cluster"]["certificate-authority-data"] = b64(_pki(tmp_path)[0][0])
        (tmp_path / "kc").write_text(yaml.safe_dump(doc))
        c = k8s.KubeClient(k8s.KubeSettings(kubeconfig=str(tmp_path / "kc"), timeout_s=2, retries=0))
        with pytest.raises(k8s.KubeError, match="CERTIFICATE_VERIFY_FAILED"):
            c.list(f"/api/v1/namespaces/{NS}/pods")
    finally:
        fake.stop()


@pytest.mark.parametrize("fault, reason", [("500", "HTTP 500: InternalError"), ("malformed", "response is not JSON"),
                                           ("forbidden", 'workloads.kueue.x-k8s.io is forbidden: User')])
def test_the_workload_list_failing_fails_the_collect_run_and_commits_nothing(fake, tmp_path, fault, reason):
    pytorchjob(fake)
    token = "good-token"
    if fault == "forbidden":
        token = "pods-only"
        fake.tokens[token] = {"list pods"}
    else:
        fake.fault(fault, 3, "/workloads")
    data = tmp_path / "data"
    write_config(data, [cluster_cfg(tmp_path, fake.url, token)])
    cfg = load_config(data)
    with pytest.raises(k8s.KubeError, match=reason):
        watermark.collect(cfg, "kube", now=T0 + timedelta(hours=1))
    wh = Warehouse(cfg.warehouse_dir)
    assert wh.read("jobs").height == 0 and watermark.cursor(wh, "kube") is None  # the next run reads it all again
    fake.faults.clear()
    if fault != "forbidden":
        assert watermark.collect(cfg, "kube", now=T0 + timedelta(hours=1))["failed"] == 1


def test_a_log_longer_than_limit_bytes_keeps_its_start_and_its_end(fake, tmp_path):
    pytorchjob(fake)
    key = (NS, "llama-worker-0", "pytorch", False)
    fake.logs[key] = [(T0 + timedelta(seconds=i), f"[rank0]: step {i} loss 2.0 " + "x" * 60) for i in range(400)] \
        + [(T0 + timedelta(minutes=15), WD.format(r=0))]
    _, got = collect(tmp_path, fake.url, limit_bytes=4096, tail_lines=50)
    lines = got.logs.filter(pl.col("file") == f"k8s:{NS}/llama-worker-0/pytorch")
    assert lines["line"][0].startswith("[rank0]: step 0 ") and "Watchdog caught" in lines["line"][-1]
    assert lines.height < 120 and not lines.select("ts", "line").is_duplicated().any()
    assert "longer than limit_bytes=4096" in cov(got, "applog")[f"{NS}/pytorchjob-llama-4b1c2"][1]
