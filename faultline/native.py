"""The native scanner (faultline/_scan.c): one pass over a block of a file's bytes that splits, decodes and
cuts its lines, applies the extract prefilter, finds training progress and counts lines per who-spoke key,
with the results of the Polars path (collectors.files.read_blocks + collect_lines.LineCollector._parse).

It is optional: a missing build (no C compiler at install time) or FAULTLINE_NATIVE=off leaves the Polars
path, which also reads whatever does not come from a file (uploads, Loki, Kubernetes).

A file is read and scanned in a thread of its own (`Reader`) ahead of the Polars work on its pieces, and the
CLI starts that thread before Polars is imported (`prestart`): this module and what it imports need no Polars.
"""

from __future__ import annotations

import os
import queue
import threading
from contextlib import closing
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Iterator, NamedTuple

from faultline.collectors import files as filecol
from faultline.limits import CLI_READ, ReadLimits
from faultline.rules.literals import prefilter_literals
from faultline.rules.model import Ruleset

try:
    from faultline import _scan
except ImportError:  # not built
    _scan = None

# the truncation marker of collectors.files.TRUNCATED, around its number
_MARK = " …[faultline: line truncated, {} more bytes]"
_MARK_HEAD, _MARK_TAIL = (x.encode() for x in _MARK.split("{}"))


class Digest(NamedTuple):
    """One piece of a file: `lines` lines, indices from 0 in file order."""
    lines: int
    keys: list[str]          # who-spoke keys (a key may repeat: counts add up)
    counts: list[int]        # lines per key
    cand_index: list[int]    # lines holding a rule literal ...
    cand_text: list[str]     # ... their text (decoded, cut) ...
    cand_key: list[int]      # ... and their key (an index into keys)
    progress: int            # the last line showing training progress (-1: none) ...
    unsure_index: list[int]  # ... except non-ASCII lines holding "loss": logparse.PROGRESS decides those
    unsure_text: list[str]
    replaced: int            # U+FFFD in the decoded text (invalid bytes replaced, or there already)
    truncated: int           # lines cut at max_line characters
    route_rows: list[int] | None = None  # (candidate, literal) pairs: the rule literals each candidate holds
    route_lits: list[int] | None = None  # (with a router: found by the scan; literals numbered by route_literals)


def available() -> bool:
    return _scan is not None and os.environ.get("FAULTLINE_NATIVE", "").lower() not in ("off", "0", "no")


@lru_cache(maxsize=8)
def scanner(literals: tuple[str, ...]):
    """The automaton of the prefilter literals, or None where it cannot stand for the Polars prefilter
    (a literal that is not ASCII: the prefilter then falls back to a Unicode-aware search)."""
    if not available() or not literals or not all(lit.isascii() for lit in literals):
        return None
    return _scan.build([lit.encode() for lit in literals])


@lru_cache(maxsize=8)
def router(literals: tuple[str, ...]):
    """The automaton that says which of `literals` (ASCII, lower-case) a line holds (`route`), or None
    where Polars must (not built, switched off, a literal that is not ASCII)."""
    if not available() or not literals or not all(lit.isascii() for lit in literals):
        return None
    return _scan.build([lit.encode() for lit in literals], True)


def route(rt, lines: list[str]) -> tuple[list[int], list[int]]:
    """Every (line, literal) pair of a literal the line holds, ASCII case-insensitively, each once:
    two lists, line indices ascending, literal indices (into the router's literals)."""
    return _scan.route(rt, lines)


def scan(sc, pre: list[str], data: bytes, max_line: int, limit: int, max_lines: int | None = None,
         threads: int = 2, rt=None) -> Digest:
    """The lines of one piece (collectors.files.pieces): `pre`, already decoded, then those of `data`.
    Only the first `max_lines` are counted and matched; all are decoded and cut (their replaced and
    truncated counts are those of the whole piece, as in the Polars path). A line longer than `limit`
    characters is cut to `max_line` characters and the marker. With a router `rt`, the digest's
    route_rows/route_lits are `route(rt, cand_text)`, found by the scan's threads as each part ends."""
    return Digest(*_scan.scan(sc, data, pre, False, -1 if max_lines is None else max_lines, max_line, limit,
                              _MARK_HEAD, _MARK_TAIL, threads, rt))


AHEAD = 8  # pieces scanned ahead of their consumer at most (a piece's digest: its candidate lines as str)


class Reader:
    """The native read of one file in a thread: `collectors.files.pieces` -> `scan` -> Digest, in file order.
    The scan of the next pieces overlaps the consumer's Polars work on this one (and, when the CLI starts
    it, Polars' import). Iterating gives the digests; an error of the reading is raised where it happened,
    after the digests before it. The thread stops by itself at the end of the file or after `max_lines`.

    `rep` is the consumer's: the thread counts into a report of its own (pieces adds bytes, replaced and
    truncated characters), and the consumer copies what the pieces so far added, with each digest: two
    threads never add to one field."""

    def __init__(self, path: Path, rep: filecol.FileReport, sc, block_bytes: int, max_line: int, max_bytes: int,
                 max_lines: int, rt=None):
        # what LineCollector.read_file asks; `rt`: a router, whose routes of each piece's candidates come along
        self.key = (path, sc, block_bytes, max_line, max_bytes, max_lines, rt)
        self.rep, self.line_cut = rep, False
        self._own = replace(rep)  # a copy: pieces reads its bytes so far
        self._seen = (rep.truncated_lines, rep.replaced_chars)
        self._q: queue.Queue = queue.Queue(maxsize=AHEAD)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="faultline-read", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        path, sc, block_bytes, max_line, max_bytes, left, rt = self.key
        limit = max_line + len(filecol.TRUNCATED) + 12  # as files._frame cuts
        try:
            with closing(filecol.pieces(path, self._own, block_bytes, max_line, max_bytes=max_bytes)) as it:
                for pre, data in it:
                    # routed here, not in extract: this thread runs ahead (and the routes of each part of the
                    # piece are found by the thread that scanned it)
                    d = scan(sc, pre, data, max_line, limit, max_lines=left, rt=rt)
                    left -= d.lines
                    if not self._put("piece", d) or left == 0:
                        self._put("cut" if left == 0 else "stop", None)
                        return
            self._put("end", None)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            self._put("error", exc)

    def _put(self, kind: str, value) -> bool:
        own = self._own
        item = (kind, value, own.bytes, own.cut_at, own.truncated_lines, own.replaced_chars)
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[Digest]:
        rep = self.rep
        seen_t, seen_r = self._seen
        while True:
            kind, value, nbytes, cut_at, trunc, repl = self._q.get()
            rep.bytes, rep.cut_at = nbytes, cut_at
            rep.truncated_lines += trunc - seen_t
            rep.replaced_chars += repl - seen_r
            seen_t, seen_r = trunc, repl
            if kind == "piece":
                yield value
            elif kind == "error":
                raise value
            else:
                self.line_cut = kind == "cut"
                return

    def close(self) -> None:
        """Stop the thread (a consumer that stopped early) and wait for it."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._q.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()


@dataclass
class Prestarted:
    """The read of a job's first file, started before the collector exists (`prestart`)."""
    files: list[Path]
    problems: list[filecol.FileReport]
    rep: filecol.FileReport
    reader: Reader

    def close(self) -> None:
        self.reader.close()


def prestart(paths: list, ruleset: Ruleset, limits: ReadLimits = CLI_READ, block_bytes: int = filecol.BLOCK_BYTES,
             max_line: int = filecol.MAX_LINE) -> Prestarted | None:
    """Start the native read of the first of the job's files (`filecol.expand(paths)`), as
    `LineCollector.read_file` would start it for the first file of a job, so that it runs while the caller
    imports Polars (~0.25 s, about half a 210 MB log's scan). None where read_file would not read natively."""
    sc = scanner(tuple(prefilter_literals(ruleset)))
    if sc is None:
        return None
    rt = router(tuple(ruleset.log_routes[0]))
    files, problems = filecol.expand(paths)
    if not files or filecol.looks_quoted(files[0]):
        return None
    path = files[0]
    cap = min(limits.file_bytes if filecol.is_compressed(path) else limits.job_bytes, limits.job_bytes)
    rep = filecol.FileReport(str(path), *filecol.hints(path))
    return Prestarted(files, problems, rep, Reader(path, rep, sc, block_bytes, max_line, cap, limits.job_lines, rt))
