"""Prometheus metrics against a real Prometheus (backfilled history): query_range per failed job,
chunking under the points limit, faults per job, and metric rules deciding verdicts."""

from __future__ import annotations

import json
import socket
import threading
from datetime import datetime, timezone
from pathlib import Path

import httpx
import polars as pl
import pytest

from faultline.collectors import prometheus
from faultline.fleet.collect import collect_cluster
from faultline.fleet.config import ConfigError, load_config, write_config
from faultline.fleet.diagnose import diagnose_tables
from faultline.flows import tasks

from .prom_server import MISSING, Prometheus

pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

DAY = "2026-11-20"
SACCT = """JobID|JobName|User|Partition|State|ExitCode|Submit|Start|End|NNodes|NodeList|AllocTRES
2001|pretrain|ana|gpu|FAILED|1:0|2026-11-20T07:59:00|2026-11-20T08:00:00|2026-11-20T09:10:00|3|gpu[101-103]|gres/gpu=24,node=3
2002|pretrain|bo|gpu|FAILED|1:0|2026-11-20T07:59:00|2026-11-20T08:00:00|2026-11-20T09:00:00|4|gpu[104-107]|gres/gpu=32,node=4
2003|sweep|cy|gpu|FAILED|1:0|2026-11-20T07:59:00|2026-11-20T08:00:00|2026-11-20T08:30:00|2|gpu[108-109]|gres/gpu=16,node=2
2004|eval|dee|gpu|COMPLETED|0:0|2026-11-20T07:59:00|2026-11-20T08:00:00|2026-11-20T09:00:00|1|gpu110|gres/gpu=8,node=1
2005|long|eve|gpu|FAILED|1:0|2026-11-19T11:59:00|2026-11-19T12:00:00|2026-11-20T10:00:00|1|gpu111|gres/gpu=8,node=1
2006|pretrain|fay|gpu|FAILED|1:0|2026-11-20T07:59:00|2026-11-20T08:00:00|2026-11-20T09:00:00|1|gpu112|gres/gpu=8,node=1
"""


def ts(hms: str, day: str = DAY) -> float:
    return datetime.fromisoformat(f"{day}T{hms}+00:00").timestamp()


def every(start: float, end: float, step: float, value) -> list[tuple[float, float]]:
    out, t = [], start
    while t <= end:
        out.append((t, value(t) if callable(value) else value))
        t += step
    return out


def history() -> list:
    s0, s1 = ts("07:30:00"), ts("09:30:00")
    series = []
    for n in range(101, 113):
        node = f"gpu{n:03d}"
        for gpu in range(2):
            dcgm = {"Hostname": node, "instance": f"{node}:9400", "job": "dcgm", "gpu": str(gpu),
                    "UUID": f"GPU-{n:04d}-{gpu}", "pci_bus_id": f"0000:{0x18 + gpu * 0x20:02x}:00.0"}
            if node == "gpu102" and gpu == 1:  # Xid 79 at 08:50 on job 2001's middle node
                xid = lambda t: 79.0 if t >= ts("08:50:00") else 0.0  # noqa: E731
            elif node in ("gpu108", "gpu109") and gpu == 0:  # left by an earlier job: not 2003's
                xid = 79.0
            else:
                xid = 0.0
            series.append(("DCGM_FI_DEV_XID_ERRORS", dcgm, every(s0, s1, 15, xid)))
            series.append(("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", dcgm, every(s0, s1, 15, 0.0)))
        ib = {"instance": f"{node}:9100", "job": "node", "device": "mlx5_0", "port": "1"}
        sym = (lambda t: 0.0 if t < ts("08:20:00") else (t - ts("08:20:00")) / 3) if node == "gpu106" else 0.0
        series.append(("node_infiniband_symbol_error_total", ib, every(s0, s1, 15, sym)))
        down = (lambda t: 1.0 if t >= ts("08:40:00") else 0.0) if node == "gpu106" else 0.0
        series.append(("node_infiniband_link_downed_total", ib, every(s0, s1, 15, down)))
        # two HCAs: the metrics key keeps them apart
        series.append(("node_infiniband_link_downed_total", {**ib, "device": "mlx5_1"}, every(s0, s1, 15, 0.0)))
    # the long job: up every 15 s for 22.5 hours (more than one query's worth of points at step 5 s)
    series.append(("up", {"instance": "gpu111:9100", "job": "node"},
                   every(ts("11:45:00", "2026-11-19"), ts("10:10:00"), 15, 1.0)))
    return series


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    server = Prometheus(tmp_path_factory.mktemp("prometheus"), history())
    yield server
    server.stop()


def write_fleet(tmp: Path, metrics: dict) -> Path:
    sim = tmp / "sim"
    (sim / "alpha" / "sacct").mkdir(parents=True)
    (sim / "alpha" / "loki").mkdir(parents=True)
    (sim / "alpha" / "sacct" / f"{DAY}.txt").write_text(SACCT)
    ns = lambda hms: str(int(ts(hms) * 1e9))  # noqa: E731
    wd = lambda r: (f"[rank{r}]:[E1120 09:00:30.408271257 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught "  # noqa: E731
                    "collective operation timeout: WorkNCCL(SeqNum=920, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                    "Timeout(ms)=600000) ran for 600031 milliseconds before timing out.")
    stream = lambda job, node, values: {  # noqa: E731
        "stream": {"cluster": "alpha", "job_id": job, "attempt": "0", "node": node, "source": "applog"},
        "values": [[ns(t), line] for t, line in values]}
    # 2001: only victims' timeouts in the logs (the GPU node's syslog was never shipped)
    result = [stream("2001", "gpu101", [("09:00:30", wd(0))]), stream("2001", "gpu103", [("09:00:30", wd(2))]),
              stream("2003", "gpu108", [("08:29:58", "[rank0]: ModuleNotFoundError: No module named 'flash_attn'")])]
    (sim / "alpha" / "loki" / f"{DAY}.jsonl").write_text(
        json.dumps({"status": "success", "data": {"resultType": "streams", "result": result}}) + "\n")
    data = tmp / "data"
    write_config(data, [{"name": "alpha", "scheduler": {"kind": "sacct_files", "path": str(sim)},
                         "logs": {"kind": "loki_files", "path": str(sim)}, "metrics": metrics}])
    return data


START = datetime(2026, 11, 20, tzinfo=timezone.utc)
END = datetime(2026, 11, 21, tzinfo=timezone.utc)


def cov(got, source="metrics") -> dict:
    return {r["job_id"]: (r["status"], r["reason"]) for r in
            got.coverage.filter(pl.col("source") == source).iter_rows(named=True)}


class Faults(httpx.BaseTransport):
    """The real Prometheus behind a transport that breaks the requests naming one node."""

    def __init__(self, node: str, fault: str):
        self.real, self.node, self.fault, self.calls = httpx.HTTPTransport(), node, fault, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.node not in request.content.decode():
            return self.real.handle_request(request)
        self.calls += 1
        if self.fault == "500":
            return httpx.Response(500, text="internal error", request=request)
        if self.fault == "html":
            return httpx.Response(200, text="<html>proxy login</html>", request=request)
        if self.fault == "vector":
            return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}},
                                  request=request)
        if self.fault == "broken_series":
            return httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix",
                                                                           "result": [{"metric": {}}]}},
                                  request=request)
        raise httpx.ConnectError("connection reset by peer", request=request)


def test_collect_and_diagnose_with_metric_rules_against_a_real_prometheus(prom, tmp_path, ruleset):
    data = write_fleet(tmp_path, {"kind": "prometheus", "url": prom.url, "step_s": 15})
    cfg = load_config(data)
    got = collect_cluster(cfg.clusters[0], START, END, cfg.margin_minutes)
    assert got.errors == []
    c = cov(got)
    assert set(c) == {"2001", "2002", "2003", "2005", "2006"}  # failed jobs only
    assert all(status == "ok" for status, _ in c.values()), c
    m = got.metrics
    assert set(m.filter(pl.col("name") == "DCGM_FI_DEV_XID_ERRORS")["node"].unique()) >= {"gpu101", "gpu102", "gpu103"}
    # two HCAs of one node at one instant stay two samples
    downed = m.filter((pl.col("name") == "node_infiniband_link_downed_total") & (pl.col("node") == "gpu106"))
    assert downed["labels"].n_unique() == 2
    assert not m.select(prometheus.KEY_COLS).is_duplicated().any()

    diagnoses, symptoms = diagnose_tables(got.jobs, got.logs, got.coverage, ruleset, metrics=got.metrics)
    d = {r["job_id"]: r for r in diagnoses.iter_rows(named=True)}
    # the Xid that rose in DCGM on gpu102 before the others' timeouts: gpu102 is the culprit
    assert d["2001"]["outcome"] == "gpu_hardware" and d["2001"]["culprit_nodes"] == ["gpu102"]
    assert d["2001"]["culprit_gpus"] == [1] and d["2001"]["action"] == "drain_node"
    assert set(d["2001"]["affected_nodes"]) >= {"gpu101", "gpu103"}
    ev = json.loads(d["2001"]["evidence"])
    assert any(e["rule_id"] == "nvidia.dcgm_xid" and e["node"] == "gpu102" for e in ev)
    # link down + symbol-error outlier on gpu106, nothing in the logs
    assert d["2002"]["outcome"] == "network_ib" and d["2002"]["culprit_nodes"] == ["gpu106"]
    # a Xid already there before the job started is not this job's: the traceback decides, nobody drained
    assert d["2003"]["outcome"] == "config_error" and d["2003"]["action"] not in ("drain_node", "reset_gpu")
    assert symptoms.filter((pl.col("job_id") == "2003") & (pl.col("source") == "metrics")).height == 0
    sym = symptoms.filter(pl.col("source") == "metrics")
    assert set(sym.columns) >= {"rule_id", "file", "seq", "line"} and sym["line"].null_count() == 0


def test_a_long_job_is_chunked_under_the_points_limit_without_gaps_or_repeats(prom):
    s = prometheus.PrometheusSettings.from_config({"url": prom.url, "queries": ['up{job="node"}'], "step_s": 5,
                                                   "tail_minutes": 0})
    jobs = pl.DataFrame({"cluster": ["alpha"], "job_id": ["2005"], "attempt": [0], "nodes": [["gpu111"]],
                         "submit_time": [datetime(2026, 11, 19, 11, 59, tzinfo=timezone.utc)],
                         "start_time": [datetime(2026, 11, 19, 12, 0, tzinfo=timezone.utc)],
                         "end_time": [datetime(2026, 11, 20, 10, 0, tzinfo=timezone.utc)]})
    plan, _ = prometheus.plan(jobs, s, margin_minutes=15)
    pieces = prometheus.chunks(plan[0].start_s, plan[0].end_s, s.step_s, s.max_points)
    assert len(pieces) == 2 and all((hi - lo) / s.step_s + 1 <= 11_000 for lo, hi in pieces)
    samples, coverage = prometheus.fetch({"url": prom.url, "queries": ['up{job="node"}'], "step_s": 5,
                                          "tail_minutes": 0}, "alpha", jobs)
    assert coverage["status"].to_list() == ["ok"], coverage.to_dicts()
    expected = int((plan[0].end_s - plan[0].start_s) / 5) + 1
    assert samples.height == expected  # every step once: no gap and no repeat at the chunk seam
    assert samples["ts"].diff().drop_nulls().dt.total_seconds().unique().to_list() == [5]
    # the same window in one request is what Prometheus refuses
    with pytest.raises(prometheus.PrometheusError, match="11,000 points"):
        prometheus.PrometheusClient(s).query_range('up{job="node"}', plan[0].start_s, plan[0].end_s, 5)


def test_small_chunks_and_node_groups_give_the_same_samples(prom):
    jobs = pl.DataFrame({"cluster": ["alpha"], "job_id": ["2002"], "attempt": [0],
                         "nodes": [["gpu104", "gpu105", "gpu106", "gpu107"]],
                         "start_time": [datetime(2026, 11, 20, 8, 0, tzinfo=timezone.utc)],
                         "submit_time": [None], "end_time": [datetime(2026, 11, 20, 9, 0, tzinfo=timezone.utc)]},
                        schema_overrides={"submit_time": pl.Datetime("us", "UTC")})
    base = {"url": prom.url, "queries": ["node_infiniband_symbol_error_total"], "step_s": 15}
    one, _ = prometheus.fetch(base, "alpha", jobs)
    many, cov_many = prometheus.fetch({**base, "max_points": 17, "max_nodes_per_query": 3}, "alpha", jobs)
    assert cov_many["status"].to_list() == ["ok"]
    assert one.height > 0 and one.sort(prometheus.KEY_COLS).equals(many.sort(prometheus.KEY_COLS))


@pytest.mark.parametrize("fault, reason", [
    ("500", "HTTP 500: internal error (gave up after 3 attempts)"),
    ("reset", "connection reset by peer (gave up after 3 attempts)"),
    ("html", "response is not JSON"),
    ("vector", "not a range matrix"),
    ("broken_series", "malformed series"),
])
def test_a_failing_job_gets_a_coverage_error_and_the_others_are_collected(prom, tmp_path, fault, reason):
    transport = Faults("gpu112", fault)
    http = httpx.Client(base_url=prom.url, transport=transport)
    jobs = collect_jobs(tmp_path)
    samples, coverage = prometheus.fetch({"url": prom.url, "retries": 2, "backoff_s": 0.01, "step_s": 30},
                                         "alpha", jobs, http=http, sleep=lambda s: None)
    c = {r["job_id"]: r for r in coverage.iter_rows(named=True)}
    assert c["2006"]["status"] == "error" and reason in c["2006"]["reason"], c["2006"]
    assert c["2006"]["reason"].startswith("prometheus: DCGM_FI_DEV_XID_ERRORS: ")
    retried = fault in ("500", "reset")
    assert transport.calls == (3 if retried else 1)  # 4xx-like answers and garbage are not retried
    assert all(c[j]["status"] == "ok" for j in ("2001", "2002", "2003", "2005")), c
    assert set(samples["node"].unique()) >= {"gpu101", "gpu104", "gpu108"}
    assert "gpu112" not in set(samples["node"].unique())


def collect_jobs(tmp_path) -> pl.DataFrame:
    from faultline.collectors.slurm import parse_sacct
    from faultline.taxonomy import FAILED_STATES
    jobs, _ = parse_sacct(SACCT, "alpha")
    return jobs.filter(pl.col("state").is_in(list(FAILED_STATES)))


def test_a_bad_query_is_reported_with_prometheus_message_and_not_retried(prom, tmp_path):
    calls = []
    http = httpx.Client(base_url=prom.url, event_hooks={"request": [calls.append]})
    samples, coverage = prometheus.fetch({"url": prom.url, "queries": [{"name": "x", "query": "rate(x{$node_matcher}[5m"}]},
                                         "alpha", collect_jobs(tmp_path).head(1), http=http)
    row = coverage.row(0, named=True)
    assert row["status"] == "error" and "HTTP 400: bad_data:" in row["reason"] and "parse error" in row["reason"]
    assert len(calls) == 1 and samples.height == 0


def test_a_server_that_is_down_fails_every_job_but_not_the_collect(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    data = write_fleet(tmp_path, {"kind": "prometheus", "url": f"http://127.0.0.1:{port}", "retries": 1,
                                  "backoff_s": 0.01})
    cfg = load_config(data)
    got = collect_cluster(cfg.clusters[0], START, END, cfg.margin_minutes)
    c = cov(got)
    assert all(status == "error" and "cannot reach" in reason and "gave up after 2 attempts" in reason
               for status, reason in c.values()), c
    assert any("metrics of job" in e for e in got.errors)
    assert cov(got, "applog")["2001"][0] == "ok"  # the logs still landed
    diagnoses, _ = diagnose_tables(got.jobs, got.logs, got.coverage, load_ruleset_once(), metrics=got.metrics)
    row = diagnoses.filter(pl.col("job_id") == "2001").row(0, named=True)
    assert "telemetry missing: metrics (prometheus:" in row["confidence_reason"]
    assert row["culprit_nodes"] != ["gpu102"]  # without metrics nothing points at the GPU node


def load_ruleset_once():
    from faultline.rules.loader import load_ruleset
    return load_ruleset()


def test_a_hung_server_times_out_and_is_retried():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted = []
    stop = threading.Event()

    def accept():  # takes the connection and never answers
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        jobs = pl.DataFrame({"cluster": ["alpha"], "job_id": ["1"], "attempt": [0], "nodes": [["gpu001"]],
                             "start_time": [datetime(2026, 11, 20, 8, tzinfo=timezone.utc)], "submit_time": [None],
                             "end_time": [datetime(2026, 11, 20, 9, tzinfo=timezone.utc)]},
                            schema_overrides={"submit_time": pl.Datetime("us", "UTC")})
        _, coverage = prometheus.fetch({"url": url, "timeout_s": 0.3, "retries": 1, "backoff_s": 0.01}, "alpha", jobs)
        row = coverage.row(0, named=True)
        assert row["status"] == "error" and "timed out after 0.3 s (gave up after 2 attempts)" in row["reason"]
        assert len(accepted) >= 2
    finally:
        stop.set()
        t.join()
        for c in accepted:
            c.close()
        listener.close()


def test_the_flows_write_metrics_and_diagnose_from_the_warehouse(prom, tmp_path):
    data = write_fleet(tmp_path, {"kind": "prometheus", "url": prom.url, "step_s": 30})
    runs = []
    for _ in range(2):  # idempotent: a re-run of the same window writes nothing new
        runs.append(tasks.collect_partition.fn(str(data), "alpha", START, END))
        tasks.diagnose_partition.fn(str(data), "alpha", START, END)
    assert runs[0]["metrics"] > 0 and runs[1]["metrics"] == 0
    from faultline.warehouse.store import Warehouse
    wh = Warehouse(data / "warehouse")
    m = wh.read("metrics")
    assert not m.select(prometheus.KEY_COLS).is_duplicated().any()
    assert set(m["date"].cast(pl.String).unique()) == {"2026-11-19", "2026-11-20"}  # the long job's samples
    d = {r["job_id"]: r for r in wh.read("diagnoses").iter_rows(named=True)}
    assert d["2001"]["outcome"] == "gpu_hardware" and d["2001"]["culprit_nodes"] == ["gpu102"]
    assert d["2002"]["culprit_nodes"] == ["gpu106"]


@pytest.mark.parametrize("metrics, message", [
    ({"kind": "prometheus"}, "url must be"),
    ({"kind": "prometheus", "url": "http://p:9090", "max_points": 20000}, "at most 11000"),
    ({"kind": "prometheus", "url": "http://p:9090", "queries": ["rate(x[5m])"]}, "is not a selector"),
    ({"kind": "prometheus", "url": "http://p:9090", "queries": [{"name": "x", "query": "x"}]}, "$node_matcher"),
    ({"kind": "prometheus", "url": "http://p:9090", "token": "s3cret"}, "unknown key"),
])
def test_config_errors_name_the_cluster_and_the_problem(tmp_path, metrics, message):
    write_config(tmp_path, [{"name": "alpha", "scheduler": {"kind": "sacct"}, "metrics": metrics}])
    with pytest.raises(ConfigError, match="cluster 'alpha'.*" + message.replace("$", r"\$")):
        load_config(tmp_path)


def test_node_matcher_and_chunks_units():
    m = prometheus.node_matcher("instance", ["gpu-2", "gpu1"])
    assert m == 'instance=~"(?:gpu\\\\-2|gpu1)(?:[.:].*)?"'
    assert prometheus.chunks(0, 100, 10, 4) == [(0, 30), (40, 70), (80, 100)]
    assert prometheus.chunks(0, 0, 10, 4) == [(0, 0)]
