"""`faultline rules test`: run every rule's own test lines through the real pipeline.

All test lines of all rules form one frame that goes through the same line parser
and extract phase as production logs, so a test checks what the engine does, not
what Python's `re` would do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import polars as pl

from faultline.logparse import parse_lines
from faultline.rules.extract import extract_jobs, extract_logs
from faultline.rules.model import Ruleset


@dataclass
class TestFailure:
    rule_id: str
    where: str
    line: str
    message: str

    def __str__(self) -> str:
        return f"{self.where} [{self.rule_id}] {self.message}\n    line: {self.line[:160]!r}"


def _check(rule, t, should_match: bool, rows: list[dict]) -> list[TestFailure]:
    text = t.line or repr(t.job)
    if not should_match:
        return [TestFailure(rule.id, t.where, text, "matched a line it must not match")] if rows else []
    if not rows:
        return [TestFailure(rule.id, t.where, text, "did not match")]
    row = rows[0]
    # Captures win over row fields of the same name (a capture `seq` is NCCL's SeqNum, not the line number).
    caps = {k: v for k, v in json.loads(row["captures"] or "{}").items() if v is not None}
    got = {**{k: v for k, v in row.items() if k != "captures"}, **caps}
    failures = []
    for key, want in t.expect.items():
        have = got.get(key)
        if (None if have is None else str(have)) != (None if want is None else str(want)):
            failures.append(TestFailure(rule.id, t.where, text, f"{key}: expected {want!r}, got {have!r}"))
    return failures


def run_job_rule_tests(ruleset: Ruleset, only: str | None = None) -> tuple[int, list[TestFailure]]:
    cases = [(rule, t, ok) for rule in ruleset.job_rules if not only or rule.id.startswith(only)
             for ok, tests in ((True, rule.tests_match), (False, rule.tests_no_match)) for t in tests]
    if not cases:
        return 0, []
    jobs = pl.DataFrame([{"cluster": "test", "job_id": f"case{i}", "attempt": 0,
                          "state": t.job.get("state"), "exit_code": t.job.get("exit_code"),
                          "signal": t.job.get("signal"), "end_time": None} for i, (_, t, _) in enumerate(cases)],
                        schema={"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "state": pl.String,
                                "exit_code": pl.Int32, "signal": pl.Int32, "end_time": pl.Datetime("us", "UTC")})
    hits = extract_jobs(jobs, ruleset)
    by_case: dict[tuple[str, str], list[dict]] = {}
    for row in hits.iter_rows(named=True):
        by_case.setdefault((row["job_id"], row["rule_id"]), []).append(row)
    failures = [f for i, (rule, t, ok) in enumerate(cases)
                for f in _check(rule, t, ok, by_case.get((f"case{i}", rule.id), []))]
    return len(cases), failures


def run_rule_tests(ruleset: Ruleset, only: str | None = None) -> tuple[int, list[TestFailure]]:
    """Return (number of test cases, failures) over log rules and scheduler-state rules."""
    from faultline.rules.metric import run_metric_rule_tests

    n_jobs, job_failures = run_job_rule_tests(ruleset, only)
    n_logs, log_failures = _run_log_rule_tests(ruleset, only)
    n_metrics, metric_failures = run_metric_rule_tests(ruleset, only)
    return n_jobs + n_logs + n_metrics, job_failures + log_failures + metric_failures


def _run_log_rule_tests(ruleset: Ruleset, only: str | None = None) -> tuple[int, list[TestFailure]]:
    cases = []
    for rule in ruleset.log_rules:
        if only and not rule.id.startswith(only):
            continue
        for t in rule.tests_match:
            cases.append((rule, t, True))
        for t in rule.tests_no_match:
            cases.append((rule, t, False))
    if not cases:
        return 0, []
    frame = pl.DataFrame({
        "line": [t.line for _, t, _ in cases],
        "source": [t.source for _, t, _ in cases],
        "file": [f"case{i}" for i in range(len(cases))],
    })
    frame = parse_lines(frame, year=2024).with_columns(
        cluster=pl.lit("test"), job_id=pl.col("file"), attempt=pl.lit(0, pl.Int32), seq=pl.lit(0, pl.Int64))
    hits = extract_logs(frame, ruleset)
    by_case: dict[tuple[str, str], list[dict]] = {}
    for row in hits.iter_rows(named=True):  # test harness, not a hot path
        by_case.setdefault((row["file"], row["rule_id"]), []).append(row)

    failures = [f for i, (rule, t, ok) in enumerate(cases)
                for f in _check(rule, t, ok, by_case.get((f"case{i}", rule.id), []))]
    return len(cases), failures


def shadowing(ruleset: Ruleset) -> tuple[list[str], list[str]]:
    """Over every rule's own match lines: (ties, shadowed). A tie is a line where rules of equal top
    priority point to different outcomes (who wins is then an accident); shadowed is a line that a
    higher-priority rule of another outcome takes away from the rule that lists it."""
    cases = [(r, t) for r in ruleset.log_rules for t in r.tests_match]
    if not cases:
        return [], []
    frame = pl.DataFrame({"line": [t.line for _, t in cases], "source": [t.source for _, t in cases],
                          "file": [f"case{i}" for i in range(len(cases))]})
    frame = parse_lines(frame, year=2024).with_columns(
        cluster=pl.lit("test"), job_id=pl.col("file"), attempt=pl.lit(0, pl.Int32), seq=pl.lit(0, pl.Int64))
    hits = extract_logs(frame, ruleset)
    top = hits.filter(pl.col("priority") == pl.col("priority").max().over("file"))
    winners: dict[str, list[tuple[str, str]]] = {}
    for f, rid, outcome in top.select("file", "rule_id", "outcome").iter_rows():
        winners.setdefault(f, []).append((rid, outcome))
    ties, shadowed = [], []
    for i, (rule, t) in enumerate(cases):
        win = winners.get(f"case{i}", [])
        if len({o for _, o in win}) > 1:
            ties.append(f"{t.where} [{rule.id}] tie between {sorted(win)}")
        elif win and rule.id not in {r for r, _ in win} and win[0][1] != rule.emits.outcome:
            shadowed.append(f"{t.where} [{rule.id}] taken by {win[0][0]} ({win[0][1]})")
    return ties, shadowed
