"""Trend tables over synthetic `diagnoses` frames (schema of faultline.warehouse.schema)."""

from __future__ import annotations

import json
import random
from datetime import date, datetime, timedelta, timezone

import polars as pl
import pytest

from faultline.report import trends
from faultline.warehouse.schema import TABLES

T0 = datetime(2024, 3, 21, 10, 0, tzinfo=timezone.utc)


# --------------------------------------------------------------------------- builders

def diag_row(**kw) -> dict:
    """One `diagnoses` row with defaults; candidates/evidence/coverage may be Python objects."""
    row = dict(cluster="c1", job_id="1", attempt=0, ruleset="rs1", outcome="gpu_hardware", domain="hardware",
               root_cause="", culprit_nodes=[], culprit_ranks=[], culprit_gpus=[], affected_nodes=[],
               ambiguous=False, confidence="high", confidence_reason="", action="no_action", action_targets=[],
               candidates=[], evidence=[], coverage=[], queue="q1", end_time=T0, num_nodes=1, num_gpus=8,
               gpu_hours=1.0, diagnosed_at=datetime(2024, 3, 30, tzinfo=timezone.utc), diagnosis="{}")
    row.update(kw)
    for k in ("candidates", "evidence", "coverage"):
        if not isinstance(row[k], str):
            row[k] = json.dumps(row[k])
    return row


def frame(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=TABLES["diagnoses"])


def from_diagnosis(v: dict, **extra) -> dict:
    """A diagnosis JSON object (faultline diagnose / demo) as a `diagnoses` row."""
    act = v.get("recommended_action") or {}
    return diag_row(
        cluster=v["cluster"], job_id=v["job_id"], attempt=v["attempt"], ruleset=v["ruleset"]["version"],
        outcome=v["outcome"], domain=v["domain"], root_cause=v["root_cause"],
        culprit_nodes=v["culprit"]["nodes"], culprit_ranks=v["culprit"]["ranks"], culprit_gpus=v["culprit"]["gpus"],
        affected_nodes=v["affected"]["nodes"], ambiguous=v["ambiguous"], confidence=v["confidence"],
        confidence_reason=v["confidence_reason"], action=act.get("action"), action_targets=act.get("targets", []),
        candidates=v["candidates"], evidence=v["evidence"], coverage=v["coverage"],
        diagnosed_at=datetime.fromisoformat(v["diagnosed_at"].replace("Z", "+00:00")),
        diagnosis=json.dumps(v, sort_keys=True), **extra)


def ev(line: str, node: str | None = None, role: str = "root", rule_id: str = "r.x", **kw) -> dict:
    return {"rule_id": rule_id, "symptom": rule_id.split(".")[-1], "role": role, "source": "applog",
            "node": node, "rank": None, "gpu": None, "ts": None, "file": "f", "line_no": 1, "line": line, **kw}


def cov(**status) -> list[dict]:
    return [{"source": s, "status": st, "rows": 10 if st == "ok" else 0, "reason": ""} for s, st in status.items()]


_LINES = {
    "gpu_hardware": ("hardware", "root", "nvidia.xid",
                     "[Thu Mar 21 10:02:00 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, "
                     "GPU has fallen off the bus."),
    "network_ib": ("network", "root", "nccl.ib_async_event",
                   "{node}:4004:4100 [0] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : port error"),
    "nvlink": ("hardware", "root", "nvidia.xid", "NVRM: Xid (PCI:0000:ba:00): 74, pid=1911, NVLink: fatal error"),
    "node_failure": ("infrastructure", "root", "slurm.node_fail",
                     "slurmstepd: error: *** JOB {job} ON {node} CANCELLED AT 2024-03-21T10:00:00 DUE TO NODE FAILURE"),
    "cuda_oom": ("workload", "root", "pytorch.cuda_oom",
                 "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    "user_code_error": ("software", "root", "python.traceback",
                        "KeyError: 'input_ids'  (File \"train.py\", line 212, in collate)"),
    "nccl_timeout_hang": ("unknown", "cascade", "nccl.watchdog_timeout",
                          "[rank3]:[E321 10:12:08] Watchdog caught collective operation timeout: "
                          "WorkNCCL(SeqNum=1580)"),
    "storage_io": ("infrastructure", "root", "storage.stale_handle",
                   "OSError: [Errno 116] Stale file handle: '/lustre/ckpt/step_12000'"),
    "scheduler_timelimit": ("scheduler", "root", "slurm.timelimit",
                            "*** JOB {job} ON {node} CANCELLED AT 2024-03-21T10:00:00 DUE TO TIME LIMIT ***"),
    "host_oom": ("workload", "root", "kernel.oom_kill",
                 "Out of memory: Killed process 8812 (python) total-vm:912312kB"),
    "healthy": ("unknown", "context", "nccl.init_chatter", "NCCL INFO NET/Plugin: Could not find: libnccl-net.so"),
}


def synthetic_fleet(seed: int = 7, days: int = 14, jobs_per_day: int = 24) -> pl.DataFrame:
    """A deterministic two-cluster fleet: mixed outcomes, two lemon nodes, some ambiguous verdicts,
    patchy syslog coverage, and one log line that tries to inject a script."""
    rnd = random.Random(seed)
    weights = {"nccl_timeout_hang": 9, "cuda_oom": 8, "user_code_error": 10, "gpu_hardware": 2, "network_ib": 2,
               "node_failure": 1, "storage_io": 2, "scheduler_timelimit": 6, "host_oom": 2, "nvlink": 1, "healthy": 4}
    outs, w = list(weights), list(weights.values())
    lemon_nodes = {("alpha", "alpha-gpu017"): "gpu_hardware", ("beta", "beta-gpu042"): "network_ib"}
    rows, n = [], 0
    for day in range(days):
        for j in range(jobs_per_day):
            n += 1
            strike = day % 2 == 0 and j in (1, 2)  # the lemons strike every other day
            cluster = ("alpha" if j == 1 else "beta") if strike else rnd.choice(["alpha", "alpha", "beta"])
            queue = rnd.choice(["train", "train", "research", "eval"])
            nn = rnd.choice([1, 2, 4, 8, 16])
            nodes = sorted(rnd.sample([f"{cluster}-gpu{i:03d}" for i in range(1, 129)], nn))
            outcome = rnd.choices(outs, w)[0]
            end = T0 + timedelta(days=day, minutes=rnd.randint(0, 1439))
            hours = round(nn * 8 * rnd.uniform(0.2, 12), 1)
            lemon = [(c, nd) for (c, nd), o in lemon_nodes.items() if c == cluster]
            if strike:
                outcome = lemon_nodes[lemon[0]]
                nodes = sorted(set(nodes[:-1]) | {lemon[0][1]})
                culprit = [lemon[0][1]]
            else:
                no_culprit = outcome in ("scheduler_timelimit", "healthy", "nccl_timeout_hang")
                culprit = [] if no_culprit else [rnd.choice(nodes)]
            domain, role, rule, text = _LINES[outcome]
            ambiguous = outcome in ("network_ib", "nccl_timeout_hang", "node_failure") and rnd.random() < 0.25 \
                and not strike
            cnode = culprit[0] if culprit else rnd.choice(nodes)
            other = rnd.choice([x for x in nodes if x != cnode] or nodes)
            line = text.format(node=cnode, job=f"{100000 + n}")
            evidence = [ev(line, cnode, role, rule)]
            if nn > 1:
                evidence.append(ev(_LINES["nccl_timeout_hang"][3], other, "cascade", "nccl.watchdog_timeout"))
            candidates = []
            if ambiguous:
                candidates = [
                    {"outcome": outcome, "domain": domain, "culprit": {"nodes": [cnode], "ranks": [], "gpus": []},
                     "priority": 10, "evidence": [evidence[0]]},
                    {"outcome": "node_failure", "domain": "infrastructure",
                     "culprit": {"nodes": [other], "ranks": [], "gpus": []}, "priority": 10, "evidence": []},
                ]
                culprit = []
            syslog = rnd.choices(["ok", "empty", "error"], [80, 15, 5])[0]
            rows.append(diag_row(
                cluster=cluster, job_id=str(100000 + n), attempt=1 if rnd.random() < 0.05 else 0, outcome=outcome,
                domain=domain, culprit_nodes=culprit, affected_nodes=[x for x in nodes if x not in culprit],
                ambiguous=ambiguous, confidence="low" if ambiguous else "high",
                confidence_reason="more than one cause fits" if ambiguous else "a specific root-cause signature",
                evidence=evidence, candidates=candidates, queue=queue, end_time=end, num_nodes=nn,
                num_gpus=nn * 8, gpu_hours=hours,
                coverage=cov(applog="ok", syslog=syslog, scheduler="ok", k8s_event="not_configured")))
    # a log line that tries to run a script, in an ambiguous verdict and in a lemon's evidence
    rows.append(diag_row(cluster="alpha", job_id="evil-1", queue="train", outcome="network_ib", domain="network",
                         ambiguous=True,
                         confidence="low", affected_nodes=["alpha-gpu009"], end_time=T0 + timedelta(days=days - 1),
                         evidence=[ev("<script>alert(1)</script> NET/IB : port error", "alpha-gpu009")],
                         candidates=[{"outcome": "network_ib", "domain": "network",
                                      "culprit": {"nodes": ["alpha-gpu009"], "ranks": [], "gpus": []},
                                      "priority": 5, "evidence": [ev("<script>alert(1)</script>", "alpha-gpu009")]}],
                         coverage=cov(applog="ok", syslog="ok", scheduler="ok", k8s_event="not_configured")))
    rows.append(diag_row(cluster="alpha", job_id="evil-2", queue="train", outcome="gpu_hardware", domain="hardware",
                         culprit_nodes=["alpha-gpu017"], end_time=T0 + timedelta(days=days - 1, hours=2),
                         evidence=[ev("<script>alert(1)</script> Xid 79", "alpha-gpu017")],
                         coverage=cov(applog="ok", syslog="ok", scheduler="ok", k8s_event="not_configured")))
    return frame(rows)


# --------------------------------------------------------------------------- tests

def test_demo_diagnoses_convert(tmp_path, ruleset, capsys):
    """The verdicts of the worked examples (`faultline demo`) as a diagnoses frame."""
    from faultline.demo import run_demo

    run_demo(ruleset, tmp_path, show=None)
    demo = tmp_path / "demo" / "diagnoses.jsonl"
    if not demo.exists():
        pytest.skip("the demo no longer writes demo/diagnoses.jsonl")
    d = frame([from_diagnosis(json.loads(x), end_time=T0) for x in demo.read_text().splitlines() if x.strip()])
    nd = trends.node_day(d)
    assert nd.schema == pl.Schema(TABLES["trends_node_day"])
    # the Xid 79 job blames gpu003 (hardware); the CUDA OOM blames a node, but of the workload domain
    assert trends.culprit_counts(d)["node"].to_list() == ["gpu002", "gpu003"]
    assert "gpu001" in trends.culprit_counts(d, domains=None)["node"].to_list()


def test_node_day_counts_and_ambiguous_excluded():
    d = frame([
        diag_row(job_id="1", culprit_nodes=["n1"], affected_nodes=["n2", "n3"]),
        diag_row(job_id="2", culprit_nodes=["n1", "n1"], affected_nodes=["n2"], outcome="nvlink"),
        # ambiguous: even if a writer left a culprit in, it never counts
        diag_row(job_id="3", culprit_nodes=["n1"], affected_nodes=["n2"], ambiguous=True, outcome="network_ib"),
        diag_row(job_id="4", culprit_nodes=["n1"], end_time=T0 + timedelta(days=1), outcome="cuda_oom",
                 domain="workload"),
        diag_row(job_id="5", cluster="c2", culprit_nodes=["n1"]),
    ])
    nd = trends.node_day(d)
    assert nd.schema == pl.Schema(TABLES["trends_node_day"])
    got = {(r["cluster"], r["date"], r["node"]): r for r in nd.iter_rows(named=True)}
    day = T0.date()
    n1 = got[("c1", day, "n1")]
    assert (n1["times_culprit"], n1["times_affected"], n1["symptoms"]) == (2, 0, 0)
    assert n1["outcomes"] == ["gpu_hardware", "nvlink"]
    assert got[("c1", day, "n2")]["times_affected"] == 3 and got[("c1", day, "n2")]["times_culprit"] == 0
    assert got[("c1", day, "n2")]["outcomes"] == []
    assert got[("c1", day + timedelta(days=1), "n1")]["times_culprit"] == 1
    assert got[("c2", day, "n1")]["times_culprit"] == 1
    assert nd.height == 5


def test_node_day_symptoms_joined_to_job_day_and_ruleset():
    d = frame([diag_row(job_id="1", culprit_nodes=["n1"], affected_nodes=["n2"])])
    sym = pl.DataFrame([
        {"cluster": "c1", "job_id": "1", "attempt": 0, "ruleset": "rs1", "node": "n1"},
        {"cluster": "c1", "job_id": "1", "attempt": 0, "ruleset": "rs1", "node": "n1"},
        {"cluster": "c1", "job_id": "1", "attempt": 0, "ruleset": "rs1", "node": "n2"},
        {"cluster": "c1", "job_id": "1", "attempt": 0, "ruleset": "OTHER", "node": "n2"},  # other ruleset
        {"cluster": "c1", "job_id": "9", "attempt": 0, "ruleset": "rs1", "node": "n9"},  # job not diagnosed
        {"cluster": "c1", "job_id": "1", "attempt": 0, "ruleset": "rs1", "node": None},
    ], schema={c: TABLES["symptoms"][c] for c in ("cluster", "job_id", "attempt", "ruleset", "node")})
    nd = trends.node_day(d, sym)
    assert dict(zip(nd["node"], nd["symptoms"])) == {"n1": 2, "n2": 1}


def test_outcome_day_and_gpu_hours():
    d = frame([
        diag_row(job_id="1", gpu_hours=10.0),
        diag_row(job_id="2", gpu_hours=2.5),
        diag_row(job_id="3", gpu_hours=4.0, ambiguous=True, outcome="network_ib"),
        diag_row(job_id="4", gpu_hours=None, outcome="network_ib"),
        diag_row(job_id="5", gpu_hours=7.0, outcome="healthy"),
        diag_row(job_id="6", gpu_hours=1.0, queue="q2"),
        diag_row(job_id="7", gpu_hours=3.0, end_time=None,
                 diagnosed_at=datetime(2024, 3, 25, 1, tzinfo=timezone.utc)),  # no end: day of diagnosis
    ])
    od = trends.outcome_day(d)
    assert od.schema == pl.Schema(TABLES["trends_outcome_day"])
    got = {(r["date"], r["queue"], r["outcome"]): (r["jobs"], r["gpu_hours_lost"], r["ambiguous"])
           for r in od.iter_rows(named=True)}
    day = T0.date()
    assert got[(day, "q1", "gpu_hardware")] == (2, 12.5, 0)
    assert got[(day, "q1", "network_ib")] == (2, 4.0, 1)
    assert got[(day, "q1", "healthy")] == (1, 0.0, 0)
    assert got[(day, "q2", "gpu_hardware")] == (1, 1.0, 0)
    assert got[(date(2024, 3, 25), "q1", "gpu_hardware")] == (1, 3.0, 0)
    by = trends.gpu_hours_lost_by_outcome(d)
    assert by["outcome"].to_list() == ["gpu_hardware", "network_ib", "healthy"]
    assert by["gpu_hours_lost"].to_list() == [16.5, 4.0, 0.0]
    assert by["jobs"].to_list() == [4, 2, 1]
    assert by["share"].sum() == pytest.approx(1.0)
    assert trends.headline(d)["gpu_hours_lost"] == pytest.approx(20.5)


def _lemon_frame(n_culprit: int, **kw) -> pl.DataFrame:
    return frame([diag_row(job_id=f"j{i}", culprit_nodes=["bad"], affected_nodes=["ok1"],
                           end_time=T0 + timedelta(hours=i),
                           evidence=[ev("cascade on ok1", "ok1", "cascade"), ev(f"Xid 79 job {i}", "bad")], **kw)
                  for i in range(n_culprit)])


@pytest.mark.parametrize("n,k,expect", [(2, 3, False), (3, 3, True), (4, 3, True), (1, 1, True)])
def test_lemon_threshold_boundary(n, k, expect):
    lem = trends.lemons(_lemon_frame(n), window_days=7, k=k)
    assert (lem.height == 1) is expect
    if expect:
        r = lem.row(0, named=True)
        assert r["node"] == "bad" and r["times_culprit"] == n
        assert r["job_ids"] == [f"j{i}" for i in range(n)]
        assert r["outcomes"] == ["gpu_hardware"] * n
        # the line on the culprit node, not the first (cascade) line of the job
        assert r["evidence"] == [f"Xid 79 job {i}" for i in range(n)]
        assert r["first_seen"] == T0 and r["last_seen"] == T0 + timedelta(hours=n - 1)


def test_lemons_exclude_ambiguous_workload_and_out_of_window():
    base = _lemon_frame(2)
    extra = frame([
        diag_row(job_id="amb", culprit_nodes=["bad"], ambiguous=True, end_time=T0 + timedelta(hours=5)),
        diag_row(job_id="oom", culprit_nodes=["bad"], outcome="cuda_oom", domain="workload",
                 end_time=T0 + timedelta(hours=6)),
        diag_row(job_id="old", culprit_nodes=["bad"], end_time=T0 - timedelta(days=8)),
    ])
    d = pl.concat([base, extra])
    assert trends.lemons(d, window_days=7, k=3).height == 0
    # widen the window: the old job now counts
    assert trends.lemons(d, window_days=9, k=3)["job_ids"].to_list() == [["old", "j0", "j1"]]
    # the workload culprit counts only when asked for every domain
    assert trends.lemons(d, 7, 3, domains=("hardware", "workload")).height == 1
    # `now` pins the window end
    assert trends.lemons(d, 7, 2, now=T0 - timedelta(days=1)).height == 0


def test_lemons_evidence_fallback_and_empty():
    d = frame([diag_row(job_id=str(i), culprit_nodes=["bad"], 
                        evidence=[ev("only line", "other", "cascade")] if i else []) for i in range(3)])
    lem = trends.lemons(d, 7, 3)
    assert lem.row(0, named=True)["evidence"] == [None, "only line", "only line"]
    empty = trends.lemons(frame([]), 7, 3)
    assert empty.height == 0 and "job_ids" in empty.columns


def test_current_keeps_one_verdict_per_job():
    d = frame([
        diag_row(job_id="1", ruleset="old", outcome="unknown", diagnosed_at=datetime(2024, 3, 22, tzinfo=timezone.utc)),
        diag_row(job_id="1", ruleset="new", outcome="gpu_hardware",
                 diagnosed_at=datetime(2024, 3, 23, tzinfo=timezone.utc)),
        diag_row(job_id="1", attempt=1, ruleset="old"),
    ])
    cur = trends.current(d)
    assert cur.height == 2
    assert cur.filter(pl.col("attempt") == 0)["outcome"].to_list() == ["gpu_hardware"]
    assert trends.current(d, ruleset="old").height == 2


def test_coverage_summary_counts_missing_as_not_configured():
    d = frame([
        diag_row(job_id="1", coverage=cov(applog="ok", syslog="error")),
        diag_row(job_id="2", coverage=cov(applog="empty")),
        diag_row(job_id="3", coverage=[]),
    ])
    c = {r["source"]: r for r in trends.coverage_summary(d).iter_rows(named=True)}
    assert (c["applog"]["ok"], c["applog"]["empty"], c["applog"]["not_configured"]) == (1, 1, 1)
    assert (c["syslog"]["error"], c["syslog"]["not_configured"]) == (1, 2)
    assert c["syslog"]["error_share"] == pytest.approx(1 / 3)


def test_ambiguous_review_lists_candidates():
    d = synthetic_fleet()
    amb = trends.ambiguous_review(d)
    assert amb.height == d["ambiguous"].sum() > 0
    evil = amb.filter(pl.col("job_id") == "evil-1").row(0, named=True)
    assert evil["candidates"][0]["nodes"] == ["alpha-gpu009"]
    assert evil["candidates"][0]["line"] == "<script>alert(1)</script>"


def test_synthetic_fleet_lemons():
    d = synthetic_fleet()
    lem = trends.lemons(d, window_days=14, k=3)
    assert {"alpha-gpu017", "beta-gpu042"} <= set(lem["node"])
    assert trends.outcome_day(d)["jobs"].sum() == d.height


def test_the_drain_reset_list_names_node_action_why_evidence_and_state():
    import datetime as _dt
    import json as _json

    from faultline.report import actions as _t

    utc = _dt.timezone.utc
    t = lambda h: _dt.datetime(2025, 3, 3, h, tzinfo=utc)  # noqa: E731
    ev = lambda node: _json.dumps([{"rule_id": "nvidia.xid79", "role": "root", "node": node, "line": f"{node} kernel: NVRM: Xid 79"}])  # noqa: E731
    d = pl.DataFrame({
        "cluster": ["a"] * 4, "job_id": ["1", "2", "3", "4"], "attempt": [0] * 4,
        "outcome": ["gpu_hardware", "gpu_hardware", "gpu_hardware", "user_code_error"],
        "root_cause": ["Xid 48", "Xid 79 on GPU 3", "Xid 79", "traceback"], "ambiguous": [False, False, False, False],
        "action": ["reset_gpu", "drain_node", "drain_node", "fix_and_resubmit"],
        "action_targets": [["n1"], ["n1"], ["n2"], []], "evidence": [ev("n1"), ev("n1"), ev("n2"), "[]"],
        "end_time": [t(1), t(5), t(6), t(7)], "diagnosed_at": [t(8)] * 4})
    events = pl.DataFrame({"cluster": ["a", "a"], "node": ["n2", "n2"], "ts": [t(6), t(7)],
                           "kind": ["drain", "resume"], "reason": ["xid", "repaired"]})
    act = _t.actions(d, pl.DataFrame({"cluster": ["a"], "node": ["n1"], "ts": [t(0)], "kind": ["drain"], "reason": ["old"]}))
    r = act.row(0, named=True)
    assert (r["node"], r["action"], r["jobs"], r["drain_node"], r["reset_gpu"]) == ("n1", "drain_node", 2, 1, 1)
    assert r["why"] == "Xid 79 on GPU 3" and r["evidence"] == "n1 kernel: NVRM: Xid 79"
    assert (r["first_seen"], r["last_seen"], r["state"]) == (t(1), t(5), "not drained")  # its drain was before
    assert _t.actions(d, events).filter(pl.col("node") == "n2")["state"].to_list() == ["back in service"]
    assert _t.actions(d)["state"].to_list() == ["no node events"] * 2
