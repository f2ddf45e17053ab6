"""A live Loki as a log source (`logs: {kind: loki, url: ...}`), against the protocol-faithful fake of
tests/loki_fake.py: paging over shared timestamps, LogQL escaping, retries, per-job failures in coverage,
truncation, tenants and auth, and the same verdicts as the saved-export path over the same data."""

import base64
import json
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import polars as pl
import pytest

from faultline.collectors import loki
from faultline.collectors.loki_http import LokiClient
from faultline.collectors.slurm import parse_sacct
from faultline.fleet import loki_jobs
from faultline.fleet.collect import collect_cluster, coverage_rows, parse_logs
from faultline.fleet.config import ConfigError, load_config, write_config
from faultline.simulate import SimConfig, simulate

from .fleet_fixture import END, START, write_sim
from .loki_fake import FakeLoki, go_unquote, parse_logql

T0 = 1_763_600_000_000_000_000  # 2025-11-20T00:53:20Z in ns
SEC = 1_000_000_000


@pytest.fixture
def fake():
    with FakeLoki() as f:
        yield f


def settings(fake: FakeLoki, **kw) -> loki.LokiSettings:
    return loki.LokiSettings.from_config({"kind": "loki", "url": fake.url, "backoff_s": 0.01, "timeout_s": 5, **kw})


def key(labels: dict) -> str:
    return loki.stream_key(labels)


def truth(fake: FakeLoki, query: str, start: int, end: int, **kw) -> Counter:
    return Counter((key(l), ns, line) for l, ns, line in fake.select(query, start, end, **kw))


def fetched(res) -> Counter:
    return Counter(zip(res.lines["stream"], res.lines["ns"], res.lines["line"]))


def jobs_frame(rows: list[str]) -> pl.DataFrame:
    """Failed Slurm jobs from sacct rows (JobID|...|NodeList|AllocTRES)."""
    head = "JobID|JobName|User|Partition|State|ExitCode|Submit|Start|End|NNodes|NodeList|AllocTRES\n"
    jobs, _ = parse_sacct(head + "\n".join(rows) + "\n", "alpha")
    return jobs


def ns_of(iso: str) -> int:
    return int(datetime.fromisoformat(iso).replace(tzinfo=timezone.utc).timestamp()) * SEC


# ------------------------------------------------------------------ the fake speaks Loki
def test_fake_follows_the_documented_query_range_semantics(fake):
    fake.push({"job": "x", "node": "a"}, [(T0 + i * SEC, f"line {i}") for i in range(10)])
    get = lambda **p: httpx.get(f"{fake.url}/loki/api/v1/query_range", params=p)  # noqa: E731
    assert httpx.get(f"{fake.url}/ready").status_code == 200
    # start inclusive, end exclusive; forward = oldest first
    r = get(query='{job="x"}', start=T0 + 2 * SEC, end=T0 + 5 * SEC, limit=100, direction="forward").json()
    assert r["status"] == "success" and r["data"]["resultType"] == "streams"
    assert [v[1] for v in r["data"]["result"][0]["values"]] == ["line 2", "line 3", "line 4"]
    # default direction is backward: the newest `limit` lines, newest first; RFC3339 and epoch seconds accepted
    r = get(query='{job="x"}', start="2025-11-20T00:53:20Z", end=str((T0 + 10 * SEC) // SEC), limit=2).json()
    assert [v[1] for v in r["data"]["result"][0]["values"]] == ["line 9", "line 8"]
    r = get(query='{job="x"}', start=T0, end=T0 + SEC * 100, limit=6000)
    assert (r.status_code, r.text.strip()) == (
        400, "max entries limit per query exceeded, limit > max_entries_limit (6000 > 5000)")
    r = get(query='{job="x",}', start=T0, end=T0 + SEC)
    assert r.status_code == 400 and r.text.startswith("parse error at line 1, col 10: syntax error")
    assert get(query='{job=~".*"}', start=T0, end=T0 + SEC).text.startswith("queries require at least one")
    assert get(query='{job="x", node!="y"} |= "line 3"', start=T0, end=T0 + 10 * SEC, direction="forward").json()[
        "data"]["result"][0]["values"] == [[str(T0 + 3 * SEC), "line 3"]]
    assert parse_logql('{a=~"x|y", b!~`z.*`} != "q"') == ([("a", "=~", "x|y"), ("b", "!~", "z.*")], [("!=", "q")])


# ------------------------------------------------------------------ paging
def test_paging_over_lines_sharing_a_nanosecond_loses_and_repeats_nothing():
    """Pages of 1000 over 5.2k lines in three streams, with clumps of one nanosecond that straddle page
    boundaries, the same text in several streams at one instant (which logcli's line-only check would
    drop), and equal timestamps returned in a different order on every request."""
    with FakeLoki(shuffle_ties=True, seed=7) as f:
        ts, t = [], T0
        for i in range(5200):
            clump = 900 <= i < 1250 or 2990 <= i < 3010 or 4000 <= i < 4999
            t += 0 if clump and i not in (900, 2990, 4000) else 1000
            ts.append(t)
        for s, node in enumerate(("gpu001", "gpu002", "gpu003")):
            f.push({"cluster": "alpha", "job_id": "7", "node": node},
                   [(n, f"tick {i % 40}") for i, n in enumerate(ts) if i % 3 == s])
        f.push({"cluster": "alpha", "job_id": "8", "node": "gpu001"}, [(n, "other job") for n in ts[:500]])
        query, start, end = '{cluster="alpha", job_id="7"}', T0, ts[-1] + 1
        with LokiClient(settings(f, page_limit=1000)) as c:
            res = c.fetch(query, start, end, 10**6)
        want = truth(f, query, start, end)
        assert sum(want.values()) == 5200
        assert fetched(res) == want  # exactly: none lost, none twice
        assert res.notes == [] and not res.truncated
        reqs = f.query_requests()
        assert len(reqs) >= 6 and {r["params"]["direction"] for r in reqs} == {"forward"}
        assert {r["params"]["limit"] for r in reqs} == {"1000"}
        # every page but the first starts at the previous page's last nanosecond
        assert [int(r["params"]["start"]) for r in reqs][1:] == sorted(int(r["params"]["start"]) for r in reqs[1:])


def test_more_lines_at_one_nanosecond_than_a_page_holds_is_said_not_looped_on(fake):
    fake.push({"job_id": "9", "node": "a"}, [(T0, f"burst {i}") for i in range(1500)] + [(T0 + 5, "after")])
    with LokiClient(settings(fake, page_limit=1000)) as c:
        res = c.fetch('{job_id="9"}', T0, T0 + SEC, 10**6)
    assert res.lines.height == 1001 and res.lines["line"][-1] == "after"
    assert "more than 1000 lines at 2025-11-20T00:53:20" in res.notes[0]
    assert len(fake.query_requests()) == 2


def test_max_lines_per_job_cuts_and_coverage_says_so(fake):
    fake.push({"cluster": "alpha", "job_id": "55", "node": "gpu001", "source": "applog"},
              [(ns_of("2026-11-20T08:10:00") + i * SEC, f"step {i}") for i in range(4000)])
    failed = jobs_frame(["55|a|u|gpu|FAILED|1:0|2026-11-20T08:00:00|2026-11-20T08:01:00|2026-11-20T10:00:00|1|"
                         "gpu001|gres/gpu=8,node=1"])
    cfg = {"kind": "loki", "url": fake.url, "page_limit": 1000, "max_lines_per_job": 2500}
    raw, notes = loki_jobs.fetch(cfg, failed, 15)
    # the first half of the budget from the start (set-up), the rest from the end (where the job died)
    assert raw["line"].to_list() == [f"step {i}" for i in (*range(1250), *range(2750, 4000))]
    cov = coverage_rows(_cluster(cfg), failed, parse_logs(raw), {}, notes)
    row = cov.filter(pl.col("source") == "applog").row(0, named=True)
    assert row["status"] == "ok" and row["rows"] == 2500
    assert "truncated at max_lines_per_job=2500" in row["reason"] and "kept the first 1250 and the last 1250" in row["reason"]
    assert "no lines for this job; truncated" in cov.filter(pl.col("source") == "syslog")["reason"][0]


def test_a_cut_job_keeps_its_head_and_tail_exactly_across_page_boundaries_within_one_instant(fake):
    # Lines of one instant straddle the forward page boundary near line 1000 and the backward one near 3000,
    # in three streams; the fake shuffles the order of lines of one instant on every request.
    ts, t = [], T0
    for i in range(4000):
        t += 0 if (995 < i <= 1005 or 2990 < i <= 3010) else 1000
        ts.append(t)
    for s_, node in enumerate(("gpu001", "gpu002", "gpu003")):
        fake.push({"job_id": "77", "node": node}, [(n, f"step {i}") for i, n in enumerate(ts) if i % 3 == s_])
    with LokiClient(settings(fake, page_limit=1000)) as c:
        res = c.fetch('{job_id="77"}', T0, ts[-1] + 1, 2500)
    assert res.truncated and res.error is None
    got = res.lines["line"].to_list()
    assert len(got) == len(set(got)) == 2500  # nothing twice
    assert set(got) == {f"step {i}" for i in (*range(1250), *range(2750, 4000))}  # nothing lost at the edges
    assert res.lines["ns"].is_sorted()  # oldest first, as a file would be
    dirs = [r["params"]["direction"] for r in fake.query_requests()]
    assert dirs == ["forward", "forward", "backward", "backward"]
    # A budget that the start and the end together cover is no cut at all: every line, once, no note.
    fake.requests.clear()
    with LokiClient(settings(fake, page_limit=1000)) as c:
        whole = c.fetch('{job_id="77"}', T0, ts[-1] + 1, 4000)
    assert not whole.truncated and whole.notes == []
    assert sorted(whole.lines["line"].to_list()) == sorted(f"step {i}" for i in range(4000))
    with LokiClient(settings(fake, page_limit=1000)) as c:
        short = c.fetch('{job_id="77"}', T0, ts[-1] + 1, 3999)  # one line too few: one line skipped, said so
    assert short.truncated and short.lines.height == short.lines["line"].n_unique() == 3999
    assert "kept the first 2000 and the last 1999" in short.notes[0]


# ------------------------------------------------------------------ LogQL built from the job
ODD_IDS = ['12"34', "a\\b", "x}y{z", "1001_[3]", "tab\there", "new\nline", "ünï", "1001"]


def test_escaped_job_ids_select_exactly_their_own_streams(fake):
    for v in ODD_IDS:
        assert go_unquote(f'"{loki.logql_string(v)}"') == v
    for j, job_id in enumerate(ODD_IDS):
        fake.push({"cluster": "alpha", "job_id": job_id, "node": "n1"}, [(T0 + j, f"line of {job_id!r}")])
    fake.push({"cluster": "alpha", "job_id": "1001_3", "node": "n1"}, [(T0, "decoy")])
    with LokiClient(settings(fake)) as c:
        for job_id in ODD_IDS:
            q = loki.render_query(loki.DEFAULT_QUERY, {"cluster": "alpha", "job_id": job_id})
            parse_logql(q)  # valid LogQL
            res = c.fetch(q, T0, T0 + SEC, 100)
            assert res.lines["line"].to_list() == [f"line of {job_id!r}"], job_id


def test_nodes_regex_matches_only_the_jobs_nodes(fake):
    for node in ("gpu-a.1", "gpu-a21", "gpu-b1", "gpu-a.10"):
        fake.push({"job": "syslog", "host": node}, [(ns_of("2026-11-20T08:30:00"), f"kernel: hello from {node}")])
    failed = jobs_frame(["77|a|u|gpu|FAILED|1:0|2026-11-20T08:00:00|2026-11-20T08:01:00|2026-11-20T10:00:00|2|"
                         "gpu-a.1,gpu-b1|gres/gpu=16,node=2"])
    cfg = {"kind": "loki", "url": fake.url, "query": ['{job="syslog", host=~"{nodes_regex}"}']}
    raw, notes = loki_jobs.fetch(cfg, failed, 15)
    assert notes.height == 0
    assert sorted(raw["node"]) == ["gpu-a.1", "gpu-b1"] and set(raw["source"]) == {"syslog"}
    assert set(raw["job_id"]) == {"77"}  # the lines belong to the job that was asked for


# ------------------------------------------------------------------ retries and failures
def test_retries_429_with_retry_after_then_500_then_success(fake):
    fake.push({"job_id": "1"}, [(T0 + i, f"l{i}") for i in range(10)])
    fake.inject("429", retry_after=1)
    fake.inject("500")
    fake.inject("close")
    t = time.monotonic()
    with LokiClient(settings(fake, retries=3)) as c:
        res = c.fetch('{job_id="1"}', T0, T0 + SEC, 100)
    assert res.lines.height == 10
    assert time.monotonic() - t >= 1.0  # Retry-After honoured
    assert len(fake.query_requests()) == 4


def test_a_hung_request_times_out_and_is_retried(fake):
    fake.push({"job_id": "1"}, [(T0, "hello")])
    fake.inject("hang", hang_s=1.5)
    with LokiClient(settings(fake, timeout_s=0.3, retries=1)) as c:
        assert c.fetch('{job_id="1"}', T0, T0 + SEC, 100).lines["line"].to_list() == ["hello"]
    fake.inject("hang", times=2, hang_s=1.5)
    with LokiClient(settings(fake, timeout_s=0.3, retries=1)) as c:
        res = c.fetch('{job_id="1"}', T0, T0 + SEC, 100)
    assert res.error == "timed out after 0.3 s (gave up after 2 attempts)" and res.lines.height == 0


@pytest.mark.parametrize("fault,reason", [
    ("garbage", "response is not JSON: '<html><body>502 Bad Gateway"),
    ("matrix", "expected resultType 'streams', got 'matrix'"),
])
def test_garbage_is_an_error_not_a_crash(fake, fault, reason):
    fake.inject(fault)
    with LokiClient(settings(fake)) as c:
        assert c.fetch('{job_id="1"}', T0, T0 + SEC, 100).error.startswith(reason)
    assert len(fake.query_requests()) == 1  # a malformed answer is not retried


def test_lines_before_a_failure_are_kept_and_the_reason_counts_them(fake):
    fake.push({"cluster": "alpha", "job_id": "56", "node": "gpu001", "source": "applog"},
              [(ns_of("2026-11-20T08:10:00") + i * SEC, f"step {i}") for i in range(2500)])
    fake.inject("pass")  # the first page comes back, the second fails for good
    fake.inject("500", times=2, body="rpc error: code = Unavailable desc = connection refused")
    failed = jobs_frame(["56|a|u|gpu|FAILED|1:0|2026-11-20T08:00:00|2026-11-20T08:01:00|2026-11-20T10:00:00|1|"
                         "gpu001|gres/gpu=8,node=1"])
    cfg = {"kind": "loki", "url": fake.url, "page_limit": 1000, "retries": 1, "backoff_s": 0.01}
    raw, notes = loki_jobs.fetch(cfg, failed, 15)
    assert raw["line"].to_list() == [f"step {i}" for i in range(1000)]
    assert notes["error"].to_list() == ["loki: HTTP 500: rpc error: code = Unavailable desc = connection refused "
                                        "(gave up after 2 attempts) (1000 lines fetched before it)"]
    cov = coverage_rows(_cluster(cfg), failed, parse_logs(raw), {}, notes)
    assert cov.filter(pl.col("source") == "applog").select("status", "rows").row(0) == ("error", 1000)


@pytest.fixture
def fleet(tmp_path):
    """The fleet_fixture cluster: sacct files, and its Loki streams in a fake Loki."""
    sim = write_sim(tmp_path / "sim")
    with FakeLoki() as f:
        f.load_export(sim / "alpha" / "loki" / "2026-11-20.jsonl")
        yield sim, f


def _cluster(logs: dict, sim: Path | None = None):
    from faultline.fleet.config import ClusterConfig

    return ClusterConfig("alpha", {"kind": "sacct_files", "path": str(sim or "/nonexistent")}, logs)


def _lines(got, job_id: str) -> list[tuple]:
    return sorted(got.logs.filter(pl.col("job_id") == job_id).select("node", "source", "ts", "line").rows())


def test_a_failing_job_gets_coverage_error_and_the_others_keep_their_lines(fleet):
    sim, fake = fleet
    fake.fail_queries('job_id="1003"', 400, "parse error at line 1, col 5: syntax error: unexpected IDENTIFIER")
    fake.fail_queries('job_id="1004"', 503, "too many outstanding requests")
    live = collect_cluster(_cluster({"kind": "loki", "url": fake.url, "backoff_s": 0.01, "retries": 2}, sim),
                           START, END)
    files = collect_cluster(_cluster({"kind": "loki_files", "path": str(sim)}, sim), START, END)
    assert _lines(live, "1001") == _lines(files, "1001") and len(_lines(live, "1001")) == 4
    cov = {(r["job_id"], r["source"]): r for r in live.coverage.iter_rows(named=True)}
    assert cov[("1003", "applog")]["status"] == cov[("1003", "syslog")]["status"] == "error"
    assert cov[("1003", "applog")]["reason"] == (
        "loki: HTTP 400: parse error at line 1, col 5: syntax error: unexpected IDENTIFIER")
    assert cov[("1004", "applog")]["reason"] == (
        "loki: HTTP 503: too many outstanding requests (gave up after 3 attempts)")
    assert cov[("1001", "applog")]["status"] == "ok" and cov[("1001", "scheduler")]["status"] == "ok"
    assert len([r for r in fake.query_requests() if "1003" in r["params"]["query"]]) == 1  # a 400 is not retried
    assert any("1004" in e for e in live.errors)


def test_an_unreachable_loki_fails_every_job_but_not_the_collect(fleet):
    sim, fake = fleet
    with httpx.Client() as probe:  # a port nobody listens on: the fake's, once stopped
        url = fake.url
        fake.stop()
        with pytest.raises(httpx.ConnectError):
            probe.get(url + "/ready")
    got = collect_cluster(_cluster({"kind": "loki", "url": url, "backoff_s": 0.01, "retries": 1}, sim), START, END)
    assert got.jobs.height == 4 and got.logs.height == 0
    errs = got.coverage.filter(pl.col("source").is_in(["applog", "syslog"]))
    assert set(errs["status"]) == {"error"} and errs.height == 6
    assert all(r.startswith(f"loki: cannot reach {url}: ") and r.endswith("(gave up after 2 attempts)")
               for r in errs["reason"])


# ------------------------------------------------------------------ tenants and credentials
def test_multi_tenant_header_and_bearer_token_from_the_environment(fleet, monkeypatch):
    sim, _ = fleet
    with FakeLoki(multi_tenant=True, require_authorization="Bearer s3cret-token") as f:
        f.load_export(sim / "alpha" / "loki" / "2026-11-20.jsonl", tenant="gpu-fleet")
        f.push({"cluster": "alpha", "job_id": "1004", "node": "gpu005"}, [(ns_of("2026-11-20T11:10:00"), "x")],
               tenant="someone-else")
        logs = {"kind": "loki", "url": f.url, "headers": {"X-Scope-OrgID": "gpu-fleet"},
                "bearer_token_env": "FAULTLINE_TEST_LOKI_TOKEN", "backoff_s": 0.01}
        monkeypatch.delenv("FAULTLINE_TEST_LOKI_TOKEN", raising=False)
        got = collect_cluster(_cluster(logs, sim), START, END)
        assert got.logs.height == 0 and set(got.coverage.filter(pl.col("source") == "applog")["reason"]) == {
            "loki: environment variable FAULTLINE_TEST_LOKI_TOKEN is not set (named in the cluster's logs config)"}
        assert f.requests == []  # nothing was sent without the credentials
        monkeypatch.setenv("FAULTLINE_TEST_LOKI_TOKEN", "s3cret-token")
        got = collect_cluster(_cluster(logs, sim), START, END)
        assert got.logs.height == 6 and "x" not in got.logs["line"].to_list()  # the other tenant's line
        hdr = f.query_requests()[0]["headers"]
        assert hdr["x-scope-orgid"] == "gpu-fleet" and hdr["authorization"] == "Bearer s3cret-token"


def test_basic_auth_from_the_environment(fake, monkeypatch):
    fake.require_authorization = "Basic " + base64.b64encode(b"12345:pw-from-env").decode()
    fake.push({"job_id": "1"}, [(T0, "hello")])
    monkeypatch.setenv("FAULTLINE_TEST_LOKI_PW", "pw-from-env")
    with LokiClient(settings(fake, username=12345, password_env="FAULTLINE_TEST_LOKI_PW")) as c:  # YAML: a number
        assert c.fetch('{job_id="1"}', T0, T0 + SEC, 10).lines.height == 1
    with LokiClient(settings(fake, username="12345", password_env="FAULTLINE_TEST_LOKI_PW"),
                    env={"FAULTLINE_TEST_LOKI_PW": "wrong"}) as c:
        assert c.fetch('{job_id="1"}', T0, T0 + SEC, 10).error == "HTTP 401: unauthorized"


# ------------------------------------------------------------------ config
@pytest.mark.parametrize("logs,message", [
    ({"kind": "loki"}, "url must be an http:// or https:// address"),
    ({"kind": "loki", "url": "loki:3100"}, "url must be an http:// or https:// address"),
    ({"kind": "loki", "url": "ftp://loki"}, "url must be an http:// or https:// address"),
    ({"kind": "loki", "url": "http://loki:3100", "page_limit": 0}, "page_limit must be an integer >= 1"),
    ({"kind": "loki", "url": "http://loki:3100", "timeout_s": -1}, "timeout_s must be a number > 0"),
    ({"kind": "loki", "url": "http://loki:3100", "max_parallel": 2.5}, "max_parallel must be an integer >= 1"),
    ({"kind": "loki", "url": "http://loki:3100", "retries": True}, "retries must be an integer >= 0"),
    ({"kind": "loki", "url": "http://loki:3100", "query": 'job_id="{job_id}"'}, "does not start with a stream selector"),
    ({"kind": "loki", "url": "http://loki:3100", "query": '{job_id="{jobid}"}'}, "unknown field(s) ['jobid']"),
    ({"kind": "loki", "url": "http://loki:3100", "bearer_token": "abc"}, "secrets go in environment variables"),
    ({"kind": "loki", "url": "http://loki:3100", "headers": {"Authorization": "Bearer x"}}, "no Authorization"),
    ({"kind": "loki", "url": "http://loki:3100", "password_env": "PW"}, "basic auth needs both"),
    ({"kind": "loki", "url": "http://loki:3100", "tail_minutes": float("nan")}, "tail_minutes must be a number >= 0"),
])
def test_config_errors_name_the_cluster_and_the_problem(tmp_path, logs, message):
    write_config(tmp_path, [{"name": "bravo", "scheduler": {"kind": "sacct"}, "logs": logs}])
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert "cluster 'bravo'" in str(err.value) and message in str(err.value)


def test_a_full_loki_config_loads(tmp_path):
    logs = {"kind": "loki", "url": "https://loki.example.internal:3100/", "headers": {"X-Scope-OrgID": "gpu-fleet"},
            "bearer_token_env": "LOKI_TOKEN", "query": ['{cluster="{cluster}", job_id="{job_id}"}',
                                                        '{job="syslog", host=~"{nodes_regex}"}'],
            "page_limit": 2000, "max_parallel": 8, "timeout_s": 10, "tail_minutes": 3}
    write_config(tmp_path, [{"name": "bravo", "scheduler": {"kind": "sacct"}, "logs": logs}])
    s = loki.LokiSettings.from_config(load_config(tmp_path).clusters[0].logs)
    assert s.url == "https://loki.example.internal:3100" and len(s.queries) == 2 and s.page_limit == 2000
    assert (s.retries, s.max_lines_per_job, s.timeout_s) == (3, 2_000_000, 10.0)


# ------------------------------------------------------------------ end to end: same verdicts as saved exports
@pytest.fixture(scope="module")
def sim_fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("live")
    simulate(root / "sim", SimConfig(jobs=150, days=1, clusters=1, seed=5), log=lambda *_: None)
    return root


def test_live_loki_and_saved_exports_give_the_same_diagnoses(sim_fleet, tmp_path, ruleset):
    from faultline.flows import tasks
    from faultline.warehouse.store import Warehouse

    sim = sim_fleet / "sim"
    truth_t = pl.read_parquet(sim / "truth.parquet")
    start = datetime.combine(truth_t["end_time"].min().date(), datetime.min.time(), tzinfo=timezone.utc)
    end = datetime.combine(truth_t["end_time"].max().date() + timedelta(days=1), datetime.min.time(),
                           tzinfo=timezone.utc)
    with FakeLoki(shuffle_ties=True) as fake:
        loaded = sum(fake.load_export(p) for p in sorted((sim / "alpha" / "loki").glob("*.jsonl")))
        verdicts, logs = {}, {}
        for kind, log_cfg in (("files", {"kind": "loki_files", "path": str(sim)}),
                              ("live", {"kind": "loki", "url": fake.url, "page_limit": 1000, "max_parallel": 3})):
            data = tmp_path / kind
            write_config(data, [{"name": "alpha", "scheduler": {"kind": "sacct_files", "path": str(sim)},
                                 "logs": log_cfg}])
            for a, b in tasks.partitions(start, end):
                out = tasks.collect_partition.fn(str(data), "alpha", a, b)
                assert out["errors"] == []
                tasks.diagnose_partition.fn(str(data), "alpha", a, b)
            wh = Warehouse(data / "warehouse")
            d = wh.read("diagnoses")
            verdicts[kind] = {(r["job_id"], r["attempt"]): (r["outcome"], r["culprit_nodes"], r["culprit_ranks"],
                                                            r["ambiguous"], r["confidence"])
                              for r in d.iter_rows(named=True)}
            logs[kind] = wh.read("logs").height
            if kind == "live":
                cov = wh.read("coverage")
                assert cov.filter(pl.col("status") == "error").height == 0
    assert len(verdicts["files"]) >= 20 and verdicts["live"] == verdicts["files"]
    assert logs["live"] == logs["files"] > 10_000 and loaded >= logs["files"]
    assert any(int(r["params"]["start"]) > 0 for r in fake.query_requests())
    assert max(Counter(r["params"]["query"] for r in fake.query_requests()).values()) > 1  # some job was paged


def test_by_reference_diagnosis_reads_a_live_loki(fleet, tmp_path, ruleset):
    from faultline.fleet.config import load_config as load
    from faultline.fleet.single import diagnose_one

    sim, fake = fleet
    data = tmp_path / "data"
    write_config(data, [{"name": "alpha", "scheduler": {"kind": "sacct_files", "path": str(sim)},
                         "logs": {"kind": "loki", "url": fake.url}}])
    d = diagnose_one(load(data), "alpha", "1001", ruleset)
    assert d["outcome"] == "gpu_hardware" and d["culprit"]["nodes"] == ["gpu001"]
    cov = {c["source"]: c for c in d["coverage"]}
    assert cov["syslog"]["status"] == "ok" and cov["applog"]["rows"] == 3
    q = fake.query_requests()[0]["params"]
    assert q["query"] == '{cluster="alpha", job_id="1001"}' and q["direction"] == "forward"
    # the job ran 08:01 -> 10:13: asked from 15 min before its start to 5 min after its end
    assert (int(q["start"]), int(q["end"])) == (ns_of("2026-11-20T07:46:00"), ns_of("2026-11-20T10:18:00"))
    assert json.loads(json.dumps(d))["ruleset"]["version"] == ruleset.version
