"""Collector: log files and folders that together are one job.

Reads plain or compressed files in bounded blocks, whatever their encoding or line
length: invalid bytes are replaced, a line over `max_line` characters is cut with a
marker, an unreadable or empty file is recorded, never fatal. Each block comes out
as a Polars frame of raw lines; parsing and rule matching happen downstream.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import polars as pl

from faultline.logparse import HOST_WORD_LONG, HOST_WORD_SHORT

# What reading a damaged or unreadable file can raise; each is recorded, never fatal.
READ_ERRORS = (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError)
BLOCK_BYTES = 16 << 20
MAX_LINE = 64 << 10
TRUNCATED = " …[faultline: line truncated, {} more bytes]"

_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
_SYSLOG_NAMES = re.compile(r"(?i)(dmesg|syslog|kern|messages|journal)")
_K8S_EVENT_NAMES = re.compile(r"(?i)(events|describe)")
_RANK_NAME = re.compile(r"(?i)(?:^|[_.\-])rank[_\-]?(\d{1,6})(?:$|[_.\-])")
# A file or folder named like a host (node-a, gpu017, dgx-b200-12, ip-10-0-0-7.ec2): a node. Only
# names that start the way cluster hosts are named count; anything else stays unknown.
_HOSTLIKE = re.compile(r"(?i)^(?:" + HOST_WORD_LONG + r"[\-_]?[A-Za-z0-9]*|" + HOST_WORD_SHORT
                       + r"-?\d[A-Za-z0-9]*)(?:[\-.][A-Za-z0-9]+)*$")
_NOT_HOST = re.compile(
    r"(?i)^(?:slurm|job|log|logs|out|output|stdout|stderr|err|train|training|run|dmesg|syslog|kern|messages|journal|"
    r"events|describe|case|rank|nccl|torch|python|test|tmp|data|hostfile|hosts|hostname|nodes|nodelist)(?:[\-_.]?\d*)?$")
_SUFFIXES = (".log", ".out", ".err", ".txt", ".gz", ".bz2", ".xz", ".dmesg", ".syslog", ".kern", ".journal")
_SLURM_OUT = re.compile(r"slurm-(\d+)(?:_\d+)?\.out")
SKIPPED_NAMES = ("truth.yaml",)  # labels of evaluation cases, not evidence


@dataclass
class FileReport:
    path: str
    source: str
    node: str | None
    rank: int | None
    bytes: int = 0
    lines: int = 0
    status: str = "ok"  # ok | empty | error
    reason: str = ""
    truncated_lines: int = 0
    replaced_chars: int = 0

    def note(self) -> str:
        parts = [self.reason] if self.reason else []
        if self.truncated_lines:
            parts.append(f"{self.truncated_lines} over-long line(s) truncated")
        if self.replaced_chars:
            parts.append(f"{self.replaced_chars} invalid byte sequence(s) replaced")
        return "; ".join(parts)


@dataclass
class _Reader:
    report: FileReport
    max_line: int
    pending: list[str] = field(default_factory=list)


def expand(paths: list[str | Path]) -> tuple[list[Path], list[FileReport]]:
    """Files under the given paths, sorted; paths that do not exist are reported, not raised."""
    files: list[Path] = []
    missing: list[FileReport] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.is_file() and f.name not in SKIPPED_NAMES and not any(
                part.startswith(".") for part in f.relative_to(p).parts))
        elif p.is_file():
            files.append(p)
        else:
            missing.append(FileReport(str(p), "applog", None, None, status="error", reason="no such file or folder"))
    return files, missing


def slurm_job_id(paths: list[str | Path]) -> str | None:
    """The Slurm job id a `slurm-<id>.out` (or array `slurm-<id>_<task>.out`) among `paths` names."""
    for p in paths:
        m = _SLURM_OUT.fullmatch(Path(p).name)
        if m:
            return m.group(1)
    return None


def _stem(name: str) -> str:
    changed = True
    while changed:
        changed = False
        for suf in _SUFFIXES:
            if name.lower().endswith(suf) and len(name) > len(suf):
                name, changed = name[: -len(suf)], True
    return name


def hints(path: Path) -> tuple[str, str | None, int | None]:
    """(source, node, rank) suggested by a file's name and its folder; None where nothing is said."""
    stem = _stem(path.name)
    source = ("syslog" if _SYSLOG_NAMES.search(path.name)
              else ("k8s_event" if _K8S_EVENT_NAMES.search(stem) else "applog"))
    m = _RANK_NAME.search(stem)
    rank = int(m.group(1)) if m else None
    node = None
    for candidate in (stem, path.parent.name):
        if candidate and _HOSTLIKE.match(candidate) and not _NOT_HOST.match(candidate) and not _RANK_NAME.search(candidate):
            node = candidate
            break
    return source, node, rank


def _open(path: Path):
    opener = _OPENERS.get(path.suffix.lower())
    return opener(path, "rb") if opener else path.open("rb")


def _frame(lines: list[str], reader: _Reader) -> pl.DataFrame:
    s = pl.Series("line", lines, dtype=pl.String).str.strip_suffix("\r")
    # Lines cut while streaming already carry the marker and may exceed max_line by its length.
    too_long = s.str.len_chars() > reader.max_line + len(TRUNCATED) + 12
    n_long = int(too_long.sum())
    if n_long:
        reader.report.truncated_lines += n_long
        line, head = pl.col("line"), pl.col("line").str.slice(0, reader.max_line)
        s = pl.DataFrame({"line": s}).select(
            pl.when(line.str.len_chars() > reader.max_line + len(TRUNCATED) + 12)
            .then(head + pl.format(TRUNCATED, line.str.len_bytes() - head.str.len_bytes()))
            .otherwise(line)).to_series()
    return pl.DataFrame({"line": s})


def read_blocks(path: Path, report: FileReport, block_bytes: int = BLOCK_BYTES,
                max_line: int = MAX_LINE) -> Iterator[pl.DataFrame]:
    """Yield frames of lines (column `line`) in file order; memory stays near `block_bytes`."""
    reader = _Reader(report, max_line)
    carry = b""
    head: bytes | None = None  # start of a line that is longer than max_line
    dropped = 0

    def decode(data: bytes) -> str:
        text = data.decode("utf-8", errors="replace")
        report.replaced_chars += text.count("\ufffd")
        return text

    with _open(path) as fh:
        while True:
            chunk = fh.read(block_bytes)
            if not chunk:
                break
            report.bytes += len(chunk)
            data = carry + chunk
            carry = b""
            lines: list[str] = []
            if head is not None:
                nl = data.find(b"\n")
                if nl < 0:
                    dropped += len(data)
                    continue
                dropped += nl
                lines.append(decode(head) + TRUNCATED.format(dropped))
                report.truncated_lines += 1
                head, dropped, data = None, 0, data[nl + 1:]
            cut = data.rfind(b"\n")
            complete, rest = (data[: cut + 1], data[cut + 1:]) if cut >= 0 else (b"", data)
            if complete:
                lines += decode(complete[:-1]).split("\n")
            if len(rest) > max_line * 4:  # an unfinished line this long: keep its head, skip to its end
                head, dropped = rest[: max_line], len(rest) - max_line
            else:
                carry = rest
            if lines:
                yield _frame(lines, reader)
    tail: list[str] = []
    if head is not None:
        tail.append(decode(head) + TRUNCATED.format(dropped))
        report.truncated_lines += 1
    elif carry:
        tail.append(decode(carry))
    if tail:
        yield _frame(tail, reader)


def sample_text(path: Path, limit: int = 1 << 20) -> pl.Series:
    """The first `limit` bytes as lines, for cheap hints (year of timestamps); empty on any error."""
    try:
        with _open(path) as fh:
            data = fh.read(limit)
    except READ_ERRORS:
        return pl.Series("line", [], dtype=pl.String)
    return pl.Series("line", data.decode("utf-8", errors="replace").split("\n"), dtype=pl.String)
