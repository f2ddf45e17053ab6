"""Baselines over the same lines and the same patterns as the engine's extract phase.

(a) `python_loop`: what a user would write by hand: for each line, for each rule, a cheap `in` check
    of the rule's own literals on the lower-cased line, then `re.search` of the rule's regex. No
    Aho-Corasick, no vectorization. Python `re` accepts every rule regex as written (the loader checks
    them with Rust's regex; named groups `(?P<name>...)` are the same in both).
(b) ripgrep: `rg -c -f patterns.txt` over the same files, every pattern in byte mode (`(?-u)`), each
    wrapped in its own group so inline flags such as `(?i)` stay inside it, and named groups turned into
    plain groups (ripgrep joins all patterns into one regex, where names would collide).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from faultline.rules.model import Ruleset

_NAMED = re.compile(r"\(\?P<\w+>")


def rg_patterns(ruleset: Ruleset, unicode: bool = False) -> list[str]:
    flag = "" if unicode else "(?-u)"
    return [f"(?:{flag}{_NAMED.sub('(?:', r.log.regex)})" for r in ruleset.log_rules]


def python_rules(ruleset: Ruleset) -> tuple[list[tuple[tuple[str, ...], re.Pattern, tuple[str, ...]]], int]:
    """(literals, compiled regex, sources) per log rule that Python `re` accepts; and how many it refused."""
    out, refused = [], 0
    for r in ruleset.log_rules:
        try:
            out.append((r.log.literals, re.compile(r.log.regex), r.log.sources))
        except re.error:
            refused += 1
    return out, refused


def iter_job_lines(folders: list[Path]):
    """(source, line) of every file of these job folders, in the order the engine reads them."""
    for folder in folders:
        for f in sorted(p for p in folder.rglob("*") if p.is_file()):
            source = "syslog" if "syslog" in f.name else "applog"
            with f.open("r", encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    yield source, line.rstrip("\n")


def python_loop(folders: list[Path], ruleset: Ruleset, limit: int | None = None) -> dict:
    """Time the per-line loop over the first `limit` lines (all when None)."""
    rules, refused = python_rules(ruleset)
    hits = matched_lines = n = nbytes = 0
    t0 = time.perf_counter()
    for source, line in iter_job_lines(folders):
        low = line.lower()
        any_hit = False
        for lits, rx, sources in rules:
            if sources and source not in sources:
                continue
            for lit in lits:
                if lit in low:
                    if rx.search(line):
                        hits += 1
                        any_hit = True
                    break
        matched_lines += any_hit
        n += 1
        nbytes += len(line) + 1
        if limit and n >= limit:
            break
    return {"seconds": time.perf_counter() - t0, "lines": n, "bytes": nbytes, "hits": hits,
            "matched_lines": matched_lines, "patterns": len(rules), "refused": refused}
