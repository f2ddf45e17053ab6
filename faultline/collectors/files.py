"""Collector: log files and folders that together are one job.

Reads plain or compressed files in bounded blocks, whatever their encoding or line
length: invalid bytes are replaced, a line over `max_line` characters is cut with a
marker, an unreadable or empty file is recorded, never fatal. Each block comes out
as a Polars frame of raw lines; parsing and rule matching happen downstream.
"""

from __future__ import annotations

import bz2
import codecs
import lzma
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from faultline import limits
from faultline.hostwords import HOST_WORD_LONG, HOST_WORD_SHORT

# Polars is imported where a frame is made, not here: the native read (pieces, expand, hints) runs before
# Polars' import has finished (faultline/native.py, prestart).
if TYPE_CHECKING:
    import polars as pl

# What reading a damaged or unreadable file can raise; each is recorded, never fatal.
READ_ERRORS = (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError)
BLOCK_BYTES = limits.BLOCK_BYTES
MAX_LINE = limits.MAX_LINE_BYTES
TRUNCATED = " …[faultline: line truncated, {} more bytes]"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # CSI sequences: colours, cursor moves

_SYSLOG_NAMES = re.compile(r"(?i)(dmesg|syslog|kern|messages|journal)")
_K8S_EVENT_NAMES = re.compile(r"(?i)(events|describe)")
_RANK_NAME = re.compile(r"(?i)(?:^|[_.\-])rank[_\-]?(\d{1,6})(?:$|[_.\-])")
# A file or folder named like a host (node-a, gpu017, dgx-b200-12, ip-10-0-0-7.ec2): a node. Only
# names that start the way cluster hosts are named count; anything else stays unknown.
_HOSTLIKE = re.compile(r"(?i)^(?:" + HOST_WORD_LONG + r"[\-_]?[A-Za-z0-9]*|" + HOST_WORD_SHORT
                       + r"-?\d[A-Za-z0-9]*)(?:[\-.][A-Za-z0-9]+)*$")
_BARE_HOST_WORD = re.compile(r"(?i)^" + HOST_WORD_LONG + r"s?$")
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
    cut_at: int | None = None  # bytes of text read when a byte limit stopped the reading (read_blocks' max_bytes)

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
    """Files under the given paths, sorted. Whatever cannot be read as a file is reported, never
    raised or skipped silently: a missing path, an unreadable or empty folder, a dangling or
    looping link, a FIFO or device. Folders are walked without recursion (any depth) and a
    linked folder is entered once."""
    files: list[Path] = []
    problems: list[FileReport] = []

    def problem(path, status: str, reason: str) -> None:
        problems.append(FileReport(str(path), "applog", None, None, status=status, reason=reason))

    for p in map(Path, paths):
        if p.is_file():
            files.append(p)
            continue
        if not p.is_dir():
            problem(p, "error", "no such file or folder" if not p.is_symlink() else "dangling or looping link")
            continue
        found: list[Path] = []
        seen: set[tuple[int, int]] = set()
        stack = [p]
        while stack:
            folder = stack.pop()
            try:
                st = folder.stat()
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                entries = list(os.scandir(folder))
            except OSError as exc:
                problem(folder, "error", f"cannot read folder: {type(exc).__name__}: {exc.strerror or exc}")
                continue
            for e in entries:
                if e.name.startswith(".") or e.name in SKIPPED_NAMES:
                    continue
                path = Path(e.path)
                try:
                    if e.is_dir():
                        stack.append(path)
                    elif e.is_file():
                        found.append(path)
                    elif e.is_symlink():
                        problem(path, "error", "dangling or looping link")
                    else:
                        problem(path, "error", "not a regular file (FIFO, socket or device): not read")
                except OSError as exc:
                    problem(path, "error", f"{type(exc).__name__}: {exc.strerror or exc}")
        if not found and not any(r.path.startswith(str(p)) for r in problems):
            problem(p, "empty", "folder holds no files")
        files += sorted(found)
    return files, problems


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
        # a host word alone (`node.txt`: what a node's output was saved as) names no host
        if (candidate and _HOSTLIKE.match(candidate) and not _NOT_HOST.match(candidate)
                and not _RANK_NAME.search(candidate) and not _BARE_HOST_WORD.match(candidate)):
            node = candidate
            break
    return source, node, rank


class _Pulled:
    """A byte stream made by pulling steps into a buffer (`_more`, which sets `done` at the end and may leave
    an `error` to raise once every byte before it was read)."""

    buf: bytearray
    done: bool
    error: Exception | None = None

    def _more(self) -> None:
        raise NotImplementedError

    def read(self, n: int) -> bytes:
        while len(self.buf) < n and not self.done:
            try:
                self._more()
            except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as exc:
                self.error, self.done = exc, True
        if not self.buf and self.error is not None:
            err, self.error = self.error, None
            raise err
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def __enter__(self):
        return self


class _Decompressed(_Pulled):
    """A compressed file read incrementally: a truncated or damaged archive still gives every byte
    before the damage, and only then raises. Output is produced in bounded steps (`step` bytes), so a
    small archive of a huge file never lands in memory at once. Concatenated members are read in turn.
    At most `max_out` bytes come out (a decompression bomb stops there; `cut` says it did)."""

    def __init__(self, path: Path, kind: str, step: int = 1 << 20, max_out: int | None = None):
        self.raw, self.kind, self.step = path.open("rb"), kind, step
        self.dec = self._new()
        self.buf = bytearray()
        self.done = False
        self.error: Exception | None = None
        self.max_out, self.out, self.cut = max_out, 0, False

    def _new(self):
        return {"gz": lambda: zlib.decompressobj(wbits=47), "bz2": bz2.BZ2Decompressor,
                "xz": lzma.LZMADecompressor}[self.kind]()

    def _more(self) -> None:
        d = self.dec
        if d.eof:  # a member ended: another may follow (zero padding after the last one is ignored)
            rest = d.unused_data + (b"" if d.unused_data else self.raw.read(self.step))
            if not rest.strip(b"\0"):
                self.done = True
                return
            self.dec = d = self._new()
            data = rest
        elif self.kind == "gz":
            data = d.unconsumed_tail or self.raw.read(self.step)
        else:
            data = self.raw.read(self.step) if d.needs_input else b""
        if not data and (self.kind == "gz" or d.needs_input):
            self.done = True
            if not d.eof:
                self.error = EOFError("compressed file ended before the end-of-stream marker (truncated archive)")
            return
        new = d.decompress(data, self.step)
        self.buf += new
        self.out += len(new)
        if self.max_out is not None and self.out > self.max_out:  # the cap: never inflate past it
            del self.buf[len(self.buf) - (self.out - self.max_out):]
            self.out, self.done, self.cut = self.max_out, True, True

    def __exit__(self, *exc) -> None:
        self.raw.close()


_KINDS = {".gz": "gz", ".bz2": "bz2", ".xz": "xz"}
BINARY_PROBE = 8192


class BinaryInput(ValueError):
    """The file holds binary data, not text lines."""


def is_compressed(path: Path) -> bool:
    return path.suffix.lower() in _KINDS


class _Transcoded(_Pulled):
    """A UTF-16 text file (it starts with a byte-order mark: what Windows PowerShell's `>` and `Out-File`
    write) read as UTF-8 bytes, incrementally, so the line splitting and the binary probe see text and not
    the NUL byte of every other position. Undecodable units become U+FFFD, as in UTF-8 input."""

    def __init__(self, fh, encoding: str, step: int = 1 << 16):
        self.fh, self.step = fh, step
        self.dec = codecs.getincrementaldecoder(encoding)(errors="replace")
        self.buf = bytearray()
        self.done = False

    @property
    def cut(self) -> bool:
        return bool(getattr(self.fh, "cut", False))

    def _more(self) -> None:
        chunk = self.fh.read(self.step)
        self.done = not chunk
        self.buf += self.dec.decode(chunk, final=self.done).encode("utf-8", errors="replace")

    def __exit__(self, *exc) -> None:
        close = getattr(self.fh, "__exit__", None)
        if close is not None:
            close(*exc)


_UTF16_BOMS = ((codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))


def _open(path: Path, max_out: int | None = None):
    kind = _KINDS.get(path.suffix.lower())
    fh = _Decompressed(path, kind, max_out=max_out) if kind else path.open("rb")
    try:
        # a plain file is peeked at (its readinto stays: no copy per block); a decompressed one is read
        bom = fh.read(2) if kind else fh.peek(2)[:2]
    except BaseException:
        fh.__exit__(None, None, None)
        raise
    for mark, encoding in _UTF16_BOMS:
        if bom == mark:
            if not kind:
                fh.read(2)
            return _Transcoded(fh, encoding)
    if kind:
        fh.buf[:0] = bom  # not a mark: the bytes go back in front of what is still to be read
    return fh



def looks_binary(head: bytes) -> str | None:
    """Why these first bytes are not a text log (NUL bytes, mostly control bytes), or None."""
    if b"\0" in head:
        return "binary data, not a text log (NUL bytes near the start)"
    control = sum(head.count(bytes([c])) for c in (*range(1, 9), 11, 12, *range(14, 27), *range(28, 32)))
    if head and control * 10 > len(head):
        return "binary data, not a text log (mostly control bytes near the start)"
    return None


def _frame(lines: list[str] | pl.Series, reader: _Reader) -> pl.DataFrame:
    import polars as pl
    s = pl.Series("line", lines, dtype=pl.String)
    if s.str.ends_with("\r").any():  # scans cost less than the copy a strip makes
        s = s.str.strip_suffix("\r")
    # Lines cut while streaming already carry the marker and may exceed max_line by its length.
    # A character is at least one byte: characters are counted only when some line has that many bytes.
    limit = reader.max_line + len(TRUNCATED) + 12
    n_long = int((s.str.len_chars() > limit).sum()) if (s.str.len_bytes().max() or 0) > limit else 0
    if n_long:
        reader.report.truncated_lines += n_long
        line, head = pl.col("line"), pl.col("line").str.slice(0, reader.max_line)
        s = pl.DataFrame({"line": s}).select(
            pl.when(line.str.len_chars() > reader.max_line + len(TRUNCATED) + 12)
            .then(head + pl.format(TRUNCATED, line.str.len_bytes() - head.str.len_bytes()))
            .otherwise(line)).to_series()
    return pl.DataFrame({"line": s})


# A line ends at \n, \r\n or a lone \r: progress bars (tqdm) rewrite one terminal line with \r, and
# what a crash prints after them (`CUDA out of memory`) must not be lost inside one endless "line".
def _last_break(data: bytes | bytearray, start: int = 0, end: int | None = None) -> int:
    """Index of the last line break in data[start:end]; a \r that is the last byte may be half of a \r\n:
    not yet."""
    end = len(data) if end is None else end
    return max(data.rfind(b"\n", start, end), data.rfind(b"\r", start, end - 1) if end - 1 > start else -1)


def _first_break(data: bytes | bytearray, start: int = 0, end: int | None = None) -> int:
    end = len(data) if end is None else end
    hits = [i for i in (data.find(b"\n", start, end), data.find(b"\r", start, end)) if i >= 0]
    return min(hits) if hits else -1


def _split(text: str) -> list[str]:
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.split("\n")


# From this many bytes of one file on, blocks are split into lines by Arrow instead of Python: per
# 16 MiB block ~10 ms against ~70 ms, but importing pyarrow and numpy costs ~0.1 s once (bench/README.md,
# "bigfile"), more than the Python path spends on a file this small.
ARROW_FROM = 32 << 20


def _split_arrow(data: bytes, report: FileReport) -> pl.Series | None:
    """The lines of `data` (which ends with a line break) as one String column, the same lines `_split`
    gives, without a Python str per line: numpy finds the breaks, Arrow takes the bytes as a string array
    of alternating line and break slices (no copy), every other element is kept. None when the bytes are
    not valid UTF-8: the Python path replaces invalid sequences."""
    import polars as pl
    if not data.isascii():
        try:
            data.decode("utf-8")  # validation only, at C speed
        except UnicodeDecodeError:
            return None
        report.replaced_chars += data.count("\ufffd".encode())  # as the Python path counts them
    import numpy as np
    import pyarrow as pa

    a = np.frombuffer(data, np.uint8)
    if b"\r" in data:  # a break is \n, \r\n or a lone \r; \r\n is one break of two bytes
        nl, cr = a == 10, a == 13
        crlf = np.zeros(len(a), bool)
        crlf[:-1] = cr[:-1] & nl[1:]
        start = cr.copy()
        start[1:] |= nl[1:] & ~cr[:-1]
        start[0] |= nl[0]
        ends = np.flatnonzero(start)
        after = ends + 1 + crlf[ends]
    else:
        ends = np.flatnonzero(a == 10)
        after = ends + 1
    off = np.empty(2 * len(ends) + 1, np.int64)
    off[0], off[1::2], off[2::2] = 0, ends, after
    arr = pa.Array.from_buffers(pa.large_string(), 2 * len(ends), [None, pa.py_buffer(off), pa.py_buffer(data)])
    lines = pl.Series("line", arr).gather_every(2)
    if b"\x1b" in data:
        lines = lines.str.replace_all(_ANSI.pattern, "")
    return lines


def _decode(data: bytes, report: FileReport) -> str:
    text = data.decode("utf-8", errors="replace")
    report.replaced_chars += text.count("\ufffd")
    # Terminal colours (Ray's prefixes, loguru, kubectl) would hide what a line starts with.
    return _ANSI.sub("", text) if "\x1b" in text else text


def pieces(path: Path, report: FileReport, block_bytes: int = BLOCK_BYTES, max_line: int = MAX_LINE,
           max_bytes: int | None = None) -> Iterator[tuple[list[str], memoryview]]:
    """The file as (lines already decoded, bytes of whole lines) pieces in file order, each piece's decoded
    lines before its bytes. The bytes end with a line break (or are empty); they are at most about
    `block_bytes`, and a view of one buffer that the next piece reuses: use or copy them before asking for
    it (a fresh 16 MiB bytes object per read, per carry joined and per slice cost more CPU than reading).
    Decoded lines are the head of a line longer than `max_line` cut while streaming, and the last line when
    the file does not end with a break. At most `max_bytes` bytes of text (after decompression) are read;
    past them `report.cut_at` says where."""
    buf = bytearray(block_bytes + max_line * 4 + 1)  # a kept carry is at most max_line * 4 bytes
    view = memoryview(buf)
    kept = 0  # bytes at the start of buf carried over: the start of an unfinished line
    head: bytes | None = None  # start of a line that is longer than max_line
    dropped = 0
    with _open(path, max_bytes) as fh:
        into = getattr(fh, "readinto", None)
        while True:
            want = block_bytes if max_bytes is None else max(0, min(block_bytes, max_bytes - report.bytes))
            if not want:
                n = 0
            elif into is not None:
                n = into(view[kept:kept + want]) or 0
            else:
                chunk = fh.read(want)
                n = len(chunk)
                view[kept:kept + n] = chunk
            if not n:
                if max_bytes is not None and report.bytes >= max_bytes and (fh.read(1) or getattr(fh, "cut", False)):
                    report.cut_at = report.bytes  # more text followed: the byte limit stopped the reading
                break
            if not report.bytes and (why := looks_binary(bytes(view[kept:kept + min(n, BINARY_PROBE)]))):
                raise BinaryInput(why)
            report.bytes += n
            start, end, kept = 0, kept + n, 0
            lines: list[str] = []
            if head is not None:
                nl = _first_break(buf, start, end)
                if nl < 0:
                    dropped += end - start
                    continue
                dropped += nl - start
                lines.append(_decode(head, report) + TRUNCATED.format(dropped))
                report.truncated_lines += 1
                nl += 2 if buf[nl] == 13 and nl + 1 < end and buf[nl + 1] == 10 else 1
                head, dropped, start = None, 0, nl
            cut = _last_break(buf, start, end)
            rest = cut + 1 if cut >= 0 else start  # the unfinished line starts here
            if end - rest > max_line * 4:  # an unfinished line this long: keep its head, skip to its end
                head, dropped = bytes(buf[rest:rest + max_line]), end - rest - max_line
            if lines or rest > start:
                complete = view[start:rest]
                yield lines, complete
                complete.release()
            if head is None and end > rest:  # carried over: moved to the front (same size, no copy of buf)
                buf[0:end - rest] = buf[rest:end]
                kept = end - rest
    tail: list[str] = []
    if head is not None:
        tail.append(_decode(head, report) + TRUNCATED.format(dropped))
        report.truncated_lines += 1
    elif kept:
        tail.append(_decode(bytes(buf[:kept]), report))
    if tail:
        yield tail, memoryview(b"")


def read_blocks(path: Path, report: FileReport, block_bytes: int = BLOCK_BYTES,
                max_line: int = MAX_LINE, max_bytes: int | None = None) -> Iterator[pl.DataFrame]:
    """Yield frames of lines (column `line`) in file order; memory stays near `block_bytes`. At most
    `max_bytes` bytes of text (after decompression) are read; past them `report.cut_at` says where."""
    import polars as pl
    reader = _Reader(report, max_line)
    try:  # a plain file's size picks the line splitter from the start; a compressed one's after 32 MiB
        size = path.stat().st_size if _KINDS.get(path.suffix.lower()) is None else 0
    except OSError:
        size = 0
    for lines, view in pieces(path, report, block_bytes, max_line, max_bytes):
        complete = bytes(view)  # its own bytes: Arrow's lines point into them, and the view is reused
        fast = None
        if complete and (report.bytes >= ARROW_FROM or size >= ARROW_FROM):
            fast = _split_arrow(complete, report)
        if fast is not None:
            lines = pl.concat([pl.Series("line", lines, dtype=pl.String), fast]) if lines else fast
        elif complete:
            lines = lines + _split(_decode(complete[:-2] if complete.endswith(b"\r\n") else complete[:-1], report))
        if len(lines):
            yield _frame(lines, reader)


QUOTE_SAMPLE = 1 << 16  # bytes read to tell a quoted log


def looks_quoted(path: Path) -> bool:
    """A log pasted as a quote in a reply (mailing lists, forums, issue replies): most of its first lines
    start with `>`, or each is wrapped in markdown's inline-code backticks. A log of its own may have a few
    such lines (Megatron's `> building ...`); a quoted one has them nearly everywhere."""
    lines = [x.rstrip() for x in _sample_lines(path, QUOTE_SAMPLE)[:200] if x.strip()]
    marked = sum(x.startswith(">") or (len(x) > 2 and x.startswith("`") and x.endswith("`")) for x in lines)
    return len(lines) >= 3 and marked * 2 >= len(lines)


def _sample_lines(path: Path, limit: int) -> list[str]:
    try:
        with _open(path) as fh:
            data = fh.read(limit)
    except READ_ERRORS:
        return []
    return data.decode("utf-8", errors="replace").split("\n")


def sample_text(path: Path, limit: int = 1 << 20) -> pl.Series:
    """The first `limit` bytes as lines, for cheap hints (year of timestamps); empty on any error."""
    import polars as pl

    return pl.Series("line", _sample_lines(path, limit), dtype=pl.String)
