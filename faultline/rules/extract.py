"""Phase 1, extract: every rule over every line (and job row) of a window, vectorized.

One Aho-Corasick pass over all lines keeps only lines holding some rule literal;
each rule's regex then runs over that small remainder. The loop is over rules,
never over lines or jobs.
"""

from __future__ import annotations

from functools import lru_cache

import polars as pl

from faultline import native
from faultline.logparse import TS_DTYPE
from faultline.rules.literals import prefilter_literals  # noqa: F401 - here since before: it needs no Polars
from faultline.rules.literals import route_literals
from faultline.rules.loader import LINE_FIELDS
from faultline.rules.model import Rule, Ruleset

KEY = ["cluster", "job_id", "attempt"]

LOG_SCHEMA = {
    "cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32,
    "node": pl.String, "rank": pl.Int32, "local_rank": pl.Int32, "gpu": pl.Int32,
    "source": pl.String, "file": pl.String, "seq": pl.Int64, "ts": TS_DTYPE, "line": pl.String,
}

SYMPTOM_SCHEMA = {
    "cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32,
    "rule_id": pl.String, "symptom": pl.String, "role": pl.String, "domain": pl.String,
    "implicates": pl.String, "outcome": pl.String, "priority": pl.Int32, "action": pl.String,
    "summary": pl.String, "peer": pl.String, "address": pl.String, "peer_rank": pl.String,
    "node": pl.String, "rank": pl.Int32, "local_rank": pl.Int32, "gpu": pl.Int32,
    "source": pl.String, "file": pl.String, "seq": pl.Int64, "ts": TS_DTYPE, "line": pl.String,
    "captures": pl.String,
}

_EMIT_COLS = ("symptom", "role", "domain", "implicates", "outcome", "summary")


def empty_symptoms() -> pl.DataFrame:
    return pl.DataFrame(schema=SYMPTOM_SCHEMA)


_RE_META = set("\\.+*?()|[]{}^$#&-~")


@lru_cache(maxsize=32)
def _prefilter_regex(literals: tuple[str, ...]) -> str | None:
    """One regex that holds exactly when a line contains any literal, ASCII case-insensitively.

    The regex engine's literal search is ~2.5x faster than `contains_any` with
    `ascii_case_insensitive` over hundreds of literals (bench/README.md). `(?i-u)` folds ASCII
    case only, as `contains_any` does; anything unusual falls back to `contains_any`.
    """
    if not literals or not all(lit.isascii() for lit in literals):
        return None
    pattern = "(?i-u)(?:" + "|".join("".join("\\" + c if c in _RE_META else c for c in lit) for lit in literals) + ")"
    try:
        pl.Series([""], dtype=pl.String).str.contains(pattern)
    except Exception:  # too big for the regex engine, ...: keep the automaton
        return None
    return pattern


def prefilter_expr(literals: list[str] | tuple[str, ...], column: str = "line") -> pl.Expr:
    """True for lines holding any of `literals` (ASCII case-insensitive): the extract prefilter."""
    pattern = _prefilter_regex(tuple(literals))
    if pattern is None:
        return pl.col(column).str.contains_any(list(literals), ascii_case_insensitive=True)
    return pl.col(column).str.contains(pattern)


def _routes(text: pl.DataFrame, rules: tuple[Rule, ...], given: tuple[list[int], list[int]] | None = None,
            routing: tuple[list[str], list[list[int]]] | None = None) -> pl.DataFrame | None:
    """(rule, row) pairs, sorted: the rows (`_row`) of `text` holding some literal of each rule.

    Same sets as filtering `text` once per rule with that rule's literals, from one Aho-Corasick
    pass instead of hundreds of re-scans. None when literals are not plain ASCII. `given`: the (row,
    literal) pairs of `text` already found by the native reader (literals numbered by route_literals).
    `routing`: route_literals(rules), where the caller has it (Ruleset.log_routes).
    """
    lits, owned = routing or route_literals(rules)
    if not all(lit.isascii() for lit in lits):
        return None
    # An ASCII-case-insensitive hit lower-cased is the literal itself: its position in `lits`
    # (an Enum's physical value) picks the rules that own it, one (literal, rule) row each (two flat
    # columns: ~1 ms, where a List column built from the ~1,700 Python lists took 15-25 ms).
    owners = pl.LazyFrame({"_i": pl.Series([i for i, rs in enumerate(owned) for _ in rs], dtype=pl.UInt32),
                           "_rule": pl.Series([r for rs in owned for r in rs], dtype=pl.UInt32)})
    rt = None if given is not None else native.router(tuple(lits))
    if given is not None or rt is not None:  # the native automaton gives each hit's literal by its index
        rows, hit = given if given is not None else native.route(rt, text["line"].to_list())
        pairs = pl.LazyFrame({"_row": pl.Series(rows, dtype=pl.UInt32), "_i": pl.Series(hit, dtype=pl.UInt32)})
    else:
        pairs = (text.lazy()
                 .select("_row", _lit=pl.col("line").str.extract_many(lits, ascii_case_insensitive=True, overlapping=True))
                 .explode("_lit").drop_nulls("_lit")
                 .select("_row", _i=pl.col("_lit").str.to_lowercase().cast(pl.Enum(lits)).to_physical()
                         .cast(pl.UInt32)))  # the Enum's physical type is as narrow as its size allows
    key = (pairs.join(owners, on="_i")
           .select(_k=pl.col("_rule").cast(pl.UInt64) * (1 << 32) + pl.col("_row").cast(pl.UInt64))
           .collect(engine="streaming")["_k"].sort().unique(maintain_order=True))
    return pl.DataFrame({"_rule": (key // (1 << 32)).cast(pl.UInt32), "_row": (key % (1 << 32)).cast(pl.UInt32)})


_MATCH = "_faultline_match"  # a group around the whole regex: its value says the line matched
_OVERRIDES = _EMIT_COLS + ("action",)

# One narrow row per rule hit; the line's own columns and the rule's constants are joined once at the end.
_HIT_SCHEMA = {
    "_row": pl.UInt32, "_rule": pl.UInt32, "captures": pl.String,
    "peer": pl.String, "address": pl.String, "peer_rank": pl.String,
    **{f"cap_{f}": (pl.String if f == "node" else pl.Int32) for f in LINE_FIELDS},
    **{f"lk_{c}": pl.String for c in _OVERRIDES}, "lk_priority": pl.Int32,
}
_CHUNK_ROWS = 1 << 16  # a rule's rows are cut in pieces so the two cores share big rules too


def _by_identity(build):
    """Cache `build(obj)` per object (rules hold dict rows, so they cannot be hashed by value)."""
    cache: dict[int, tuple[object, object]] = {}

    def get(obj):
        hit = cache.get(id(obj))
        if hit is None or hit[0] is not obj:
            if len(cache) > 4096:
                cache.clear()
            hit = cache[id(obj)] = (obj, build(obj))
        return hit[1]
    return get


@_by_identity
def _lookup_frame(lookup) -> pl.DataFrame:
    table = pl.DataFrame(list(lookup.rows), infer_schema_length=None).cast(pl.String)
    keep = ["key", *[c for c in (*_OVERRIDES, "priority") if c in table.columns]]
    return table.select(keep).rename({c: f"lk_{c}" for c in keep if c != "key"})


@_by_identity
def _hit_exprs(rule: Rule) -> tuple[pl.Expr | None, pl.Expr, list[pl.Expr], dict[str, pl.Expr]]:
    """A rule's expressions, built once (Python-side expression building costs more than small hits).

    Returns the source filter, the match (a filter for rules without captures; else the capture
    struct `_cap`, whose wrapping group is null when the line does not match: one regex pass),
    the capture columns, and the narrow output columns.
    """
    sources = pl.col("source").is_in(list(rule.log.sources)) if rule.log.sources else None
    caps = list(rule.log.captures)
    if not caps:
        match, fields = pl.col("line").str.contains(rule.log.regex), []
        cols = {"captures": pl.lit("{}")}
    else:
        match = pl.col("line").str.extract_groups(f"(?P<{_MATCH}>{rule.log.regex})").alias("_cap")
        fields = [pl.col("_cap").struct.field(c).alias(f"cap_{c}") for c in caps]
        cols = {"captures": pl.struct([pl.col(f"cap_{c}").alias(c) for c in caps]).struct.json_encode()}
    e = rule.emits
    for name, cap in (("peer", e.peer), ("address", e.address), ("peer_rank", e.peer_rank)):
        cols[name] = pl.col(f"cap_{cap}") if cap else pl.lit(None, pl.String)
    # A capture named like a line field says more than the prefix: it is in the message itself.
    for f in LINE_FIELDS:
        value = pl.col(f"cap_{f}") if f in caps else pl.lit(None, pl.String)
        cols[f"cap_{f}"] = value if f == "node" else value.cast(pl.Int32, strict=False)
    lk = _lookup_frame(rule.lookup).columns if rule.lookup is not None else []
    for c in _OVERRIDES:
        cols[f"lk_{c}"] = pl.col(f"lk_{c}") if f"lk_{c}" in lk else pl.lit(None, pl.String)
    cols["lk_priority"] = pl.col("lk_priority").cast(pl.Int32, strict=False) if "lk_priority" in lk else pl.lit(None, pl.Int32)
    return sources, match, fields, cols


def _hit_plan(i: int, rule: Rule, text: pl.DataFrame) -> pl.LazyFrame:
    """The hits of rule `i` among `text` (_row, line, source), as narrow rows (_HIT_SCHEMA)."""
    sources, match, fields, cols = _hit_exprs(rule)
    lf = text.lazy()
    if sources is not None:
        lf = lf.filter(sources)
    if fields:
        lf = lf.select("_row", match).filter(pl.col("_cap").struct.field(_MATCH).is_not_null()).select("_row", *fields)
    else:
        lf = lf.filter(match)
    if rule.lookup is not None:
        lf = lf.join(_lookup_frame(rule.lookup).lazy(), left_on=f"cap_{rule.lookup.capture}", right_on="key",
                     how="left", maintain_order="left")
    return lf.select("_row", pl.lit(i, pl.UInt32).alias("_rule"), **cols).cast(_HIT_SCHEMA)


@_by_identity
def _rule_constants(rules: tuple[Rule, ...]) -> pl.DataFrame:
    """Row i: what rule i emits unless a lookup row says otherwise."""
    return pl.DataFrame({
        "rule_id": [r.id for r in rules], **{c: [getattr(r.emits, c) for r in rules] for c in _EMIT_COLS},
        "priority": [r.priority for r in rules], "action": [r.action for r in rules],
    }, schema={"rule_id": pl.String, **{c: pl.String for c in _EMIT_COLS}, "priority": pl.Int32, "action": pl.String})


def extract_logs(lines: pl.DataFrame, ruleset: Ruleset, literals: list[str] | None = None,
                 prefiltered: bool = False, routes: tuple[list[int], list[int]] | None = None) -> pl.DataFrame:
    """All log rules over all lines; `lines` follows LOG_SCHEMA (any number of jobs). `prefiltered`: every
    line already holds one of `literals` (the collector's candidates), so the prefilter is not run again.
    `routes` (with `prefiltered`): the (row, literal) pairs of `lines`, found by the native reader.

    Output rows come rule by rule (ruleset order), lines in input order within a rule.
    """
    rules = ruleset.log_rules
    if lines.height == 0 or not rules:
        return empty_symptoms()
    literals = literals if literals is not None else prefilter_literals(ruleset)
    # rechunk: gathers from a filtered frame are ~20x slower until its string buffers are compacted
    cand = (lines if prefiltered else lines.filter(prefilter_expr(literals))).rechunk()
    if cand.height == 0:
        return empty_symptoms()
    text = cand.select(_row=pl.int_range(pl.len(), dtype=pl.UInt32), line="line", source="source")
    routes = _routes(text, rules, routes if prefiltered else None, ruleset.log_routes)
    plans = []
    if routes is None:
        for i, rule in enumerate(rules):
            lits = list(rule.log.literals)
            plans.append(_hit_plan(i, rule, text.filter(
                pl.col("line").str.contains_any(lits, ascii_case_insensitive=True))))
    else:
        for (i,), part in routes.partition_by("_rule", as_dict=True, maintain_order=True).items():
            rows = part["_row"]
            for k in range(0, rows.len(), _CHUNK_ROWS):
                plans.append(_hit_plan(i, rules[i], text[rows.slice(k, _CHUNK_ROWS)]))
    if not plans:
        return empty_symptoms()
    hits = pl.concat(pl.collect_all(plans, engine="streaming"), how="vertical").sort("_rule", "_row")
    if hits.height == 0:
        return empty_symptoms()
    const = _rule_constants(rules)[hits["_rule"]]
    base = cand[hits["_row"]]
    out = pl.concat([base, const, hits.drop("_row", "_rule")], how="horizontal")
    return out.with_columns(
        *[pl.coalesce(f"lk_{c}", c).alias(c) for c in (*_OVERRIDES, "priority")],
        *[pl.coalesce(f"cap_{f}", f).alias(f) for f in LINE_FIELDS],
    ).select(list(SYMPTOM_SCHEMA))


def extract_jobs(jobs: pl.DataFrame, ruleset: Ruleset) -> pl.DataFrame:
    """Rules over scheduler state: one row per job attempt with state, exit_code, signal, end."""
    rules = ruleset.job_rules
    if jobs.height == 0 or not rules:
        return empty_symptoms()
    parts = []
    for rule in rules:
        m = rule.job
        cond = pl.lit(True)
        if m.states:
            cond = cond & pl.col("state").is_in(list(m.states))
        if m.exit_codes:
            cond = cond & pl.col("exit_code").is_in(list(m.exit_codes))
        if m.signals:
            cond = cond & pl.col("signal").is_in(list(m.signals))
        hits = jobs.filter(cond)
        if hits.height == 0:
            continue
        e = rule.emits
        parts.append(hits.select(
            *KEY, rule_id=pl.lit(rule.id), symptom=pl.lit(e.symptom), role=pl.lit(e.role),
            domain=pl.lit(e.domain), implicates=pl.lit(e.implicates), outcome=pl.lit(e.outcome),
            priority=pl.lit(rule.priority, pl.Int32), action=pl.lit(rule.action), summary=pl.lit(e.summary),
            peer=pl.lit(None, pl.String), address=pl.lit(None, pl.String), peer_rank=pl.lit(None, pl.String),
            node=pl.lit(None, pl.String), rank=pl.lit(None, pl.Int32), local_rank=pl.lit(None, pl.Int32),
            gpu=pl.lit(None, pl.Int32), source=pl.lit("scheduler"), file=pl.lit("scheduler"),
            seq=pl.lit(0, pl.Int64), ts=pl.col("end_time").cast(TS_DTYPE),
            line=pl.format("state={} exit_code={} signal={}", pl.col("state"),
                           pl.col("exit_code").cast(pl.String).fill_null("-"),
                           pl.col("signal").cast(pl.String).fill_null("-")),
            captures=pl.format('{{"state":"{}"}}', pl.col("state")),
        ).cast(SYMPTOM_SCHEMA))
    return pl.concat(parts) if parts else empty_symptoms()
