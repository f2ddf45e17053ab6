"""Phase 1, extract: every rule over every line (and job row) of a window, vectorized.

One Aho-Corasick pass over all lines keeps only lines holding some rule literal;
each rule's regex then runs over that small remainder. The loop is over rules,
never over lines or jobs.
"""

from __future__ import annotations

import polars as pl

from faultline.logparse import TS_DTYPE
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


def prefilter_literals(ruleset: Ruleset) -> list[str]:
    return sorted({lit for r in ruleset.log_rules for lit in r.log.literals})


def _rule_frame(rule: Rule, hits: pl.DataFrame) -> pl.DataFrame:
    """Turn the lines one rule matched into symptom rows."""
    caps = list(rule.log.captures)
    if caps:
        hits = hits.with_columns(pl.col("line").str.extract_groups(rule.log.regex).alias("_cap")).with_columns(
            [pl.col("_cap").struct.field(c).alias(f"cap_{c}") for c in caps])
        captures_json = pl.struct([pl.col(f"cap_{c}").alias(c) for c in caps]).struct.json_encode()
    else:
        captures_json = pl.lit("{}")
    e = rule.emits
    out = hits.with_columns(
        rule_id=pl.lit(rule.id), symptom=pl.lit(e.symptom), role=pl.lit(e.role), domain=pl.lit(e.domain),
        implicates=pl.lit(e.implicates), outcome=pl.lit(e.outcome), priority=pl.lit(rule.priority, pl.Int32),
        action=pl.lit(rule.action), summary=pl.lit(e.summary),
        peer=pl.col(f"cap_{e.peer}") if e.peer else pl.lit(None, pl.String),
        address=pl.col(f"cap_{e.address}") if e.address else pl.lit(None, pl.String),
        peer_rank=pl.col(f"cap_{e.peer_rank}") if e.peer_rank else pl.lit(None, pl.String),
        captures=captures_json,
    )
    # A capture named like a line field says more than the prefix: it is in the message itself.
    fixes = []
    for f in LINE_FIELDS:
        if f in caps:
            value = pl.col(f"cap_{f}")
            if f != "node":
                value = value.cast(pl.Int32, strict=False)
            fixes.append(pl.coalesce(value, pl.col(f)).alias(f))
    if fixes:
        out = out.with_columns(fixes)
    if rule.lookup is not None:
        out = _apply_lookup(rule, out)
    return out.select(list(SYMPTOM_SCHEMA))


def _apply_lookup(rule: Rule, out: pl.DataFrame) -> pl.DataFrame:
    table = pl.DataFrame(list(rule.lookup.rows), infer_schema_length=None).cast(pl.String)
    table = table.rename({c: f"lk_{c}" for c in table.columns if c != "key"})
    out = out.join(table, left_on=f"cap_{rule.lookup.capture}", right_on="key", how="left", maintain_order="left")
    overrides = []
    for c in _EMIT_COLS + ("action",):
        if f"lk_{c}" in out.columns:
            overrides.append(pl.coalesce(pl.col(f"lk_{c}"), pl.col(c)).alias(c))
    if "lk_priority" in out.columns:
        overrides.append(pl.coalesce(pl.col("lk_priority").cast(pl.Int32, strict=False), pl.col("priority")).alias("priority"))
    return out.with_columns(overrides)


def extract_logs(lines: pl.DataFrame, ruleset: Ruleset, literals: list[str] | None = None) -> pl.DataFrame:
    """All log rules over all lines; `lines` follows LOG_SCHEMA (any number of jobs)."""
    rules = ruleset.log_rules
    if lines.height == 0 or not rules:
        return empty_symptoms()
    literals = literals if literals is not None else prefilter_literals(ruleset)
    cand = lines.filter(pl.col("line").str.contains_any(literals, ascii_case_insensitive=True))
    if cand.height == 0:
        return empty_symptoms()
    parts = []
    for rule in rules:
        cond = pl.col("line").str.contains_any(list(rule.log.literals), ascii_case_insensitive=True)
        if rule.log.sources:
            cond = cond & pl.col("source").is_in(list(rule.log.sources))
        hits = cand.filter(cond)
        if hits.height == 0:
            continue
        hits = hits.filter(pl.col("line").str.contains(rule.log.regex))
        if hits.height:
            parts.append(_rule_frame(rule, hits))
    if not parts:
        return empty_symptoms()
    return pl.concat(parts, how="vertical")


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
