"""Collector: Slurm accounting (`sacct -P`) -> jobs and allocations frames.

The parser is pure and reads what `sacct -a -P -X -D --format=...` prints; the fetcher
either runs sacct or reads saved output (the simulator writes the same text).
"""

from __future__ import annotations

import os
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import polars as pl

from faultline import limits
from faultline.warehouse.schema import TABLES

SACCT_FIELDS = ("JobID", "JobName", "User", "Partition", "State", "ExitCode", "Submit", "Start", "End",
                "NNodes", "NodeList", "AllocTRES")

# Slurm's states -> DESIGN.md's normalized states (DEADLINE is a time limit, BOOT_FAIL a lost node).
STATE_MAP = {
    "COMPLETED": "COMPLETED", "FAILED": "FAILED", "TIMEOUT": "TIMEOUT", "DEADLINE": "TIMEOUT",
    "NODE_FAIL": "NODE_FAIL", "BOOT_FAIL": "NODE_FAIL", "OUT_OF_MEMORY": "OUT_OF_MEMORY",
    "CANCELLED": "CANCELLED", "PREEMPTED": "PREEMPTED", "REQUEUED": "PREEMPTED", "RUNNING": "RUNNING",
    "PENDING": "PENDING", "SUSPENDED": "RUNNING", "REVOKED": "CANCELLED", "SPECIAL_EXIT": "FAILED",
}
_RANGE = re.compile(r"^(\d+)-(\d+)$")


def expand_hostlist(expr: str) -> list[str]:
    """`gpu[001-003,007],login1` -> ['gpu001', 'gpu002', 'gpu003', 'gpu007', 'login1'] (Slurm hostlist syntax)."""
    if not expr or expr in ("None assigned", "(null)"):
        return []
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", expr):
        m = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", part)
        if not m:
            hosts.append(part)
            continue
        prefix, body, rest = m.groups()
        for item in body.split(","):
            r = _RANGE.match(item)
            if r:
                lo, hi = r.groups()
                width = len(lo)
                for n in range(int(lo), int(hi) + 1):
                    hosts += [f"{prefix}{n:0{width}d}{h}" for h in (expand_hostlist(rest) if "[" in rest else [rest])]
            else:
                hosts += [f"{prefix}{item}{h}" for h in (expand_hostlist(rest) if "[" in rest else [rest])]
    return hosts


def expand_hostlists(lists: pl.Series) -> pl.Series:
    """expand_hostlist over a column, vectorized: the one-bracket forms Slurm prints
    (`gpu[001-003,007],login1`) unfold in Polars; only nested forms (`a[1-2]-ib[0-1]`) take the
    per-string path."""
    n = lists.len()
    parts = (pl.DataFrame({"_i": pl.int_range(n, eager=True, dtype=pl.UInt32), "s": lists.cast(pl.String)})
             .with_columns(s=pl.when(pl.col("s").is_in(["None assigned", "(null)", ""])).then(None).otherwise("s"))
             .with_columns(part=pl.col("s").str.extract_all(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*"))
             .explode("part").drop_nulls("part").with_row_index("_p"))
    shape = pl.col("part").str.extract_groups(r"^([^\[]*)\[([^\]]*)\]([^\[\]]*)$")
    parts = parts.with_columns(_g=shape)
    nested = parts.filter(pl.col("part").str.count_matches(r"\[") > 1)
    plain = parts.filter(pl.col("part").str.count_matches(r"\[") == 0).select("_i", "_p", k=pl.lit(0, pl.Int64),
                                                                                host="part")
    ranged = (parts.filter(pl.col("part").str.count_matches(r"\[") == 1)
              .select("_i", "_p", pre=pl.col("_g").struct.field("1"), body=pl.col("_g").struct.field("2"),
                      suf=pl.col("_g").struct.field("3"))
              .with_columns(item=pl.col("body").str.split(",")).explode("item")
              .with_columns(lo=pl.col("item").str.extract(r"^(\d+)"), hi=pl.col("item").str.extract(r"-(\d+)$"))
              .with_columns(num=pl.when(pl.col("hi").is_not_null())
                            .then(pl.int_ranges(pl.col("lo").cast(pl.Int64), pl.col("hi").cast(pl.Int64) + 1)))
              .explode("num").with_row_index("k")
              .select("_i", "_p", pl.col("k").cast(pl.Int64),
                      host=pl.concat_str("pre", pl.when(pl.col("num").is_not_null())
                                         .then(pl.col("num").cast(pl.String).str.zfill(pl.col("lo").str.len_chars()))
                                         .otherwise(pl.col("item")), "suf")))
    rare = (nested.select("_i", "_p", host=pl.col("part").map_elements(expand_hostlist, return_dtype=pl.List(pl.String)))
            .explode("host").with_row_index("k").with_columns(pl.col("k").cast(pl.Int64)))
    hosts = pl.concat([plain, ranged, rare.select("_i", "_p", "k", "host")]).sort("_i", "_p", "k")
    out = pl.DataFrame({"_i": pl.int_range(n, eager=True, dtype=pl.UInt32)}).join(
        hosts.group_by("_i", maintain_order=True).agg(pl.col("host")), on="_i", how="left").sort("_i")
    return out["host"].fill_null(pl.lit([], pl.List(pl.String)))


def _ts(col: str) -> pl.Expr:
    # sacct prints local time without zone; clusters are expected to run in UTC (SLURM_TIME_FORMAT).
    return (pl.col(col).replace({"Unknown": None, "None": None, "": None})
            .str.to_datetime("%Y-%m-%dT%H:%M:%S", strict=False, time_unit="us").dt.replace_time_zone("UTC"))


def _row_fields(line: str, header: list[str]) -> list[str] | None:
    """One `sacct -P` row as the header's fields. sacct does not escape a `|` inside a value, and only
    JobName is free text: a row with extra fields is read from both ends, the rest is the job's name."""
    parts = line.split("|")
    n = len(header)
    if len(parts) == n:
        return parts
    if len(parts) > n and "JobName" in header:
        i = header.index("JobName")
        tail = len(parts) - (n - i - 1)
        return parts[:i] + ["|".join(parts[i:tail])] + parts[tail:]
    return None  # fewer fields than the header: a cut line, nothing in it can be trusted


def parse_sacct(text: str, cluster: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`sacct -P` text with a header row -> (jobs, allocations) per the warehouse schema. Header-only
    text (a quiet window, an unknown job) is no jobs."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return pl.DataFrame(schema=TABLES["jobs"]), pl.DataFrame(schema=TABLES["allocations"])
    header = lines[0].split("|")
    body = [r for r in (_row_fields(ln, header) for ln in lines[1:]) if r is not None]
    # Every field is text as sacct printed it (typed below): with no rows, columns would have no type.
    raw = pl.DataFrame(body, schema={h: pl.String for h in header}, orient="row")
    missing = [f for f in ("JobID", "State", "ExitCode", "End", "NodeList") if f not in raw.columns]
    if missing:
        raise ValueError(f"sacct output lacks fields {missing}; run sacct with --format={','.join(SACCT_FIELDS)}")
    for f in SACCT_FIELDS:
        if f not in raw.columns:
            raw = raw.with_columns(pl.lit(None, pl.String).alias(f))
    # Only allocations (no `.batch`/`.0` steps); a requeued job shows the same id again: later rows are
    # later attempts.
    raw = raw.filter(~pl.col("JobID").str.contains(r"\."))
    raw = raw.with_columns(attempt=(pl.int_range(pl.len()).over("JobID")).cast(pl.Int32))
    state_word = pl.col("State").str.extract(r"^([A-Z_]+)")
    gpus = pl.col("AllocTRES").str.extract(r"gres/gpu=(\d+)").cast(pl.Int32, strict=False)
    jobs = raw.select(
        cluster=pl.lit(cluster), job_id=pl.col("JobID"), attempt="attempt", scheduler=pl.lit("slurm"),
        name=pl.col("JobName"), user=pl.col("User"), queue=pl.col("Partition"),
        state=state_word.replace_strict(STATE_MAP, default="UNKNOWN"), raw_state=pl.col("State"),
        exit_code=pl.col("ExitCode").str.extract(r"^(\d+)").cast(pl.Int32, strict=False),
        signal=pl.col("ExitCode").str.extract(r":(\d+)$").cast(pl.Int32, strict=False),
        submit_time=_ts("Submit"), start_time=_ts("Start"), end_time=_ts("End"),
        num_nodes=pl.col("NNodes").cast(pl.Int32, strict=False), num_gpus=gpus,
    ).with_columns(nodes=expand_hostlists(raw["NodeList"]))
    allocations = (jobs.select("cluster", "job_id", "attempt", "nodes", "num_gpus", "num_nodes")
                   .explode("nodes").drop_nulls("nodes")
                   .select("cluster", "job_id", "attempt", node=pl.col("nodes"),
                           ranks=pl.lit(None, pl.List(pl.Int32)),
                           gpus=(pl.col("num_gpus") // pl.col("num_nodes").clip(1)).cast(pl.Int32)))
    return jobs.cast(TABLES["jobs"]), allocations.cast(TABLES["allocations"])


def run_slurm(cmd: list[str], timeout: float) -> str:
    """A Slurm command with TZ=UTC (its times are printed in the caller's zone, and read here as UTC;
    SLURM_TIME_FORMAT left to its ISO default). A failure raises with Slurm's own message."""
    env = {**os.environ, "TZ": "UTC"}
    env.pop("SLURM_TIME_FORMAT", None)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} failed ({out.returncode}): {out.stderr.strip()[:300]}")
    return out.stdout


def sacct_timeout(scheduler: dict, default: float) -> float:
    """Seconds a sacct call may take: the cluster's `scheduler.timeout_s`, else $FAULTLINE_SACCT_TIMEOUT_S,
    else `default` (limits.SACCT_JOB_TIMEOUT_S / SACCT_WINDOW_TIMEOUT_S)."""
    for value, where in ((scheduler.get("timeout_s"), "scheduler.timeout_s"),
                         (os.environ.get(limits.SACCT_TIMEOUT_ENV), limits.SACCT_TIMEOUT_ENV)):
        if value is None or value == "":
            continue
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where} must be a number of seconds, not {value!r}") from None
        if not 0 < seconds < float("inf"):
            raise ValueError(f"{where} must be positive, not {value!r}")
        return seconds
    return default


def base_job_id(job_id: str) -> str:
    """The id sacct is asked about: `4711` for `4711`, `4711_2` (array task), `4711+0` (het component),
    so that every row of the job comes back and the exact id is chosen among them."""
    m = re.match(r"^(\d+)(?:[_+].*)?$", job_id)
    return m.group(1) if m else job_id


def run_sacct(start: datetime, end: datetime, sacct: str = "sacct",
              timeout: float = limits.SACCT_WINDOW_TIMEOUT_S) -> str:
    """Jobs that ended in [start, end) on this cluster, from the real sacct. Text, not `--json`: on 22.05
    the JSON can report exit code 0 for a failed job; the state and the text's ExitCode are right."""
    fmt = "%Y-%m-%dT%H:%M:%S"
    return run_slurm([sacct, "-a", "-P", "-X", "-D", f"--format={','.join(SACCT_FIELDS)}",
                      "--state=CA,CD,F,NF,OOM,PR,TO,DL,BF",
                      "-S", start.astimezone(timezone.utc).strftime(fmt),
                      "-E", end.astimezone(timezone.utc).strftime(fmt)], timeout)


def run_sacct_job(job_id: str, sacct: str = "sacct", timeout: float = limits.SACCT_JOB_TIMEOUT_S) -> str:
    """One job's allocation rows (all attempts; all tasks or components of an array or het job) from
    the real sacct."""
    return run_slurm([sacct, "-P", "-X", "-D", f"--format={','.join(SACCT_FIELDS)}", "-j", base_job_id(job_id)],
                     timeout)


# ------------------------------------------------------------------ node state: drains, downs, fails
SINFO_REASONS_FORMAT = "%N|%T|%H|%U|%E"
NODE_EVENTS_SCHEMA = {"cluster": pl.String, "node": pl.String, "ts": pl.Datetime("us", "UTC"), "kind": pl.String,
                      "reason": pl.String}


def run_sinfo_reasons(sinfo: str = "sinfo", timeout: float = 60) -> str:
    """`sinfo -R`: every node that is down, drained, draining or failing, with why, who and since when."""
    return run_slurm([sinfo, "-R", "-N", "-h", "-o", SINFO_REASONS_FORMAT], timeout)


def node_event_kind(state: str) -> str:
    """sinfo's state word -> node_events.kind: drain (drained/draining), node_fail (down, fail, failing,
    not responding), else the state itself."""
    s = state.lower().rstrip("*~#!%$@^-")
    if s.startswith("drain") or s == "drng":
        return "drain"
    if s.startswith(("down", "fail", "not_responding", "no_respond")):
        return "node_fail"
    return s


def parse_sinfo_reasons(text: str, cluster: str) -> pl.DataFrame:
    """`sinfo -R -N -h -o '%N|%T|%H|%U|%E'` text -> node_events rows (one per node and reason)."""
    rows = []
    for ln in text.splitlines():
        parts = ln.split("|", 4)
        if len(parts) != 5 or not parts[0].strip():
            continue
        nodes, state, when, user, reason = (p.strip() for p in parts)
        for node in expand_hostlist(nodes):
            rows.append({"cluster": cluster, "node": node, "ts": when, "kind": node_event_kind(state),
                         "reason": f"{reason} [{user}]" if user and user not in ("(null)", "Unknown") else reason})
    frame = pl.DataFrame(rows, schema={**NODE_EVENTS_SCHEMA, "ts": pl.String})
    return frame.with_columns(ts=_ts("ts")).cast(NODE_EVENTS_SCHEMA)


def read_sacct_files(root: Path, cluster: str, days: list[str]) -> str:
    """Saved sacct output, one file per day (`<root>/<cluster>/sacct/<day>.txt`), as one text."""
    texts = []
    for day in days:
        p = root / cluster / "sacct" / f"{day}.txt"
        if p.is_file():
            lines = p.read_text(encoding="utf-8", errors="replace").splitlines()
            texts.append(lines if not texts else lines[1:])  # one header
    return "\n".join(line for chunk in texts for line in chunk)


def read_node_event_files(root: Path, cluster: str, days: list[str]) -> pl.DataFrame:
    """Saved node events (`<root>/<cluster>/node_events/<day>.jsonl`, {node, ts, kind, reason} per line)."""
    parts = []
    for day in days:
        p = root / cluster / "node_events" / f"{day}.jsonl"
        if p.is_file() and p.stat().st_size:
            parts.append(pl.read_ndjson(p, schema={"node": pl.String, "ts": pl.String, "kind": pl.String,
                                                   "reason": pl.String}))
    if not parts:
        return pl.DataFrame(schema=NODE_EVENTS_SCHEMA)
    return pl.concat(parts).select(
        cluster=pl.lit(cluster), node="node",
        ts=pl.col("ts").str.replace(r"Z$", "+00:00").str.to_datetime(time_unit="us", time_zone="UTC", strict=False),
        kind="kind", reason="reason").cast(NODE_EVENTS_SCHEMA)
