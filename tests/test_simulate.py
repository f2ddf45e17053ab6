"""The fleet simulator: layout and formats of docs/fleet.md, determinism, fault proportions, and
whether its logs are realistic enough for the engine to get the verdicts right."""

import json
import re
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
import yaml

from faultline.cli import main
from faultline.evaluate import evaluate
from faultline.simulate import SimConfig, export_cases, simulate
from faultline.simulate.faults import INFRA
from faultline.simulate.fleet import build_clusters, expand_hostlist, hostlist
from faultline.simulate.jobs import build_jobs

SMALL = SimConfig(jobs=400, days=2, clusters=2, seed=3)
STATES = {"COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "CANCELLED", "PREEMPTED"}


@pytest.fixture(scope="module")
def sim(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim")
    simulate(out, SMALL, log=lambda *_: None)
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_same_bytes(sim, tmp_path):
    simulate(tmp_path / "again", SMALL, log=lambda *_: None)
    a, b = _files(sim), _files(tmp_path / "again")
    assert a.keys() == b.keys()
    assert [k for k in a if a[k] != b[k]] == []
    simulate(tmp_path / "other", SimConfig(jobs=400, days=2, clusters=2, seed=4), log=lambda *_: None)
    assert _files(tmp_path / "other")["truth.parquet"] != a["truth.parquet"]


def test_layout(sim):
    fleet = json.loads((sim / "fleet.json").read_text())
    assert fleet["seed"] == 3 and len(fleet["clusters"]) == 2
    ips = [n["ip"] for c in fleet["clusters"] for n in c["nodes"]]
    assert len(ips) == len(set(ips))
    node = fleet["clusters"][0]["nodes"][0]
    assert len(node["gpus"]) == 8 and node["nics"][0]["device"] == "mlx5_0"
    assert fleet["clusters"][0]["lemon_nodes"]
    for c in ("alpha", "bravo"):
        for sub in ("sacct", "loki", "metrics", "node_events"):
            assert list((sim / c / sub).iterdir()), (c, sub)
    truth = pl.read_parquet(sim / "truth.parquet")
    for col in ("cluster", "job_id", "attempt", "state", "outcome", "culprit_nodes", "culprit_ranks", "fault",
                "has_logs"):
        assert col in truth.columns
    assert truth.schema["culprit_nodes"] == pl.List(pl.String) and truth.schema["attempt"] == pl.Int32
    assert truth["job_id"].dtype == pl.String
    assert set(truth["state"]) <= STATES
    m = pl.read_parquet(next((sim / "alpha" / "metrics").iterdir()))
    assert m.columns == ["cluster", "node", "gpu", "name", "ts", "value", "labels"]
    assert "DCGM_FI_DEV_XID_ERRORS" in set(m["name"])
    for p in (sim / "alpha" / "node_events").iterdir():
        for line in p.read_text().splitlines():
            ev = json.loads(line)
            assert set(ev) == {"node", "ts", "kind", "reason"}
            assert ev["kind"] in ("drain", "node_fail", "not_ready", "resume")


def test_sacct_is_pipe_format_with_hostlists(sim):
    header = "JobID|JobName|User|Partition|State|ExitCode|Submit|Start|End|NNodes|NodeList|AllocTRES"
    seen = 0
    for p in sorted((sim / "alpha" / "sacct").iterdir()):
        lines = p.read_text().splitlines()
        assert lines[0] == header
        for line in lines[1:]:
            f = dict(zip(header.split("|"), line.split("|")))
            assert len(line.split("|")) == 12
            assert re.fullmatch(r"\d+", f["JobID"])
            assert re.fullmatch(r"\d+:\d+", f["ExitCode"])
            assert f["State"] in STATES or re.fullmatch(r"CANCELLED by \d+", f["State"])
            assert re.fullmatch(r"gpu-a-(\d{4}|\[\d{4}(-\d{4})?(,\d{4}(-\d{4})?)*\])", f["NodeList"])
            assert len(expand_hostlist(f["NodeList"])) == int(f["NNodes"])
            assert f["Start"] <= f["End"] and p.stem == f["End"][:10]
            assert f"node={f['NNodes']}" in f["AllocTRES"]
            seen += 1
    assert seen > 50


def test_hostlist_round_trip():
    assert hostlist("gpu-a-", [(0, 4), (6, 1)]) == "gpu-a-[0001-0004,0007]"
    assert hostlist("gpu-a-", [(16, 1)]) == "gpu-a-0017"
    assert expand_hostlist("gpu-a-[0001-0003,0007]") == ["gpu-a-0001", "gpu-a-0002", "gpu-a-0003", "gpu-a-0007"]


def _loki(sim: Path) -> dict[tuple[str, str], set[str]]:
    """(job_id, attempt) -> sources present, validating every response on the way."""
    got: dict[tuple[str, str], set[str]] = {}
    for c in ("alpha", "bravo"):
        for p in sorted((sim / c / "loki").iterdir()):
            for raw in p.read_text().splitlines():
                resp = json.loads(raw)
                assert resp["status"] == "success" and resp["data"]["resultType"] == "streams"
                assert 1 <= len(resp["data"]["result"]) <= 8
                for s in resp["data"]["result"]:
                    assert set(s["stream"]) == {"cluster", "job_id", "attempt", "node", "source"}
                    assert s["stream"]["cluster"] == c and s["stream"]["source"] in ("applog", "syslog")
                    ts = [int(v[0]) for v in s["values"]]
                    assert ts == sorted(ts) and all(len(v) == 2 and isinstance(v[1], str) for v in s["values"])
                    assert all(len(v[0]) == 19 for v in s["values"])  # unix ns as a string
                    got.setdefault((s["stream"]["job_id"], s["stream"]["attempt"]), set()).add(s["stream"]["source"])
    return got


def test_every_failed_job_has_logs_unless_marked_missing(sim):
    got = _loki(sim)
    truth = pl.read_parquet(sim / "truth.parquet")
    failed = truth.filter(pl.col("state") != "COMPLETED")
    assert failed.height > 30 and failed["has_logs"].all()
    for r in failed.iter_rows(named=True):
        sources = got.get((r["job_id"], str(r["attempt"])), set())
        assert "applog" in sources, r
        assert ("syslog" in sources) == (not r["missing"].startswith("syslog")), r
    healthy_logged = truth.filter((pl.col("state") == "COMPLETED") & pl.col("has_logs"))
    assert all((r["job_id"], str(r["attempt"])) in got for r in healthy_logged.iter_rows(named=True))
    assert truth.filter((pl.col("state") == "COMPLETED") & ~pl.col("has_logs")).height > 200


def test_line_prefixes_are_what_real_systems_print(sim):
    lines = []
    for raw in (next((sim / "alpha" / "loki").iterdir())).read_text().splitlines():
        for s in json.loads(raw)["data"]["result"]:
            lines += [(s["stream"]["source"], s["stream"]["node"], v[1]) for v in s["values"]]
    syslog = [x for x in lines if x[0] == "syslog"]
    assert syslog and all(re.match(r"^[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} " + re.escape(n) + r" (kernel|slurmd\[\d+\]):", t)
                          for _, n, t in syslog)
    app = [t for src, _, t in lines if src == "applog"]
    assert any(re.match(r"^\[rank\d+\]:\[[EW]\d{3,4} \d{2}:\d{2}:\d{2}\.\d{9} ProcessGroupNCCL", t) for t in app) or \
        any(re.match(r"^\d+: \[E ProcessGroupNCCL\.cpp:\d+\]", t) for t in app)
    assert any(re.match(r"^(\d+: )?gpu-a-\d{4}:\d+:\d+ \[\d\] NCCL INFO Bootstrap : Using eth0:10\.\d+\.\d+\.\d+<0>$", t)
               for t in app)


def test_fault_proportions_follow_llama3():
    cfg = SimConfig(jobs=5000, days=7, clusters=2, seed=11)
    jt = build_jobs(cfg, build_clusters(2, cfg.nodes_per_cluster, __import__("numpy").random.default_rng(0),
                                        ("gpu_faulty",), 0.005))
    c = jt.cols
    first = c["attempt"] == 0
    faults = Counter(str(f) for f in c["fault"][first])
    n = int(first.sum())
    assert 0.70 < faults["none"] / n < 0.85  # most jobs complete
    infra = {f.name: f.weight / sum(x.weight for x in INFRA) for f in INFRA}
    n_infra = sum(faults[f] for f in infra)
    assert 0.03 < n_infra / n < 0.08
    for name, share in (("gpu_faulty", 148 / 419), ("gpu_hbm", 72 / 419), ("software_bug", 54 / 419)):
        assert abs(faults[name] / n_infra - share) < 0.09, (name, faults[name] / n_infra, share)
    for name in ("timeout", "cancelled", "preempted", "config_error", "cuda_oom", "user_exception"):
        assert faults[name] > 0
    sizes = c["nnodes"][first]
    assert (sizes <= 4).mean() > 0.5 and sizes.max() >= 512  # heavy-tailed
    assert len(set(c["job_id"].tolist())) == n  # requeues share their job id


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cases")
    export_cases(out, SimConfig(jobs=3000, days=5, seed=0), limit=36, log=lambda *_: None)
    return out


def test_exported_cases_are_eval_folders(cases):
    dirs = sorted(p for p in cases.iterdir() if p.is_dir())
    assert len(dirs) >= 36
    for d in dirs:
        truth = yaml.safe_load((d / "truth.yaml").read_text())
        assert {"outcome_category", "culprit", "root_cause", "notes", "state"} <= set(truth)
        assert truth["culprit"] is None or re.match(r"^(node|rank) ", truth["culprit"])
        nodes = [p for p in d.iterdir() if p.is_dir()]
        assert nodes and all(re.fullmatch(r"gpu-[a-z]-\d{4}", p.name) for p in nodes)
        for sl in d.glob("*/syslog.log"):
            assert all(re.match(r"^[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} " + sl.parent.name + " ", x)
                       for x in sl.read_text().splitlines())


def test_engine_gets_the_simulated_verdicts_right(cases, ruleset):
    results = evaluate(cases, ruleset)
    n = len(results)
    right = sum(r.outcome_right for r in results)
    wrong = [r for r in results if r.wrong_blame]
    misses = [(r.case, r.truth_outcome, r.outcome) for r in results if not r.outcome_right]
    assert right / n >= 0.85, misses
    assert wrong == [], wrong
    with_culprit = [r for r in results if r.culprit_right is not None]
    assert sum(bool(r.culprit_right) for r in with_culprit) / len(with_culprit) >= 0.7


def test_cli_simulate(tmp_path, capsys):
    assert main(["simulate", "--out", str(tmp_path / "s"), "--jobs", "60", "--days", "1", "--clusters", "1",
                 "--seed", "5", "--start", "2024-06-01"]) == 0
    assert "job attempts" in capsys.readouterr().out
    assert (tmp_path / "s" / "truth.parquet").exists()
    assert (tmp_path / "s" / "alpha" / "sacct").is_dir()
    assert main(["simulate", "--export-cases", str(tmp_path / "c"), "--limit", "3", "--jobs", "300",
                 "--days", "2", "--seed", "5"]) == 0
    assert len(list((tmp_path / "c").glob("*/truth.yaml"))) >= 3
    assert not (tmp_path / "s2").exists()
