"""Infer node, rank, GPU and timestamp of each log line from what real logs carry.

Pure Polars over a frame of lines; no Python loop over lines. What cannot be
inferred stays null: a node is never guessed.

Prefixes understood (they may be stacked, e.g. `0: [default0]:[rank0]:[E321 ...]`):
  pdsh / DeepSpeed       `worker-1: ` / `10.1.2.3: ` / `[hgx-b17] ` -> node (host-like names, IPv4)
  torchrun               `[rank3]:` / `[default3]:`     -> rank / local_rank
  PyTorch c10d           `[Rank 3]`, `[PG 0 Rank 3]`    -> rank (default group only)
  NCCL                   `host:pid:tid [gpu] NCCL ...`  -> node, gpu
  UCX                    `[1712345678.1] [host:pid:tid]` -> node
  Open MPI               `[host:pid] *** Process received signal` -> node
  shell prompt           `user@gpu-3:~/run$ python train.py`      -> node
  slurmstepd             `slurmstepd-gpu-3: error: ...`            -> node
  torch_xla xla_dist     `2020-10-22 02:48:58 10.128.0.33 [3] ...` -> node (the TPU client VM's IP)
  Open MPI --tag-output  `[1,5]<stderr>:`               -> rank
  horovodrun (gloo)      `[5]<stderr>:`                 -> rank
  Ray                    `(Worker pid=4471, ip=10.0.5.12)` -> node (its IP)
  kubectl --prefix       `[pod/name/container] `        -> node (the pod's hostname)
  syslog / journal       `Jun  9 11:49:36 host kernel:` / `2024-06-09T11:49:36+0000 host kernel:`
  dmesg -T               `[Sun Jun  9 11:49:36 2024]`
  glog / c10             `[E321 02:07:08.408271257 ...]`, `I0510 07:28:04.417845 ...`
  ISO / Python logging   `2023-07-26 09:59:13.215`, `2024-04-20T09:09:37Z`
  epoch                  `[1718000000.123]`
"""

from __future__ import annotations

from datetime import datetime, timezone

import polars as pl

from faultline.hostwords import HOST_WORD_LONG, HOST_WORD_SHORT

MONTHS = {m: f"{i:02d}" for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), start=1)}

# srun --label's `12: ` is a Slurm task id: the global rank with one task per GPU, the node index
# with one torchrun per node. Which one cannot be told from the line, so it is not read as a rank.
# Host names that prefix lines (pdsh, DeepSpeed, wrappers) count only when they look like cluster
# hosts: a known host word and a digit, so `RuntimeError: ` is never a node.
HOST_WORD = r"(?:" + HOST_WORD_LONG + "|" + HOST_WORD_SHORT + ")"
# letters-only segments may come before the one with the digit: gpu-q-13, node-a-0007
_HOSTNAME = HOST_WORD + r"[\-_]?(?:[A-Za-z]+[\-_.])*[A-Za-z0-9]*\d[A-Za-z0-9]*(?:[\-.][A-Za-z0-9]+)*"
# pdsh (DeepSpeed's multi-node runner) names hosts as the hostfile does, often by IPv4 address
# (`10.1.2.3: [rank4]: ...`); a loopback (127.x) or unspecified address is never a host.
_IPV4 = r"(?:25[0-5]|2[0-4]\d|1(?:[013-9]\d|2[0-689])|[1-9]\d?)(?:\.(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}"
# Rack-position names of HPC machines (HPE/Cray `c05r2n11` = cabinet 5, row 2, node 11; SGI `r1i0n3`; Cray EX
# xnames `x1000c0s0b0n0`): a letter and a number, three times or more, which no word of a message is.
_RACK_HOST = r"[a-z]\d{1,4}(?:[a-z]\d{1,4}){2,}"
_PDSH = r"^(?i:(" + _HOSTNAME + r"|" + _RACK_HOST + r"|" + _IPV4 + r")): "
# Any host name pdsh relays a torchrun-tagged line from (`v100x16-2: [rank8]: ...`): the `[rankN]:` after
# it says the prefix is a host, whatever its name (it needs a digit, and a source file is not a host).
_PDSH_RANKED = r"^([A-Za-z][A-Za-z0-9_\-]*\d[A-Za-z0-9_\-]*(?:\.[A-Za-z0-9_\-]+)*): \[rank\d{1,6}\]:"
_BRACKET_HOST = r"^\[(?i:(" + _HOSTNAME + r"))\] "
_TORCHRUN_RANK = r"\[rank(\d{1,6})\]:"
_TORCHRUN_LOCAL = r"\[(?:default|trainer|worker)(\d{1,4})\]:"
# Only the default process group's rank is the global rank; `[PG 3 Rank 1]` is local to a subgroup.
_C10D_RANK = r"\[(?:PG (?:ID )?0 (?:PG GUID 0(?:\(default_pg\))? )?)?Rank (\d{1,6})\]"
_NCCL = r"(?:^|[\s:\]])([A-Za-z0-9.\-_]*[A-Za-z0-9]):\d+:\d+ \[(\d{1,2})\] "
_MPI_TAG = r"^\[\d+,(\d+)\]<std(?:out|err)>:"
# horovodrun's gloo launcher prefixes each worker's lines `{time}[{index}]<{stdout|stderr}>:` with index =
# slot_info.rank (horovod/runner/gloo_run.py, util/safe_shell_exec.py prefix_connection); the optional time
# is `%a %b %d %H:%M:%S %Y` (--prefix-output-with-timestamp).
_HVD_TAG = r"^(?:[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4}\s?)?\[(\d{1,6})\]<std(?:out|err)>:"
# UCX (ucs/debug/log.c): `[1712345678.123456] [host:pid:thread]`, the pid space-padded (`%-5d`), the
# thread a number or a name; older releases `[host:pid:idx:tid]`. Open MPI's opal/orte messages and
# backtraces: `[host:pid] *** Process received signal ***`, the same `[host:N]` shape from wrappers. The
# number is a pid, not a rank. One regex for both; source-file tags (`[file.cpp:12]`) are not hosts. Either
# may come after Open MPI's `[1,5]<stderr>:` tag or srun --label's `5: ` (the node is read, not a rank).
_UCX = (r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\d{1,6}: )?\s*(?:\[\d{9,10}\.\d+\]\s+)?"
        r"\[([A-Za-z][A-Za-z0-9.\-]*[A-Za-z0-9]):\s*\d+\s*(?::[\w\-]+){0,2}\]")
_SOURCE_FILE = r"\.(?:cpp|cc|cxx|c|h|hpp|cu|py|rs|go)$"
# Nor is a field label: CANN and torch_npu print `[PID: 389] <time> ...` (the process id, no host), Lightning
# `[rank: 0] Seed set to 42` (lightning_fabric/utilities/rank_zero.py rank_prefixed_message: the global rank).
_FIELD_LABEL = r"^(?i:pid|tid|ppid|rank|local_rank|global_rank|node_rank|device|gpu|step|epoch|iter|iteration)$"
_LIGHTNING_RANK = r"^\[rank: (\d{1,6})\] "
# A shell prompt pasted with the output: `user@gpu-node-3:~/run$ python train.py`.
_PROMPT = r"^(?:\([\w.\-]+\)\s)?[a-z_][\w.\-]*@([A-Za-z0-9][\w.\-]*):[~/][^$#\n]*[$#] "
# Ray's worker prefix: `(RayTrainWorker pid=4471, ip=10.0.5.12)`, `(pid=4471, ip=...)`, `(raylet, ip=...)`,
# names with parentheses (`(MapBatches(fn) pid=...)`), IPv6 addresses.
_RAY = r"^\((?:[^\s()]+(?:\([^()\n]*\))*\s)?(?:pid=\d+|raylet),\s*ip=([0-9A-Fa-f.:]+)\)"
# slurmstepd's messages name their node in the program name when slurmd is built for several slurmd per
# host (slurmstepd/mgr.c: `slurmstepd-<NodeName>`); the common build prints a bare `slurmstepd:`.
_SLURMSTEPD = r"^(?:\[[\dT:.\-]+\] )?slurmstepd-([A-Za-z0-9][\w.\-]*): "
# torch_xla's xla_dist (TPU pods) relays each client VM's output as `%(asctime)s %(clientip)s [%(ordinal)s]`,
# datefmt `%Y-%m-%d %H:%M:%S`; the ordinal is the VM's index, not a rank.
_XLA_DIST = r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} (\d{1,3}(?:\.\d{1,3}){3}) \[\d{1,4}\] "
_KUBECTL = r"^\[pod/([a-z0-9][a-z0-9.\-]*)/[^\]]+\] "
# grep -r / -H output puts the file's name first (`messages:Jun 17 ...`, `/var/log/syslog:2024-...`).
_GREP_FILE = r"(?:[\w./\-]+:)?"
_SYSLOG = (r"^" + _GREP_FILE + r"(?:<\d+>)?([A-Z][a-z]{2}) {1,2}(\d{1,2}) (\d{2}:\d{2}:\d{2}(?:\.\d+)?) "
           r"([A-Za-z0-9][A-Za-z0-9.\-]*) (?:kernel|[A-Za-z0-9_.\-/]+(?:\[\d+\])?):")
_JOURNAL = (r"^" + _GREP_FILE + r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?)(Z|[+-]\d{2}:?\d{2})? "
            r"([A-Za-z0-9][A-Za-z0-9.\-]*) (?:kernel|[A-Za-z0-9_.\-/]+(?:\[\d+\])?):")
_DMESG_T = r"^\[(?:[A-Z][a-z]{2}) ([A-Z][a-z]{2}) {1,2}(\d{1,2}) (\d{2}:\d{2}:\d{2}) (\d{4})\]"
_GLOG = r"(?:^|[\]:\s])\[?[EWIF](\d{1,2})(\d{2}) (\d{2}:\d{2}:\d{2}(?:\.\d+)?) "
_ISO = r"^.{0,48}?(\d{4}-\d{2}-\d{2})[T _](\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?)(Z|[+-]\d{2}:?\d{2})?"
_EPOCH = r"^\[?(1[5-9]\d{8}(?:\.\d{1,9})?)\]?\s"

TS_DTYPE = pl.Datetime("us", "UTC")
TS_MIN = datetime(1990, 1, 1, tzinfo=timezone.utc)
TS_MAX = datetime(2200, 1, 1, tzinfo=timezone.utc)


def _clock(hms: pl.Expr) -> pl.Expr:
    whole = hms.str.slice(0, 8)
    frac = hms.str.extract(r"[.,](\d+)$").fill_null("").str.pad_end(6, "0").str.slice(0, 6)
    return pl.concat_str([whole, pl.lit("."), frac])


def _to_ts(date: pl.Expr, clock: pl.Expr, offset: pl.Expr | None = None) -> pl.Expr:
    naive = pl.concat_str([date, pl.lit(" "), clock]).str.to_datetime(
        "%Y-%m-%d %H:%M:%S%.f", time_unit="us", strict=False)
    ts = naive.dt.replace_time_zone("UTC")
    if offset is None:
        return ts
    # "+0200" / "+02:00": subtract the offset to get UTC; "Z" or none is UTC already.
    sign = pl.when(offset.str.starts_with("-")).then(-1).otherwise(1)
    digits = offset.str.replace_all(r"[^0-9]", "")
    minutes = (digits.str.slice(0, 2).cast(pl.Int64, strict=False) * 60
               + digits.str.slice(2, 2).cast(pl.Int64, strict=False)).fill_null(0)
    return ts - pl.duration(minutes=minutes * sign)


# A training step that printed a finite loss (`lm loss: 2.11E+00`, `{'loss': 1.93`, `loss=3.92`, verl's
# `actor/pg_loss:np.float64(0.04)`, a numpy scalar's repr): the run went on. Read once per line, kept as the last such line per file (no symptom rows: step lines are many).
PROGRESS = r"(?i)loss['\"]?\s*(?:[:=]|value:)\s*['\"]?(?:tensor\(|np\.float\d\d\()?\s*-?\d"


def progress_lines(lines: pl.DataFrame) -> pl.DataFrame:
    """The lines of `lines` that show training progress: a cheap literal pass first (most lines hold no
    "loss"), the regex only on those that do."""
    has = pl.col("line").str.contains_any(["loss", "Loss", "LOSS"])
    return lines.filter(has).filter(pl.col("line").str.contains(PROGRESS))


def _not_source_file(host: pl.Expr) -> pl.Expr:
    return pl.when(host.str.contains(_SOURCE_FILE) | host.str.contains(_FIELD_LABEL)).then(None).otherwise(host)


def identity_exprs(file_node: str | None = None, file_rank: int | None = None,
                   column: str = "line") -> dict[str, pl.Expr]:
    """node and rank of a line: all a line needs to be counted as spoken by someone."""
    line = pl.col(column)
    node = pl.coalesce(
        line.str.extract(_SYSLOG, 4),
        line.str.extract(_JOURNAL, 3),
        _not_source_file(line.str.extract(_UCX)),
        line.str.extract(_RAY),
        line.str.extract(_PROMPT),
        line.str.extract(_SLURMSTEPD),
        line.str.extract(_XLA_DIST),
        line.str.extract(_KUBECTL),
        line.str.extract(_PDSH),
        _not_source_file(line.str.extract(_PDSH_RANKED)),
        line.str.extract(_BRACKET_HOST),
        line.str.extract(_NCCL, 1),
        pl.lit(file_node, dtype=pl.String),
    )
    rank = pl.coalesce(
        line.str.extract(_TORCHRUN_RANK),
        line.str.extract(_C10D_RANK),
        line.str.extract(_MPI_TAG),
        line.str.extract(_HVD_TAG),
        line.str.extract(_LIGHTNING_RANK),
        pl.lit(None if file_rank is None else str(file_rank), dtype=pl.String),
    ).cast(pl.Int32, strict=False)
    return {"node": node, "rank": rank}


# Who spoke, once per distinct prefix: a big log is millions of lines from a few hundred processes, each
# line led by the same few launcher and NCCL prefixes (`[default3]:[rank3]:`, `host:pid:tid [gpu] `). One
# anchored expression takes that prefix; where it settles node and rank by itself the prefix is the key,
# elsewhere the whole line is; `identity_exprs` runs once per distinct key. Why a prefix settles them:
# - a line that starts with torchrun tags (`[default3]:`, `[rank3]:`, `[trainer3]:`, `[worker3]:`) or with
#   an NCCL `host:pid:tid [gpu] ` fails every anchored node pattern (syslog, journal, UCX/Open MPI, Ray,
#   prompt, kubectl, pdsh, `[host] `) and the MPI tag within its first characters, on the line as on the
#   prefix: each needs a character there that a tag or a host name cannot hold (`(`, `<`, a digit, a space,
#   `: `, `] `, `@` before the first `:`, a host word before `]`);
# - an NCCL part in the prefix is the line's leftmost NCCL match (none can start inside the tags) and
#   lies wholly inside the prefix: node settled. Without one, the line's NCCL match needs ` [`: a line
#   without ` [` has no node;
# - a `[rankN]:` tag in the prefix is the line's leftmost torchrun rank, which comes first: rank settled.
#   Without one, a line holding neither `[rank` nor `Rank ` has no torchrun or c10d rank, and no MPI or
#   horovodrun tag (both anchored at the line's start, where the prefix's tag stands).
_SPOKE_PREFIX = (r"^(?:\[(?:default|trainer|worker)\d{1,4}\]:|\[rank\d{1,6}\]:)*"
                 r"(?:[A-Za-z0-9.\-_]*[A-Za-z0-9]:\d+:\d+ \[\d{1,2}\] )?")


def with_identity_keys(lines: pl.LazyFrame, column: str = "line") -> pl.LazyFrame:
    """Adds column `_k`: what node and rank of a line depend on: its prefix where that settles them, else
    the line itself."""
    line, key = pl.col(column), pl.col("_p")
    node_settled = key.str.ends_with("] ") | (key.str.starts_with("[") & ~line.str.contains(" [", literal=True))
    rank_settled = key.str.contains("[rank", literal=True) | ~line.str.contains_any(["[rank", "Rank "])
    return (lines.with_columns(_p=line.str.extract(_SPOKE_PREFIX, 0))
            .with_columns(_k=pl.when((key != "") & node_settled & rank_settled).then(key).otherwise(line))
            .drop("_p"))


def who_spoke(lines: pl.DataFrame, column: str = "line") -> pl.DataFrame:
    """Columns node and rank of every row of `lines`, in order: `identity_exprs` of each line, computed
    once per distinct `_k` of `with_identity_keys`."""
    keys = with_identity_keys(lines.lazy().select(column), column).select("_k").collect(engine="streaming")
    parsed = keys.unique().with_columns(**identity_exprs(column="_k"))
    return keys.join(parsed, on="_k", how="left", maintain_order="left", nulls_equal=True).select("node", "rank")


def _ts_branches(year: int) -> list[tuple[str, pl.Expr]]:
    """The timestamp formats, in the order they are tried: (the regex a line must match, the line's time
    by that format; null wherever the regex does not match)."""
    line = pl.col("line")
    yr = pl.lit(f"{year:04d}")
    month = lambda e: e.replace_strict(MONTHS, default=None)  # noqa: E731
    pad2 = lambda e: e.str.pad_start(2, "0")  # noqa: E731

    syslog = line.str.extract_groups(_SYSLOG)
    journal = line.str.extract_groups(_JOURNAL)
    dmesg_t = line.str.extract_groups(_DMESG_T)
    glog = line.str.extract_groups(_GLOG)
    iso = line.str.extract_groups(_ISO)
    return [
        (_SYSLOG, _to_ts(pl.concat_str([yr, pl.lit("-"), month(syslog.struct.field("1")), pl.lit("-"),
                                         pad2(syslog.struct.field("2"))]), _clock(syslog.struct.field("3")))),
        (_JOURNAL, _to_ts(journal.struct.field("1").str.slice(0, 10), _clock(journal.struct.field("1").str.slice(11)),
                          journal.struct.field("2"))),
        (_DMESG_T, _to_ts(pl.concat_str([dmesg_t.struct.field("4"), pl.lit("-"), month(dmesg_t.struct.field("1")),
                                          pl.lit("-"), pad2(dmesg_t.struct.field("2"))]),
                          _clock(dmesg_t.struct.field("3")))),
        (_GLOG, _to_ts(pl.concat_str([yr, pl.lit("-"), pad2(glog.struct.field("1")), pl.lit("-"),
                                       glog.struct.field("2")]), _clock(glog.struct.field("3")))),
        (_ISO, _to_ts(iso.struct.field("1"), _clock(iso.struct.field("2")), iso.struct.field("3"))),
        (_EPOCH, pl.from_epoch((line.str.extract(_EPOCH).cast(pl.Float64, strict=False) * 1e6).cast(pl.Int64),
                               time_unit="us").dt.replace_time_zone("UTC")),
    ]


def _in_range(ts: pl.Expr) -> pl.Expr:
    # A time outside any job's life (year 0, 9999-12-31 minus an offset) is a garbled stamp: none.
    ts = ts.cast(TS_DTYPE)
    return pl.when(ts.is_between(TS_MIN, TS_MAX)).then(ts)


def detail_exprs(year: int) -> dict[str, pl.Expr]:
    """local_rank, gpu and timestamp: needed only for lines that matched a rule."""
    line = pl.col("line")
    return {
        "local_rank": line.str.extract(_TORCHRUN_LOCAL).cast(pl.Int32, strict=False),
        "gpu": line.str.extract(_NCCL, 2).cast(pl.Int32, strict=False),
        "ts": _in_range(pl.coalesce(*(ts for _, ts in _ts_branches(year)))),
    }


def line_times(lines: pl.Series, year: int) -> pl.Series:
    """detail_exprs(year)["ts"] of these lines, each format parsed only on the lines its regex matches (on the
    others it is null anyway): the same values at a fraction of the cost, as most lines match none of the six
    formats and parsing a column of nulls costs Polars ~1 us a line per format."""
    frame = pl.DataFrame({"line": lines}).with_row_index("_i")
    cols = {}
    for k, (regex, ts) in enumerate(_ts_branches(year)):
        col = pl.repeat(None, lines.len(), dtype=TS_DTYPE, eager=True).alias(f"t{k}")
        hit = frame.filter(pl.col("line").str.contains(regex))
        if hit.height:
            col = col.scatter(hit["_i"], hit.select(ts.cast(TS_DTYPE)).to_series())
        cols[f"t{k}"] = col
    return pl.DataFrame(cols).select(ts=_in_range(pl.coalesce(*cols))).to_series()


def parse_lines(lines: pl.DataFrame, *, year: int, file_node: str | None = None,
                file_rank: int | None = None) -> pl.DataFrame:
    """Add node, rank, local_rank, gpu and ts columns to a frame with a `line` column."""
    return lines.with_columns(**identity_exprs(file_node, file_rank), **detail_exprs(year))


def year_hint(lines: pl.Series) -> int | None:
    """The most common four-digit year in full timestamps of these lines, if any."""
    years = pl.concat([
        lines.str.extract(_ISO, 1).str.slice(0, 4),
        lines.str.extract(_DMESG_T, 4),
    ]).drop_nulls().cast(pl.Int32, strict=False).drop_nulls()
    years = years.filter((years >= 1990) & (years <= 2200))
    if years.len() == 0:
        return None
    counts = years.value_counts(sort=True)
    return int(counts[0, 0])
