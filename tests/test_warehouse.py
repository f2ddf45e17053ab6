"""Warehouse store: round trip, idempotent batches, atomic writes, catalog, pruning, `faultline sql`."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import polars as pl
import pytest

from faultline.cli import main
from faultline.warehouse import schema
from faultline.warehouse.store import (
    CATALOG, META_JSON, QueryError, SchemaMismatchError, SchemaVersionError, Warehouse, WarehouseError,
    columns,
)

README = Path(__file__).resolve().parents[1] / "README.md"
UTC = dt.timezone.utc


def ts(day: int, hour: int = 12) -> dt.datetime:
    return dt.datetime(2024, 5, day, hour, tzinfo=UTC)


def jobs(rows: list[tuple]) -> pl.DataFrame:
    """rows of (cluster, job_id, attempt, state, end day)."""
    if not rows:
        return pl.DataFrame(schema={c: t for c, t in columns("jobs").items() if not c.startswith("_")})
    return pl.DataFrame({
        "cluster": [r[0] for r in rows], "job_id": [r[1] for r in rows], "attempt": [r[2] for r in rows],
        "scheduler": "slurm", "name": "train", "user": "alice", "queue": "gpu",
        "state": [r[3] for r in rows], "raw_state": [r[3] for r in rows],
        "exit_code": [1 if r[3] != "COMPLETED" else 0 for r in rows], "signal": [None] * len(rows),
        "submit_time": [ts(r[4], 1) for r in rows], "start_time": [ts(r[4], 2) for r in rows],
        "end_time": [ts(r[4]) for r in rows], "num_nodes": 2, "num_gpus": 16,
        "nodes": [["gpu001", "gpu002"] for _ in rows],
    }).with_columns(date=pl.col("end_time").dt.date())


def diagnoses(rows: list[tuple]) -> pl.DataFrame:
    """rows of (cluster, job_id, outcome, culprit node or None, ambiguous, gpu_hours)."""
    def evidence(r):
        return json.dumps([{"rule_id": f"{r[2]}.rule", "symptom": r[2], "role": "root", "node": r[3],
                            "line": "NVRM: Xid 79"}])
    n = len(rows)
    return pl.DataFrame({
        "cluster": [r[0] for r in rows], "job_id": [r[1] for r in rows], "attempt": [0] * n,
        "ruleset": "v1", "outcome": [r[2] for r in rows], "domain": "hardware", "root_cause": "x",
        "culprit_nodes": [[r[3]] if r[3] else [] for r in rows], "culprit_ranks": [[0]] * n,
        "culprit_gpus": [[]] * n, "affected_nodes": [["gpu009"]] * n, "ambiguous": [r[4] for r in rows],
        "confidence": "high", "confidence_reason": "", "action": "drain_node",
        "action_targets": [[r[3]] if r[3] else [] for r in rows], "candidates": "[]",
        "evidence": [evidence(r) for r in rows], "coverage": "[]", "queue": "gpu",
        "end_time": [ts(2)] * n, "num_nodes": 2, "num_gpus": 16, "gpu_hours": [r[5] for r in rows],
        "diagnosed_at": [ts(3)] * n, "diagnosis": "{}",
    }).with_columns(date=pl.col("end_time").dt.date())


def parquet_files(root: Path, table: str) -> list[str]:
    return sorted(str(p.relative_to(root / table)) for p in (root / table).rglob("*.parquet"))


@pytest.fixture
def wh(tmp_path) -> Warehouse:
    return Warehouse(tmp_path / "warehouse")


# ---------------------------------------------------------------- round trip and validation

def test_round_trip_keeps_schema_types_and_values(wh):
    frame = jobs([("a", "1", 0, "FAILED", 1), ("a", "2", 1, "COMPLETED", 2), ("007", "3", 0, "NODE_FAIL", 2)])
    assert wh.write("jobs", frame, "collect-1") == 3
    got = wh.read("jobs")
    assert got.schema == pl.Schema(columns("jobs"))
    assert got["cluster"].to_list() == ["007", "a", "a"]  # sorted by key; "007" stays a string
    data_cols = [c for c in columns("jobs") if not c.startswith("_")]
    want = frame.sort("cluster", "job_id").select(data_cols).cast({c: columns("jobs")[c] for c in data_cols})
    assert got.select(data_cols).equals(want)
    assert set(got["_batch"]) == {"collect-1"}
    assert parquet_files(wh.root, "jobs") == [
        "cluster=007/date=2024-05-02/collect-1.parquet",
        "cluster=a/date=2024-05-01/collect-1.parquet",
        "cluster=a/date=2024-05-02/collect-1.parquet",
    ]
    # partition columns live in the folder names only
    inner = pl.read_parquet(wh.root / "jobs" / "cluster=a" / "date=2024-05-01" / "collect-1.parquet")
    assert "cluster" not in inner.columns and "date" not in inner.columns


def test_nested_json_and_trend_tables_round_trip(wh):
    d = diagnoses([("a", "1", "gpu_hardware", "gpu001", False, 32.0)])
    wh.write("diagnoses", d, "diag-1")
    got = wh.read("diagnoses")
    assert got.schema == pl.Schema(columns("diagnoses"))
    assert got["culprit_nodes"].to_list() == [["gpu001"]] and got["culprit_gpus"].to_list() == [[]]
    trends = pl.DataFrame({"cluster": ["a"], "date": [dt.date(2024, 5, 1)], "node": ["gpu001"],
                           "times_culprit": [3], "times_affected": [1], "symptoms": [7],
                           "outcomes": [["gpu_hardware"]]})
    wh.write("trends_node_day", trends, "report-2024-05-01")
    t = wh.read("trends_node_day")
    assert t.schema == pl.Schema(columns("trends_node_day"))
    assert t.select(trends.columns).equals(trends.cast(dict(schema.TABLES["trends_node_day"])))


def test_write_casts_loose_types(wh):
    frame = jobs([("a", "1", 0, "FAILED", 1)]).with_columns(
        pl.col("attempt").cast(pl.Int64), pl.col("end_time").dt.replace_time_zone(None),
        pl.col("date").cast(pl.String))
    wh.write("jobs", frame, "b")
    got = wh.read("jobs")
    assert got["end_time"].to_list() == [ts(1)] and got["date"].to_list() == [dt.date(2024, 5, 1)]


def test_write_rejects_bad_frames_clearly(wh):
    frame = jobs([("a", "1", 0, "FAILED", 1)])
    with pytest.raises(SchemaMismatchError, match=r"missing column\(s\) user"):
        wh.write("jobs", frame.drop("user"), "b")
    with pytest.raises(SchemaMismatchError, match=r"unexpected column\(s\) colour"):
        wh.write("jobs", frame.with_columns(colour=pl.lit("red")), "b")
    with pytest.raises(SchemaMismatchError, match=r"jobs\.attempt: cannot cast"):
        wh.write("jobs", frame.with_columns(attempt=pl.lit("zero")), "b")
    with pytest.raises(SchemaMismatchError, match="null date"):
        wh.write("jobs", frame.with_columns(date=pl.lit(None, pl.Date)), "b")
    with pytest.raises(WarehouseError, match="invalid batch"):
        wh.write("jobs", frame, "../escape")
    with pytest.raises(WarehouseError, match="invalid cluster"):
        wh.write("jobs", frame.with_columns(cluster=pl.lit("a/b")), "b")
    with pytest.raises(WarehouseError, match="unknown table"):
        wh.write("nope", frame, "b")
    assert not (wh.root / "jobs").exists()


# ---------------------------------------------------------------- idempotence and dedupe

def test_same_batch_twice_gives_same_rows(wh):
    frame = jobs([("a", "1", 0, "FAILED", 1), ("a", "2", 0, "FAILED", 2)])
    wh.write("jobs", frame, "collect-a-1")
    first = wh.read("jobs").drop("_written_at")
    files = parquet_files(wh.root, "jobs")
    wh.write("jobs", frame, "collect-a-1")
    assert wh.read("jobs").drop("_written_at").equals(first)
    assert wh.read("jobs", dedupe=False).height == 2
    assert parquet_files(wh.root, "jobs") == files


def test_rewriting_a_batch_removes_its_files_in_partitions_no_longer_touched(wh):
    wh.write("jobs", jobs([("a", "1", 0, "FAILED", 1), ("b", "2", 0, "FAILED", 2)]), "b1")
    wh.write("jobs", jobs([("other", "9", 0, "FAILED", 2)]), "b2")
    wh.write("jobs", jobs([("a", "1", 0, "TIMEOUT", 1)]), "b1")
    assert parquet_files(wh.root, "jobs") == ["cluster=a/date=2024-05-01/b1.parquet",
                                              "cluster=other/date=2024-05-02/b2.parquet"]
    assert wh.read("jobs").select("job_id", "state").rows() == [("1", "TIMEOUT"), ("9", "FAILED")]
    wh.write("jobs", jobs([]), "b1")  # a re-run that found nothing empties the batch
    assert wh.read("jobs")["job_id"].to_list() == ["9"]


def test_overlapping_batches_newest_write_wins(wh):
    wh.write("jobs", jobs([("a", "1", 0, "RUNNING", 1), ("a", "2", 0, "RUNNING", 1)]), "window-1")
    wh.write("jobs", jobs([("a", "2", 0, "FAILED", 1), ("a", "3", 0, "FAILED", 1)]), "window-2")
    got = wh.read("jobs")
    assert got.select("job_id", "state", "_batch").rows() == [
        ("1", "RUNNING", "window-1"), ("2", "FAILED", "window-2"), ("3", "FAILED", "window-2")]
    assert wh.sql("SELECT count(*) AS n FROM jobs_all").item() == 4
    # re-running the older window makes it the newest write again
    wh.write("jobs", jobs([("a", "1", 0, "RUNNING", 1), ("a", "2", 0, "RUNNING", 1)]), "window-1")
    assert wh.read("jobs", "job_id = ?", ["2"])["state"].to_list() == ["RUNNING"]


def test_duplicate_keys_inside_one_frame_keep_the_last(wh):
    f = jobs([("a", "1", 0, "RUNNING", 1), ("a", "1", 0, "FAILED", 1)])
    assert wh.write("jobs", f, "b") == 1
    assert wh.read("jobs", dedupe=False)["state"].to_list() == ["FAILED"]


# ---------------------------------------------------------------- atomicity

KILLED_WRITER = """
import sys, time
from pathlib import Path
import polars as pl
import faultline.warehouse.store as store

def torn(df, path):  # the first bytes of a file, then the writer hangs until killed
    with open(path, "xb") as f:
        f.write(b"PAR1" + b"\\0" * 65536)
        f.flush()
    time.sleep(120)

store._write_parquet = torn
store.Warehouse(Path(sys.argv[1])).write("jobs", pl.read_parquet(sys.argv[2]), "b1")
"""


def test_killed_write_leaves_old_state_and_next_write_cleans_up(wh, tmp_path):
    old = jobs([("a", "1", 0, "RUNNING", 1), ("a", "2", 0, "RUNNING", 2)])
    wh.write("jobs", old, "b1")
    before = wh.read("jobs")
    new = jobs([("a", str(i), 0, "FAILED", 1 + i % 3) for i in range(5000)])
    new.write_parquet(tmp_path / "new.parquet")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(wh.root), str(tmp_path / "new.parquet")])
    try:
        deadline = time.monotonic() + 30
        while not list((wh.root / "jobs").rglob(".b1.parquet.tmp-*")):
            assert proc.poll() is None, "writer exited early"
            assert time.monotonic() < deadline, "the writer never started its temp file"
            time.sleep(0.02)
        # readers mid-write: the old complete state, the torn temp file ignored
        assert wh.read("jobs").equals(before)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    temps = list((wh.root / "jobs").rglob(".b1.parquet.tmp-*"))
    assert temps, "the killed writer's temp file should still be there"
    assert wh.read("jobs").equals(before)
    assert wh.read_window("jobs", "2024-05-01", "2024-05-31").equals(before)
    assert wh.sql("SELECT count(*) FROM jobs_all").item() == 2

    assert wh.write("jobs", new, "b1") == 5000
    assert not list((wh.root / "jobs").rglob(".*"))  # temp files and journals
    got = wh.read("jobs")
    assert got.height == 5000 and set(got["state"]) == {"FAILED"}


def test_first_write_killed_shows_nothing_of_the_batch(wh):
    # what a writer killed during its first write of batch b9 leaves: its journal and a torn temp file
    from faultline.warehouse.store import _owner

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    tag = f"{_owner().rsplit('-', 1)[0]}-{dead}-deadbeef"
    part = wh.root / "jobs" / "cluster=a" / "date=2024-05-01"
    part.mkdir(parents=True)
    (part / f".b9.parquet.tmp-{tag}").write_bytes(b"PAR1 torn")
    (wh.root / "jobs" / f".writing-{tag}.json").write_text(json.dumps([f"cluster=a/date=2024-05-01/.b9.parquet.tmp-{tag}"]))
    orphan = part / ".b8.parquet.tmp-otherhost-1-cafebabe"  # no journal, another host: only a full sweep
    orphan.write_bytes(b"PAR1 torn")
    assert wh.read("jobs").height == 0
    assert wh.read_window("jobs", "2024-05-01", "2024-05-01").height == 0
    wh.write("jobs", jobs([("b", "1", 0, "FAILED", 3)]), "b1")  # another partition and batch: still cleaned
    assert [p.name for p in (wh.root / "jobs").rglob(".*")] == [orphan.name]
    os.utime(orphan, (time.time() - 7200, time.time() - 7200))
    assert wh.clean_temp_files("jobs", full=True) == 1 and orphan.exists() is False


LOCK_HOLDER = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


def test_readers_do_not_need_the_catalog_lock(wh):
    wh.write("jobs", jobs([("a", "1", 0, "FAILED", 1)]), "b1")
    proc = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(wh.root / CATALOG)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(duckdb.Error):
            duckdb.connect(str(wh.root / CATALOG), read_only=True)
        other = Warehouse(wh.root)  # version check through the JSON mirror
        assert other.read("jobs")["job_id"].to_list() == ["1"]
        other.write("jobs", jobs([("a", "2", 0, "FAILED", 1)]), "b2")  # its view is over files already
        assert other.read("jobs")["job_id"].to_list() == ["1", "2"]
        events = pl.DataFrame({"cluster": ["a"], "node": ["gpu001"], "ts": [ts(1)], "kind": ["drain"],
                               "reason": ["xid 79"]}).with_columns(date=pl.col("ts").dt.date())
        with pytest.warns(UserWarning, match="catalog .* not updated"):  # a first view cannot be made
            other.write("node_events", events, "e1")
        assert other.read("node_events")["node"].to_list() == ["gpu001"]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


# ---------------------------------------------------------------- catalog, empty warehouse, version

def test_fresh_warehouse_queries_never_fail(wh):
    for table in schema.TABLES:
        got = wh.read(table)
        assert got.height == 0 and got.schema == pl.Schema(columns(table))
        assert wh.read_window(table, "2024-01-01", "2024-01-02").schema == pl.Schema(columns(table))
    q = ("SELECT d.outcome, count(*) AS n FROM diagnoses d JOIN jobs j USING (cluster, job_id, attempt) "
         "WHERE list_contains(d.culprit_nodes, 'gpu001') GROUP BY 1")
    assert wh.sql(q).height == 0
    con = duckdb.connect(str(wh.root / CATALOG), read_only=True)
    try:
        views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
        assert views == set(schema.TABLES) | {f"{t}_all" for t in schema.TABLES}
        assert con.execute("SELECT count(*) FROM logs").fetchone() == (0,)
        assert con.execute("SELECT value FROM faultline_meta WHERE key = 'schema_version'").fetchone() == (
            str(schema.SCHEMA_VERSION),)
    finally:
        con.close()


def test_catalog_views_follow_writes(wh):
    wh.write("diagnoses", diagnoses([("a", "1", "nvlink", "gpu003", False, 8.0)]), "d1")
    con = duckdb.connect(str(wh.root / CATALOG), read_only=True)
    try:
        assert con.execute("SELECT job_id, outcome, date FROM diagnoses").fetchall() == [
            ("1", "nvlink", dt.date(2024, 5, 2))]
    finally:
        con.close()


@pytest.mark.parametrize("where", ["both", "catalog_only"])
def test_newer_schema_version_is_refused(tmp_path, where, capsys):
    root = tmp_path / "warehouse"
    Warehouse(root).write("jobs", jobs([("a", "1", 0, "FAILED", 1)]), "b1")
    con = duckdb.connect(str(root / CATALOG))
    con.execute("UPDATE faultline_meta SET value = '99' WHERE key = 'schema_version'")
    con.close()
    if where == "both":
        (root / META_JSON).write_text(json.dumps({"schema_version": 99}))
    else:
        (root / META_JSON).unlink()
    with pytest.raises(SchemaVersionError, match="schema version 99, newer than this faultline"):
        Warehouse(root)
    assert main(["sql", "--data-dir", str(tmp_path), "SELECT 1"]) == 2
    assert "schema version 99" in capsys.readouterr().err


# ---------------------------------------------------------------- window pruning

def test_read_window_reads_only_the_window_partitions(wh):
    rows = [(c, f"{c}{d}", 0, "FAILED", d) for c in ("a", "b") for d in (1, 2, 3, 4)]
    wh.write("jobs", jobs(rows), "b1")
    files = wh.files("jobs", dt.date(2024, 5, 2), ts(3, 23), clusters=["b"])
    assert [str(p.relative_to(wh.root / "jobs")) for p in files] == [
        "cluster=b/date=2024-05-02/b1.parquet", "cluster=b/date=2024-05-03/b1.parquet"]
    # corrupt every file outside the window: a window read must not open them
    for p in (wh.root / "jobs").rglob("*.parquet"):
        if p not in files:
            p.write_bytes(b"not parquet at all")
    got = wh.read_window("jobs", "2024-05-02", "2024-05-03", clusters=["b"])
    assert got["job_id"].to_list() == ["b2", "b3"]
    assert wh.read_window("jobs", "2024-05-02", "2024-05-03", ["b"], where="job_id = $j",
                          params={"j": "b3"}).height == 1
    with pytest.raises(QueryError):
        wh.read("jobs")


# ---------------------------------------------------------------- faultline sql

@pytest.fixture
def data_dir(tmp_path) -> Path:
    wh = Warehouse(tmp_path / "warehouse")
    wh.write("jobs", jobs([("a", "1", 0, "FAILED", 1), ("a", "2", 0, "NODE_FAIL", 1),
                           ("b", "3", 0, "COMPLETED", 2)]), "collect-1")
    wh.write("diagnoses", diagnoses([("a", "1", "gpu_hardware", "gpu001", False, 32.0),
                                     ("a", "2", "node_failure", "gpu001", True, 16.0),
                                     ("b", "3", "healthy", None, False, 0.0)]), "diagnose-1")
    return tmp_path


def test_cli_sql_table_csv_json(data_dir, capsys):
    q = "SELECT job_id, outcome, culprit_nodes FROM diagnoses ORDER BY job_id"
    assert main(["sql", "--data-dir", str(data_dir), q]) == 0
    out = capsys.readouterr().out
    assert "gpu_hardware" in out and "node_failure" in out and "healthy" in out and "(3 rows)" in out
    assert main(["sql", "--data-dir", str(data_dir), q, "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "job_id,outcome,culprit_nodes" and lines[1] == '1,gpu_hardware,"[""gpu001""]"'
    assert main(["sql", "--data-dir", str(data_dir), q, "--format", "json", "--limit", "2"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out) == [{"job_id": "1", "outcome": "gpu_hardware", "culprit_nodes": ["gpu001"]},
                                   {"job_id": "2", "outcome": "node_failure", "culprit_nodes": ["gpu001"]}]
    assert "first 2 rows" in cap.err


def test_cli_sql_bad_query_exits_2_without_traceback(data_dir, capsys):
    for q in ["SELEC outcome FROM diagnoses", "SELECT nope FROM jobs", "SELECT * FROM no_such_table"]:
        assert main(["sql", "--data-dir", str(data_dir), q]) == 2
        err = capsys.readouterr().err
        assert err.startswith("faultline: SQL error:") and err.count("\n") == 1
    assert main(["sql", "--data-dir", str(data_dir / "nowhere"), "SELECT 1"]) == 2
    assert "no warehouse at" in capsys.readouterr().err
    r = subprocess.run([sys.executable, "-m", "faultline", "sql", "--data-dir", str(data_dir), "SELECT * FROM"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "SQL error" in r.stderr and "Traceback" not in r.stderr


def test_readme_warehouse_queries_run(data_dir):
    text = README.read_text()
    section = text[text.index("## Warehouse"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    queries = re.findall(r'^faultline sql "(.+?)"\s*$', section, flags=re.M)
    assert len(queries) >= 4
    wh = Warehouse(data_dir / "warehouse")
    results = [wh.sql(q.replace("'4200080'", "'1'")) for q in queries]
    assert all(r.height for r in results)  # the fixture has a repeat offender and an ambiguous verdict
    evidence = [r for q, r in zip(queries, results) if "evidence" in q][0]
    assert evidence["rule"].to_list() == ["gpu_hardware.rule"]
