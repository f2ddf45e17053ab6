"""The warehouse store: Hive-partitioned Parquet files plus a DuckDB catalog of views.

Layout (see schema.py for tables, keys and partitioning)::

    <root>/<table>/cluster=<c>/date=<YYYY-MM-DD>/<batch>.parquet
    <root>/catalog.duckdb          views <table> (deduped by key) and <table>_all, table faultline_meta
    <root>/faultline_meta.json     mirror of faultline_meta, readable without DuckDB's file lock

Design:

- Partition columns live only in the folder names, never inside the files (Hive convention):
  DuckDB restores them with explicit `hive_types` (cluster VARCHAR, date DATE), so they come
  out once, with the right type, even for a cluster named "007".
- A write replaces the whole batch: it first records its temp file names in a journal
  (`<table>/.writing-<host>-<pid>-<rand>.json`), writes each partition's file to a hidden temp
  file in the same folder (`.<batch>.parquet.tmp-<host>-<pid>-<rand>`, which no `*.parquet`
  glob matches), fsyncs them, and only when all are complete `os.replace`s them over
  `<batch>.parquet`; files of the batch in partitions the new write no longer touches are
  removed last. Each partition is replaced atomically (a reader sees the old file or the new
  one, never a torn one). A killed writer leaves ignored temp files; the next write to the
  table removes them through the dead writer's journal (no listing of every partition).
- Readers keep the newest row per key (`_written_at` DESC, then `_batch` DESC), so
  overlapping batches never duplicate.
- Transactions: the rows of a batch of TX_TABLES (jobs, allocations, logs, coverage, symptoms,
  diagnoses) are visible only once the batch has a row in `commits`, the commit log, written after
  all its files (`Warehouse.transaction`; a plain `write` of such a table commits at once). Readers
  take the committed set before they list data files, so they see a batch whole or not at all. A
  transaction records the files it publishes in `_tx/<batch>.json`; a killed one leaves files no
  reader shows, removed by the next transaction (dead pid, or older than an hour).
- Readers never open the catalog file: every read builds the same views in an in-memory
  DuckDB over the files, so a concurrent writer (which holds the catalog's lock) never blocks
  them. The catalog is for the writer and for external tools (`duckdb <root>/catalog.duckdb`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa

from faultline.warehouse.schema import KEYS, OPTIONAL, PARTITION_BY, SCHEMA_VERSION, TABLES, TS, TX_TABLES

CATALOG = "catalog.duckdb"
META_JSON = "faultline_meta.json"
META_COLUMNS: dict[str, pl.DataType] = {"_batch": pl.String, "_written_at": TS}
PARTITION_TYPES: dict[str, pl.DataType] = {"cluster": pl.String, "date": pl.Date}
TMP_MARK = ".parquet.tmp-"
TX_DIR = "_tx"
COMMITS = "commits"
JOURNAL_PREFIX = ".writing-"
STALE_TMP_SECONDS = 3600.0

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_inflight: set[str] = set()  # temp files this process is writing right now
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()
_dbs: dict[str, duckdb.DuckDBPyConnection] = {}  # one in-memory DuckDB per warehouse root, for readers


class WarehouseError(Exception):
    """A warehouse problem worth a clear one-line message (no traceback needed)."""


class SchemaMismatchError(WarehouseError, ValueError):
    """A frame does not fit its table's schema."""


class SchemaVersionError(WarehouseError):
    """The warehouse was written by a newer faultline."""


class QueryError(WarehouseError):
    """DuckDB rejected a query (syntax, unknown column, ...)."""


# ---------------------------------------------------------------- schema helpers

def columns(table: str) -> dict[str, pl.DataType]:
    """Ordered full schema of `table` as readers return it: cluster, date, the table's other
    columns in schema.py order, then _batch and _written_at."""
    _check_table(table)
    out: dict[str, pl.DataType] = dict(PARTITION_TYPES)
    out.update({c: t for c, t in TABLES[table].items() if c not in PARTITION_TYPES})
    out.update(META_COLUMNS)
    return out


def duckdb_type(dtype: pl.DataType) -> str:
    """The DuckDB SQL type of a Polars dtype used in schema.py."""
    if isinstance(dtype, pl.List):
        return f"{duckdb_type(dtype.inner)}[]"
    if isinstance(dtype, pl.Datetime):
        return "TIMESTAMPTZ" if dtype.time_zone else "TIMESTAMP"
    simple = {pl.String: "VARCHAR", pl.Int32: "INTEGER", pl.Int64: "BIGINT", pl.Float64: "DOUBLE",
              pl.Boolean: "BOOLEAN", pl.Date: "DATE", pl.Int16: "SMALLINT", pl.Int8: "TINYINT",
              pl.Float32: "FLOAT", pl.UInt32: "UINTEGER", pl.UInt64: "UBIGINT"}
    for k, v in simple.items():
        if dtype == k:
            return v
    raise TypeError(f"no DuckDB type for {dtype}")


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _check_table(table: str) -> None:
    if table not in TABLES:
        raise WarehouseError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")


def _check_name(kind: str, value: str) -> None:
    if not isinstance(value, str) or not _NAME.match(value) or value.endswith(".tmp"):
        raise WarehouseError(f"invalid {kind} {value!r}: use letters, digits, '.', '_' and '-' "
                             "(it becomes a file or folder name)")


def _as_date(value: dt.date | dt.datetime | str) -> dt.date:
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc)
        return value.date()
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str):
        return dt.date.fromisoformat(value[:10])
    raise TypeError(f"not a date: {value!r}")


def _conform_expr(name: str, src: pl.DataType, dst: pl.DataType) -> pl.Expr:
    col = pl.col(name)
    if src == dst:
        return col
    if src == pl.String and dst == pl.Date:
        return col.str.to_date("%Y-%m-%d", strict=True)
    if src == pl.String and isinstance(dst, pl.Datetime):
        return col.str.to_datetime(time_unit="us", time_zone="UTC", strict=True)
    if isinstance(src, pl.Datetime) and dst == pl.Date:
        return (col.dt.convert_time_zone("UTC") if src.time_zone else col).dt.date()
    if isinstance(src, pl.Datetime) and isinstance(dst, pl.Datetime) and not src.time_zone and dst.time_zone:
        return col.dt.replace_time_zone(dst.time_zone).dt.cast_time_unit(dst.time_unit)
    return col.cast(dst, strict=True)


def conform(table: str, frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` cast to `table`'s schema (plus `date`) in reader column order; a clear
    SchemaMismatchError on missing or extra columns or values that do not cast."""
    want = {c: t for c, t in columns(table).items() if c not in META_COLUMNS}
    have = frame.schema
    fill = [c for c in OPTIONAL.get(table, ()) if c not in have]
    if fill:
        frame = frame.with_columns(pl.lit(None, want[c]).alias(c) for c in fill)
        have = frame.schema
    missing = [c for c in want if c not in have]
    extra = [c for c in have if c not in want and c not in META_COLUMNS]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing column(s) {', '.join(missing)}")
        if extra:
            parts.append(f"unexpected column(s) {', '.join(extra)}")
        raise SchemaMismatchError(f"{table}: {'; '.join(parts)} (schema: faultline/warehouse/schema.py)")
    out = {}
    for c, t in want.items():
        try:
            out[c] = frame.select(_conform_expr(c, have[c], t).alias(c)).to_series()
        except (pl.exceptions.PolarsError, TypeError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0]
            raise SchemaMismatchError(f"{table}.{c}: cannot cast {have[c]} to {t}: {first}") from None
    df = pl.DataFrame(out)
    for c in PARTITION_BY:
        if df[c].null_count():
            raise SchemaMismatchError(f"{table}: {df[c].null_count()} row(s) with a null {c} (it chooses the partition)")
    return df


# ---------------------------------------------------------------- SQL generation

def _empty_select(table: str) -> str:
    cols = ", ".join(f"CAST(NULL AS {duckdb_type(t)}) AS {_q(c)}" for c, t in columns(table).items())
    return f"SELECT {cols} WHERE false"


def _scan(paths: str | Sequence[str]) -> str:
    src = _lit(paths) if isinstance(paths, str) else "[" + ", ".join(_lit(p) for p in paths) + "]"
    hive = "{" + ", ".join(f"{_lit(c)}: {_lit(duckdb_type(t))}" for c, t in PARTITION_TYPES.items()) + "}"
    parts = ", ".join(_q(c) for c in PARTITION_TYPES)
    # partition columns first, then the file's columns (written in schema order)
    return (f"SELECT {parts}, * EXCLUDE ({parts}) FROM read_parquet({src}, hive_partitioning=true, "
            f"union_by_name=true, hive_types={hive})")


def _dedupe(table: str, select_all: str) -> str:
    key = KEYS.get(table)
    if not key:
        return select_all
    part = ", ".join(_q(c) for c in key)
    return (f"SELECT * FROM ({select_all}) QUALIFY row_number() OVER "
            f"(PARTITION BY {part} ORDER BY _written_at DESC, _batch DESC) = 1")


def _order_by(table: str) -> str:
    key = KEYS.get(table) or list(PARTITION_BY)
    cols = list(dict.fromkeys([*key, *PARTITION_BY]))
    return " ORDER BY " + ", ".join(f"{_q(c)} NULLS FIRST" for c in cols)


# ---------------------------------------------------------------- the store

class Warehouse:
    """Partitioned Parquet tables under `root` and the DuckDB catalog over them.

    `create=False` opens an existing warehouse only (a reader that must not create folders).
    """

    def __init__(self, root: Path | str, create: bool = True):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            if not create:
                raise WarehouseError(f"no warehouse at {self.root}")
            self.root.mkdir(parents=True, exist_ok=True)
        self.catalog_path = self.root / CATALOG
        stored = self.stored_version()
        self._check_version(stored)
        if create:
            if stored is not None and stored < 2 and not (self.root / COMMITS).is_dir():
                self._commit_legacy_batches()
            (self.root / COMMITS).mkdir(exist_ok=True)
        if create and (not self.catalog_path.exists() or (stored is not None and stored < SCHEMA_VERSION)):
            self._update_catalog(list(TABLES), required=False)

    def _commit_legacy_batches(self) -> None:
        """A warehouse of schema 1 had no commit log: every batch it holds counts as committed."""
        rows = set()
        for table in TX_TABLES:
            for p in self.files(table):
                rows.add((p.parent.parent.name.removeprefix("cluster="), p.stem))
        if rows:
            now = dt.datetime.now(dt.timezone.utc)
            frame = pl.DataFrame({"cluster": [c for c, _ in sorted(rows)], "batch": [b for _, b in sorted(rows)]})
            self._write_commit_rows(frame.with_columns(kind=pl.lit("schema-1")), "schema-1", now)

    # ------------------------------------------------------------ schema version

    def stored_version(self) -> int | None:
        """The schema version recorded in the warehouse (None on a fresh one)."""
        meta = self.root / META_JSON
        if meta.exists():
            try:
                return int(json.loads(meta.read_text())["schema_version"])
            except (ValueError, KeyError, TypeError, OSError):
                pass
        if self.catalog_path.exists():
            try:
                con = duckdb.connect(str(self.catalog_path), read_only=True)
            except duckdb.Error:
                return None  # locked by the writer; the JSON mirror is the lock-free copy
            try:
                row = con.execute("SELECT value FROM faultline_meta WHERE key = 'schema_version'").fetchone()
                return int(row[0]) if row else None
            except duckdb.Error:
                return None
            finally:
                con.close()
        return None

    def _check_version(self, found: int | None | str = "stored") -> None:
        found = self.stored_version() if found == "stored" else found
        if found is not None and found > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"the warehouse at {self.root} has schema version {found}, newer than this faultline "
                f"understands ({SCHEMA_VERSION}); upgrade faultline to read or write it")

    # ------------------------------------------------------------ catalog

    def _meta(self) -> dict:
        try:
            meta = json.loads((self.root / META_JSON).read_text())
            return meta if isinstance(meta, dict) else {}
        except (OSError, ValueError):
            return {}

    def _update_catalog(self, tables: Iterable[str], required: bool = True, force: bool = False) -> None:
        """Create/refresh the catalog views of `tables` and faultline_meta (writer side). A view over a
        table's files (a glob) never changes once made: the JSON mirror lists those tables, and a write
        to one of them skips the catalog (a DuckDB file open and fsync per write, otherwise)."""
        tables = list(tables)
        meta = self._meta()
        views = meta.get("views") if isinstance(meta.get("views"), dict) else {}
        if (not force and meta.get("root") == str(self.root) and meta.get("schema_version") == SCHEMA_VERSION
                and all(views.get(t) == self._has_files(t) for t in _with_commits(tables))):
            return  # every view is already what it would be made
        lock = _lock_for(str(self.catalog_path))
        with lock:
            try:
                con = duckdb.connect(str(self.catalog_path))
            except duckdb.Error as exc:
                # another process holds the catalog: views read the files at query time, so the
                # data is still visible; only a view created before its table had files is stale
                msg = f"faultline: catalog {self.catalog_path} not updated: {str(exc).splitlines()[0]}"
                if required:
                    warnings.warn(msg, stacklevel=3)
                return
            try:
                con.execute("CREATE TABLE IF NOT EXISTS faultline_meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
                row = con.execute("SELECT value FROM faultline_meta WHERE key = 'schema_version'").fetchone()
                self._check_version(int(row[0]) if row else None)
                stored_root = con.execute("SELECT value FROM faultline_meta WHERE key = 'root'").fetchone()
                if (row is None or int(row[0]) < SCHEMA_VERSION
                        or stored_root is None or stored_root[0] != str(self.root)):
                    tables, meta = list(TABLES), {}  # fresh, upgraded or moved warehouse: every view
                con.execute("SET TimeZone = 'UTC'")
                views = dict(meta.get("views") or {}) if isinstance(meta.get("views"), dict) else {}
                for table in _with_commits(tables):
                    for name, body in self._view_sql(table).items():
                        con.execute(f"CREATE OR REPLACE VIEW {_q(name)} AS {body}")
                    views[table] = self._has_files(table)
                con.execute("INSERT OR REPLACE INTO faultline_meta VALUES ('schema_version', ?), ('root', ?)",
                            [str(SCHEMA_VERSION), str(self.root)])
            finally:
                con.close()
            _atomic_write_text(self.root / META_JSON, json.dumps(
                {"schema_version": SCHEMA_VERSION, "root": str(self.root), "views": views}) + "\n")

    def refresh_catalog(self) -> None:
        """Recreate every view of the catalog file (after copying or moving a warehouse)."""
        self._update_catalog(list(TABLES), force=True)

    def _has_files(self, table: str) -> bool:
        tdir = self.root / table
        if not tdir.is_dir():
            return False
        return any(True for _ in tdir.glob("cluster=*/date=*/*.parquet"))

    def _transactional(self, table: str) -> bool:
        """Does `table` show committed batches only? (Not in a schema-1 warehouse no writer has opened.)"""
        return table in TX_TABLES and (self.root / COMMITS).is_dir()

    def _view_sql(self, table: str) -> dict[str, str]:
        if self._has_files(table):
            all_ = _scan(str(self.root / table / "cluster=*" / "date=*" / "*.parquet"))
            if self._transactional(table):
                all_ = f"SELECT * FROM ({all_}) WHERE _batch IN (SELECT batch FROM {_q(COMMITS + '_all')})"
        else:
            all_ = _empty_select(table)
        return {f"{table}_all": all_, table: _dedupe(table, f"SELECT * FROM {_q(table + '_all')}")}

    # ------------------------------------------------------------ write

    def write(self, table: str, frame: pl.DataFrame, batch: str, *, commit: bool = True,
              on_plan: Callable[[list[Path]], None] | None = None) -> int:
        """Write `frame` (cluster, date and TABLES[table] columns) as batch `batch`, replacing
        whatever that batch held before. Returns the number of rows written. A table of TX_TABLES
        is committed at once unless `commit=False` (then the batch stays invisible until
        `commit`); `on_plan` hears the files about to be published, before they are."""
        _check_table(table)
        _check_name("batch", batch)
        df = conform(table, frame)
        for c in df["cluster"].unique().to_list():
            _check_name("cluster", c)
        key = KEYS.get(table)
        if key and df.height:
            df = df.unique(subset=key, keep="last", maintain_order=True)
        written_at = dt.datetime.now(dt.timezone.utc)
        df = df.with_columns(pl.lit(batch, pl.String).alias("_batch"),
                             pl.lit(written_at, TS).alias("_written_at"))
        tdir = self.root / table
        with _lock_for(str(tdir)):
            self.clean_temp_files(table)
            old = set(tdir.glob(f"cluster=*/date=*/{batch}.parquet")) if tdir.is_dir() else set()
            plan: list[tuple[pl.DataFrame, Path, Path]] = []  # (rows, temp file, final file)
            if df.height:
                parts = df.partition_by(list(PARTITION_BY), as_dict=True, maintain_order=True)
                for (cluster, day), part in sorted(parts.items(), key=lambda kv: (kv[0][0], kv[0][1])):
                    pdir = tdir / f"cluster={cluster}" / f"date={day.isoformat()}"
                    tmp = pdir / f".{batch}{TMP_MARK}{_owner()}-{uuid.uuid4().hex[:8]}"
                    plan.append((part.drop(list(PARTITION_BY)), tmp, pdir / f"{batch}.parquet"))
            # the journal names this write's temp files before they exist, so the next write can
            # remove them if this process dies, without listing every partition folder
            journal = tdir / f"{JOURNAL_PREFIX}{_owner()}-{uuid.uuid4().hex[:8]}.json"
            pending = {str(tmp) for _, tmp, _ in plan} | {str(journal)}
            _inflight.update(pending)
            try:
                if plan and on_plan is not None:
                    on_plan([final for _, _, final in plan])
                if plan:
                    tdir.mkdir(parents=True, exist_ok=True)
                    journal.write_text(json.dumps([str(tmp.relative_to(tdir)) for _, tmp, _ in plan]))
                for part, tmp, _ in plan:
                    tmp.parent.mkdir(parents=True, exist_ok=True)
                    _write_parquet(part, tmp)
                for _, tmp, final in plan:  # every file complete: now publish them
                    os.replace(tmp, final)
                    pending.discard(str(tmp))
                for pdir in {final.parent for _, _, final in plan}:
                    _fsync_dir(pdir)
            finally:
                for path in pending:
                    Path(path).unlink(missing_ok=True)
                _inflight.difference_update({str(tmp) for _, tmp, _ in plan} | {str(journal)})
            for stale in old - {final for _, _, final in plan}:
                stale.unlink(missing_ok=True)
                _remove_empty_dirs(stale.parent, tdir)
        self._update_catalog([table])
        if commit and table in TX_TABLES and df.height:
            self.commit(batch, df["cluster"].unique().sort().to_list(), kind="write")
        return df.height

    # ------------------------------------------------------------ commit log and transactions

    def commit(self, batch: str, clusters: Sequence[str], kind: str = "write", **info: Any) -> None:
        """Make `batch` visible: one row per cluster in `commits` (columns of schema.TABLES['commits'],
        `info` fills the others). Written after every file of the batch."""
        _check_name("batch", batch)
        now = dt.datetime.now(dt.timezone.utc)
        frame = pl.DataFrame({"cluster": list(clusters)}, schema={"cluster": pl.String}).with_columns(
            batch=pl.lit(batch), kind=pl.lit(kind))
        for k, v in info.items():
            dtype = TABLES[COMMITS][k]
            frame = frame.with_columns(pl.Series(k, [v] * frame.height, dtype=dtype))
        self._write_commit_rows(frame, batch, now)

    def _write_commit_rows(self, frame: pl.DataFrame, batch: str, now: dt.datetime) -> None:
        schema = TABLES[COMMITS]
        frame = frame.with_columns(committed_at=pl.lit(now, TS))
        frame = frame.select([pl.col(c).cast(t) if c in frame.columns else pl.lit(None, t).alias(c)
                              for c, t in schema.items()])
        self.write(COMMITS, frame.with_columns(date=pl.lit(now.date(), pl.Date)), batch)
        for cluster in frame["cluster"].unique().to_list():
            self.compact_commits(cluster)

    def committed(self, clusters: Iterable[str] | None = None) -> set[str]:
        """Names of the committed batches (of `clusters` when given), from the commit log. The log's files
        are listed again after reading: a compaction in between (files added and removed) reads again."""
        for _ in range(8):
            before = self.files(COMMITS, clusters=clusters)
            try:
                names = (pl.scan_parquet(before, hive_partitioning=False).select("batch").collect()["batch"]
                         if before else pl.Series("batch", [], pl.String))
            except (FileNotFoundError, pl.exceptions.ComputeError, OSError):
                continue
            if self.files(COMMITS, clusters=clusters) == before:
                return set(names.to_list())
        raise WarehouseError(f"the commit log under {self.root / COMMITS} kept changing while read")

    def compact_commits(self, cluster: str, keep: int = 64) -> int:
        """Merge the commit log of `cluster` into one file per day once it has more than `keep` files (one
        commit is one small file). The merged file is published before the small ones go, and readers
        list the log again after reading it, so no commit is ever missed. Returns the files merged."""
        files = self.files(COMMITS, clusters=[cluster])
        if len(files) <= keep:
            return 0
        rows = self.read_window(COMMITS, None, None, [cluster])
        self.write(COMMITS, rows.drop("_batch", "_written_at"), f"compact-{uuid.uuid4().hex[:12]}")
        for p in files:
            p.unlink(missing_ok=True)
        return len(files)

    def commits(self, where: str | None = None, params: Sequence[Any] | None = None) -> pl.DataFrame:
        return self.read(COMMITS, where, params)

    def transaction(self, batch: str, clusters: Sequence[str], kind: str, **info: Any) -> "Transaction":
        """`with wh.transaction(batch, [cluster], "collect") as tx: tx.write("jobs", ...); ...` writes
        every table of the batch and commits it on leaving the block without an exception."""
        return Transaction(self, batch, list(clusters), kind, info)

    def clean_transactions(self) -> int:
        """Remove the files of transactions whose writer died before committing (dead pid of this
        host, this process's own leftovers, or journals older than an hour); returns files removed."""
        tx_dir = self.root / TX_DIR
        if not tx_dir.is_dir():
            return 0
        removed = 0
        committed: set[str] | None = None
        for journal in tx_dir.glob("*.json"):
            if str(journal) in _inflight or not _abandoned(journal):
                continue
            try:
                doc = json.loads(journal.read_text())
            except (OSError, ValueError):
                doc = {}
            if committed is None:
                committed = self.committed()
            if doc.get("batch") not in committed:
                for rel in doc.get("files", []):
                    path = self.root / str(rel)
                    if self.root in path.parents and path.name.endswith(".parquet") and path.exists():
                        path.unlink(missing_ok=True)
                        removed += 1
            journal.unlink(missing_ok=True)
        return removed

    def clean_temp_files(self, table: str, full: bool = False) -> int:
        """Remove temp files of writers that died (dead pid, or older than an hour): those
        named by their journals, and with full=True any temp file in any partition folder."""
        tdir = self.root / table
        if not tdir.is_dir():
            return 0
        removed = 0
        for journal in tdir.glob(f"{JOURNAL_PREFIX}*.json"):
            if str(journal) in _inflight or not _abandoned(journal):
                continue
            try:
                names = json.loads(journal.read_text())
            except (OSError, ValueError):
                names = []  # died while writing the journal: no temp file exists yet
            for name in names if isinstance(names, list) else []:
                tmp = tdir / str(name)
                if TMP_MARK in tmp.name and tdir in tmp.parents and tmp.exists():
                    tmp.unlink(missing_ok=True)
                    removed += 1
            journal.unlink(missing_ok=True)
        if full:
            for tmp in tdir.glob(f"cluster=*/date=*/.*{TMP_MARK}*"):
                if str(tmp) not in _inflight and _abandoned(tmp):
                    tmp.unlink(missing_ok=True)
                    removed += 1
        return removed

    # ------------------------------------------------------------ read

    def files(self, table: str, start=None, end=None, clusters: Iterable[str] | None = None,
              batches: Iterable[str] | None = None) -> list[Path]:
        """Published Parquet files of `table`, only of partitions with start <= date <= end
        (inclusive; datetimes count by their UTC day), of `clusters` and `batches` when given.
        Lists folder names to choose partitions: files of other partitions are never touched."""
        _check_table(table)
        tdir = self.root / table
        if not tdir.is_dir():
            return []
        if isinstance(clusters, str):
            clusters = [clusters]
        lo = _as_date(start) if start is not None else None
        hi = _as_date(end) if end is not None else None
        wanted = set(clusters) if clusters is not None else None
        names = {f"{b}.parquet" for b in batches} if batches is not None else None
        out: list[Path] = []
        for cdir in sorted(tdir.iterdir()):
            if not cdir.is_dir() or not cdir.name.startswith("cluster="):
                continue
            if wanted is not None and cdir.name.removeprefix("cluster=") not in wanted:
                continue
            for ddir in sorted(cdir.iterdir()):
                if not ddir.is_dir() or not ddir.name.startswith("date="):
                    continue
                try:
                    day = dt.date.fromisoformat(ddir.name.removeprefix("date="))
                except ValueError:
                    continue
                if (lo and day < lo) or (hi and day > hi):
                    continue
                out.extend(sorted(p for p in ddir.iterdir()
                                  if p.name.endswith(".parquet") and not p.name.startswith(".")
                                  and (names is None or p.name in names)))
        return out

    def read(self, table: str, where: str | None = None, params: Sequence[Any] | Mapping[str, Any] | None = None,
             *, dedupe: bool = True) -> pl.DataFrame:
        """Rows of `table` (newest row per key unless dedupe=False), optionally filtered by a
        SQL predicate `where` with `?` or `$name` parameters; sorted by key."""
        # the files listed at query time, as read_window does: no view to bind first (binding reads
        # every file's footer once more)
        return self.read_window(table, None, None, where=where, params=params, dedupe=dedupe)

    def read_window(self, table: str, start, end, clusters: Iterable[str] | None = None,
                    where: str | None = None, params: Sequence[Any] | Mapping[str, Any] | None = None,
                    *, dedupe: bool = True, batches: Iterable[str] | None = None,
                    columns: Sequence[str] | None = None) -> pl.DataFrame:
        """Like read(), over the partitions of dates start..end (inclusive) and `clusters` only
        (and the files of `batches` when given; only `columns` when given). Dedupe sees only those
        partitions (a key lives in one partition: its date is derived from the row)."""
        batches = set(batches) if batches is not None else None

        def build() -> str:  # listed again on a retry: a concurrent writer may have replaced files
            visible = batches
            if self._transactional(table):  # the commit log first, then the files: whole batches only
                done = self.committed(clusters)
                visible = done if visible is None else visible & done
            paths = self.files(table, start, end, clusters, visible)
            body = _scan([str(p) for p in paths]) if paths else _empty_select(table)
            if dedupe:
                body = _dedupe(table, body)
            sel = ", ".join(_q(c) for c in columns) if columns else "*"
            return f"SELECT {sel} FROM ({body})" + (f" WHERE {where}" if where else "") + _order_by(table)

        return self._typed(table, self._run(build, params, []), columns)

    def sql(self, query: str, params: Sequence[Any] | Mapping[str, Any] | None = None,
            limit: int | None = None) -> pl.DataFrame:
        """Run any DuckDB query over the table views (`<table>` deduped, `<table>_all` not),
        with `?` or `$name` parameters. With `limit`, DuckDB stops after that many rows (ask
        for one more than you show to tell whether there were more)."""
        return self._run(lambda: query, params, _mentioned_tables(query), limit=limit)

    # ------------------------------------------------------------ internals

    def _connect(self, tables: Iterable[str]) -> duckdb.DuckDBPyConnection:
        """A cursor of this process's in-memory DuckDB for the warehouse (opening a database costs ~30 ms,
        a cursor well under 1 ms), with this query's views as temporary (cursor-local) views."""
        key = str(self.root)
        with _locks_guard:
            db = _dbs.get(key)
            if db is None:
                db = duckdb.connect()
                # Partitions are read side by side: together they get a bounded share and spill.
                db.execute(f"SET memory_limit = '{os.environ.get('FAULTLINE_DUCKDB_MEMORY', '2GB')}'")
                db.execute(f"SET temp_directory = '{self.root / '.duckdb_tmp'}'")
                _dbs[key] = db
        con = db.cursor()
        con.execute("SET TimeZone = 'UTC'")
        for table in _with_commits(tables):
            for name, body in self._view_sql(table).items():
                con.execute(f"CREATE OR REPLACE TEMP VIEW {_q(name)} AS {body}")
        return con

    def _run(self, build: Callable[[], str], params, tables: Iterable[str],
             limit: int | None = None) -> pl.DataFrame:
        tables = list(tables)
        for attempt in range(4):
            con = None
            try:
                con = self._connect(tables)
                query = build()
                rel = con.sql(query, params=params) if params is not None else con.sql(query)
                if rel is None:  # a statement without a result (SET, CREATE ...)
                    return pl.DataFrame()
                if limit is None:
                    return pl.from_arrow(rel.to_arrow_table())
                reader = rel.to_arrow_reader(batch_size=min(max(limit, 1), 100_000))
                batches, n = [], 0
                try:
                    for b in reader:
                        if n >= limit:
                            break
                        batches.append(b.slice(0, limit - n))
                        n += batches[-1].num_rows
                finally:
                    reader.close()
                return pl.from_arrow(pa.Table.from_batches(batches, schema=reader.schema))
            except duckdb.IOException as exc:
                # a concurrent writer replaced or removed a file between listing and opening: retry
                if attempt == 3:
                    raise QueryError(_one_line(exc)) from None
                time.sleep(0.05 * (attempt + 1))
            except duckdb.Error as exc:
                raise QueryError(_one_line(exc)) from None
            finally:
                if con is not None:
                    con.close()
        raise AssertionError("unreachable")

    def _typed(self, table: str, df: pl.DataFrame, only: Sequence[str] | None = None) -> pl.DataFrame:
        exprs = []
        want = columns(table)
        if only:
            want = {c: want[c] for c in only}
        for c, t in want.items():
            exprs.append(pl.col(c).cast(t) if c in df.columns else pl.lit(None, t).alias(c))
        return df.select(exprs) if df.width else pl.DataFrame(schema=want)


# ---------------------------------------------------------------- file helpers

def _write_parquet(df: pl.DataFrame, path: Path) -> None:
    """Write a complete Parquet file at `path` (a temp name) and flush it to disk."""
    with open(path, "xb") as f:
        df.write_parquet(f, compression="zstd", statistics=True)
        f.flush()
        os.fsync(f.fileno())


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_empty_dirs(path: Path, stop: Path) -> None:
    while path != stop and stop in path.parents:
        try:
            path.rmdir()
        except OSError:
            return
        path = path.parent


def _owner() -> str:
    """host-pid of this process, part of temp and journal names."""
    return f"{re.sub(r'[^A-Za-z0-9.]', '_', socket.gethostname()) or 'host'}-{os.getpid()}"


def _abandoned(path: Path) -> bool:
    """A temp or journal file whose writer is gone: a dead pid of this host (or this process's
    own leftover), or any file over an hour old (the only test for writers on other hosts)."""
    try:
        if time.time() - path.stat().st_mtime > STALE_TMP_SECONDS:
            return True
    except FileNotFoundError:
        return False
    m = re.search(r"([A-Za-z0-9._]+)-(\d+)-[0-9a-f]{8}(?:\.json)?$", path.name)
    if not m:
        return False
    host, pid = m.group(1), int(m.group(2))
    if host != _owner().rsplit("-", 1)[0]:
        return False
    return pid == os.getpid() or not _pid_alive(pid)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _with_commits(tables: Iterable[str]) -> list[str]:
    """`tables`, with the commit log first when a transactional table needs its view."""
    tables = list(tables)
    if any(t in TX_TABLES for t in tables) and COMMITS not in tables:
        tables = [COMMITS, *tables]
    return sorted(tables, key=lambda t: t != COMMITS)


class Transaction:
    """The writes of one batch across tables, visible together once committed (Warehouse.transaction)."""

    def __init__(self, wh: Warehouse, batch: str, clusters: list[str], kind: str, info: dict):
        _check_name("batch", batch)
        self.wh, self.batch, self.clusters, self.kind, self.info = wh, batch, clusters, kind, dict(info)
        self.journal = wh.root / TX_DIR / f"{batch}--{_owner()}-{uuid.uuid4().hex[:8]}.json"
        self.files: list[str] = []
        self.rows = 0

    def __enter__(self) -> "Transaction":
        self.wh.clean_transactions()
        self.journal.parent.mkdir(exist_ok=True)
        _inflight.add(str(self.journal))
        self._save()
        return self

    def _save(self) -> None:
        _atomic_write_text(self.journal, json.dumps({"batch": self.batch, "files": self.files}))

    def _planned(self, paths: list[Path]) -> None:
        self.files.extend(str(p.relative_to(self.wh.root)) for p in paths)
        self._save()

    def write(self, table: str, frame: pl.DataFrame) -> int:
        n = self.wh.write(table, frame, self.batch, commit=False, on_plan=self._planned)
        self.rows += n
        return n

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                if self.clusters:
                    self.wh.commit(self.batch, self.clusters, self.kind, rows=self.rows, **self.info)
                self.journal.unlink(missing_ok=True)
            elif issubclass(exc_type, Exception):  # an error, not a kill: take the batch's files back now
                for rel in self.files:
                    (self.wh.root / rel).unlink(missing_ok=True)
                self.journal.unlink(missing_ok=True)
        finally:
            _inflight.discard(str(self.journal))


def _lock_for(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def _one_line(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return " ".join(lines[:3]) if lines else type(exc).__name__


def _mentioned_tables(query: str) -> list[str]:
    words = {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", query)}
    hit = [t for t in TABLES if t in words or f"{t}_all" in words]
    if not hit and words & {"show", "describe", "information_schema", "duckdb_views", "duckdb_tables"}:
        hit = list(TABLES)
    return hit
