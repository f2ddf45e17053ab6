"""The native scanner (faultline/_scan.c): one pass over a block of a file's bytes that splits, decodes and
cuts its lines, applies the extract prefilter, finds training progress and counts lines per who-spoke key,
with the results of the Polars path (collectors.files.read_blocks + collect_lines.LineCollector._parse).

It is optional: a missing build (no C compiler at install time) or FAULTLINE_NATIVE=off leaves the Polars
path, which also reads whatever does not come from a file (uploads, Loki, Kubernetes).
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import NamedTuple

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


def available() -> bool:
    return _scan is not None and os.environ.get("FAULTLINE_NATIVE", "").lower() not in ("off", "0", "no")


@lru_cache(maxsize=8)
def scanner(literals: tuple[str, ...]):
    """The automaton of the prefilter literals, or None where it cannot stand for the Polars prefilter
    (a literal that is not ASCII: the prefilter then falls back to a Unicode-aware search)."""
    if not available() or not literals or not all(lit.isascii() for lit in literals):
        return None
    return _scan.build([lit.encode() for lit in literals])


def scan(sc, pre: list[str], data: bytes, max_line: int, limit: int, max_lines: int | None = None,
         threads: int = 2) -> Digest:
    """The lines of one piece (collectors.files.pieces): `pre`, already decoded, then those of `data`.
    Only the first `max_lines` are counted and matched; all are decoded and cut (their replaced and
    truncated counts are those of the whole piece, as in the Polars path). A line longer than `limit`
    characters is cut to `max_line` characters and the marker."""
    return Digest(*_scan.scan(sc, data, pre, False, -1 if max_lines is None else max_lines, max_line, limit,
                              _MARK_HEAD, _MARK_TAIL, threads))
