"""Metric rules (`match: metric`): samples of the `metrics` table over every job of a partition at once.

Three kinds, each evaluated per series (job x node x GPU x metric x labels) inside the job's window
`[start, end + grace_s]`, with the samples of the margin before the start as the baseline:

- `rise`: a counter rose (by at least `min_increase`) inside the window. A drop is a counter reset
  and the value after it counts as the increase; so a "last code" gauge such as the DCGM exporter's
  DCGM_FI_DEV_XID_ERRORS rises whenever a new code appears (0 -> 79). One symptom per series, or per
  series and value when the rule has a lookup (the code decides the meaning).
- `above` / `below`: a gauge beyond `threshold` for at least `for` (seconds, or `5m`), as a
  Prometheus alert's `for:` does; the symptom is at the moment the duration was reached.
- `outlier`: the one node of the job whose statistic over the window (`increase`, `max` or `mean`)
  is at least `min_value` and more than `factor` times the median of the job's nodes; with fewer
  than `min_nodes` nodes reporting, or more than one such node, nothing is said.

A hit becomes a symptom row of exactly the shape log rules give (SYMPTOM_SCHEMA): source `metrics`,
file `metric:<rule>:<node>:<gpu>:<series>`, seq the sample's epoch second, and a readable `line`,
so filter, refine and decide treat it as any other evidence. Captures: metric, value, prev,
increase, code (the value as an integer, e.g. the Xid), gpu_pci, gpu, median, threshold.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import polars as pl

from faultline.rules.extract import KEY, SYMPTOM_SCHEMA, _lookup_frame, _rule_constants, empty_symptoms
from faultline.rules.model import MetricMatch, Rule, Ruleset

KINDS = ("rise", "above", "below", "outlier")
STATS = ("increase", "max", "mean")
CAPTURES = ("metric", "value", "prev", "increase", "code", "gpu_pci", "gpu", "median", "threshold")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
MARGIN_S = 900   # samples this long before the start are the baseline
GRACE_S = 60     # a sample this long after the end still counts (the scrape lags the event)


def duration_s(value) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    m = _DURATION.match(str(value).strip()) if isinstance(value, str) else None
    return float(m.group(1)) * _UNIT_S[m.group(2)] if m else None


def parse_match(raw, where: str, bad) -> MetricMatch | None:
    """`match.metric` of a rule file -> MetricMatch; problems go to `bad(where, message)`."""
    if not isinstance(raw, dict):
        bad(where, "match.metric must be a mapping with 'name' and 'kind'")
        return None
    raw = {k: v for k, v in raw.items() if k != "__line__"}
    known = {"name", "kind", "min_increase", "threshold", "for", "stat", "factor", "min_value", "min_nodes", "labels"}
    for k in sorted(set(raw) - known):
        bad(where, f"unknown key match.metric.{k}")
    name, kind = raw.get("name"), raw.get("kind")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", name or ""):
        bad(where, f"match.metric.name {name!r} must be a metric name")
        return None
    if kind not in KINDS:
        bad(where, f"match.metric.kind {kind!r} not in {KINDS}")
        return None
    for_s = duration_s(raw.get("for", 0))
    if for_s is None or for_s < 0:
        bad(where, f"match.metric.for {raw.get('for')!r} must be a duration such as 90, 90s, 5m")
        for_s = 0.0
    if kind in ("above", "below") and not isinstance(raw.get("threshold"), (int, float)):
        bad(where, f"match.metric.threshold (a number) is required for kind {kind}")
    stat = raw.get("stat", "increase")
    if stat not in STATS:
        bad(where, f"match.metric.stat {stat!r} not in {STATS}")
    labels = raw.get("labels") or {}
    if not isinstance(labels, dict):
        bad(where, "match.metric.labels must map label names to values")
        labels = {}
    nums = {}
    for key, default in (("min_increase", 1.0), ("factor", 3.0), ("min_value", 1.0), ("min_nodes", 3)):
        v = raw.get(key, default)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            bad(where, f"match.metric.{key} must be a number >= 0")
            v = default
        nums[key] = v
    return MetricMatch(name=name, kind=kind, threshold=raw.get("threshold"), for_s=for_s, stat=stat,
                       labels={str(k): str(v) for k, v in labels.items() if k != "__line__"},
                       min_increase=float(nums["min_increase"]), factor=float(nums["factor"]),
                       min_value=float(nums["min_value"]), min_nodes=int(nums["min_nodes"]))


def parse_test(raw, where: str, bad) -> dict | None:
    """A promtool-style case: `series: [{node, gpu, values: "0x4 79x5", name?, labels?}]`, `interval`,
    optional `job: {start, end}` (offsets from the first sample), the rest expected of the symptom."""
    if not isinstance(raw, dict) or not isinstance(raw.get("series"), list) or not raw["series"]:
        bad(where, "a metric rule's test needs 'series': [{node, gpu, values}, ...]")
        return None
    series = []
    for s in raw["series"]:
        if not isinstance(s, dict) or not s.get("node") or not isinstance(s.get("values"), str):
            bad(where, f"series {s!r} needs node and values (promtool notation, e.g. '0x4 79x5')")
            continue
        try:
            values = expand_values(s["values"])
        except ValueError as exc:
            bad(where, f"series values {s['values']!r}: {exc}")
            continue
        series.append({"node": str(s["node"]), "gpu": s.get("gpu"), "name": s.get("name"),
                       "labels": {k: str(v) for k, v in (s.get("labels") or {}).items() if k != "__line__"},
                       "values": values})
    interval = duration_s(raw.get("interval", "1m"))
    job = raw.get("job") or {}
    start, end = duration_s(job.get("start", 0)), duration_s(job.get("end", -1)) if "end" in job else None
    if not interval or start is None or ("end" in job and end is None):
        bad(where, "interval and job.start/job.end must be durations such as 30s or 5m")
        return None
    expect = {k: v for k, v in raw.items() if k not in ("series", "interval", "job", "__line__")}
    return {"series": series, "interval": interval, "start": start, "end": end, "expect": expect}


def expand_values(text: str) -> list[float | None]:
    """promtool's series notation: `1 2 3`, `0x3` (four zeros), `1+2x3` (1 3 5 7), `5-1x2` (5 4 3), `_` and
    `_x3` (missing samples)."""
    out: list[float | None] = []
    for tok in text.split():
        m = re.fullmatch(r"(_|[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)(?:([-+]\d+(?:\.\d+)?)?x(\d+))?", tok)
        if not m:
            raise ValueError(f"cannot read {tok!r}")
        base, step, times = m.groups()
        if base == "_":
            out += [None] * ((int(times) if times else 0) + 1)
            continue
        if times is None:
            out.append(float(base))
            continue
        b, d = float(base), float(step or 0)
        out += [b + d * i for i in range(int(times) + 1)]
    return out


# ---------------------------------------------------------------------------------------- evaluation
_SERIES = [*KEY, "node", "gpu", "name", "labels"]
_HIT_SCHEMA = {"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "node": pl.String, "gpu": pl.Int32,
               "name": pl.String, "labels": pl.String, "ts": pl.Datetime("us", "UTC"), "value": pl.Float64,
               "prev": pl.Float64, "increase": pl.Float64, "median": pl.Float64, "_rule": pl.UInt32}
# What a kind returns: the job (_j), the series (_sid) and the sample that tells; names are joined back after.
_NARROW = {"_j": pl.UInt32, "_sid": pl.UInt32, "ts": pl.Datetime("us", "UTC"), "value": pl.Float64,
           "prev": pl.Float64, "increase": pl.Float64, "median": pl.Float64, "_rule": pl.UInt32}
_SER = ["_j", "_sid"]


def _windows(jobs: pl.DataFrame) -> pl.DataFrame:
    if "nodes" not in jobs.columns:
        return pl.DataFrame(schema={**{k: jobs.schema[k] for k in KEY}, "node": pl.String})
    return (jobs.filter(pl.col("start_time").is_not_null())
            .select(*KEY, "start_time", "end_time", node=pl.col("nodes")).explode("node").drop_nulls("node")
            .unique(subset=[*KEY, "node"], maintain_order=True))


@dataclass
class Samples:
    """Each job's samples of its nodes, narrow: `frame` has _j (a row of `windows`), _sid (a row of `series`),
    ts, value, prev (the sample before in the same series and job), delta (the increase; a reset counts
    from zero) and inwin (at or after the job's start); rows ordered by job, series, time."""
    frame: pl.DataFrame
    series: pl.DataFrame   # _sid, node, gpu, name, labels
    windows: pl.DataFrame  # _j, cluster, job_id, attempt, node, start_time, end_time


def samples_in_windows(metrics: pl.DataFrame, jobs: pl.DataFrame, names: list[str],
                       margin_s: float = MARGIN_S, grace_s: float = GRACE_S) -> Samples:
    """Samples of `names` on each job's nodes from `start - margin_s` to `end + grace_s`. Samples meet windows
    through hour buckets (an equi-join on node and hour, then the exact bounds), so a day of a fleet's
    samples is never paired with every job of each node; strings stay out of the big frame."""
    hour = 3_600_000_000  # microseconds
    m = (metrics.lazy().filter(pl.col("name").is_in(names) & pl.col("value").is_not_nan())
         .with_columns(_h=pl.struct("node", "gpu", "name", "labels").hash()).collect())
    series = (m.select("_h", "node", "gpu", "name", "labels").unique("_h", maintain_order=True)
              .with_row_index("_sid"))
    # A series the DCGM exporter's HPC job mapping labels with a job (`hpc_job`) is that job's GPU: on a node
    # shared by jobs it is no other job's evidence. Unlabelled series count for every job on the node.
    owner = series.select("_sid", _owner=pl.col("labels").str.json_path_match("$.hpc_job"))
    win = _windows(jobs).with_row_index("_j")
    end = pl.coalesce("end_time", pl.lit(m["ts"].max(), pl.Datetime("us", "UTC")))
    lo = (pl.col("start_time") - pl.duration(seconds=margin_s)).dt.epoch("us") // hour
    buckets = (win.lazy().select("_j", "cluster", "node", "start_time", "job_id", _end=end)
               .with_columns(_hour=pl.int_ranges(lo, (pl.col("_end") + pl.duration(seconds=grace_s)).dt.epoch("us")
                                                 // hour + 1)).explode("_hour"))
    frame = (m.lazy().join(series.lazy().select("_h", "_sid"), on="_h").sort("ts")
             .select("cluster", "node", "_sid", "ts", "value", _hour=pl.col("ts").dt.epoch("us") // hour)
             .join(buckets, on=["cluster", "node", "_hour"], maintain_order="left")
             .join(owner.lazy(), on="_sid", how="left", maintain_order="left")
             .filter((pl.col("ts") >= pl.col("start_time") - pl.duration(seconds=margin_s))
                     & (pl.col("ts") <= pl.col("_end") + pl.duration(seconds=grace_s))
                     & (pl.col("_owner").is_null() | (pl.col("_owner") == pl.col("job_id"))))
             .select("_j", "_sid", "ts", "value", inwin=pl.col("ts") >= pl.col("start_time"),
                     _k=pl.col("_j").cast(pl.UInt64) * (1 << 32) + pl.col("_sid").cast(pl.UInt64))
             .sort("_k", maintain_order=True)  # one integer key, stable: time order kept within a series
             .with_columns(_same=pl.col("_k") == pl.col("_k").shift())
             .with_columns(prev=pl.when(pl.col("_same")).then(pl.col("value").shift()))
             .with_columns(delta=pl.when(pl.col("prev").is_null()).then(None)
                           .when(pl.col("value") >= pl.col("prev")).then(pl.col("value") - pl.col("prev"))
                           .otherwise(pl.col("value")))
             .drop("_same").collect())
    return Samples(frame, series.drop("_h").cast({"_sid": pl.UInt32}), win.cast({"_j": pl.UInt32}))


def _of_rule(s: Samples, m: MetricMatch) -> pl.DataFrame:
    """The rows of the rule's metric (and labels)."""
    cond = pl.col("name") == m.name
    for k, v in m.labels.items():
        cond = cond & (pl.col("labels").str.json_path_match(f"$.{k}") == v)
    sids = s.series.filter(cond)["_sid"]
    return s.frame.filter(pl.col("_sid").is_in(sids.implode()))


def _rise(s: Samples, rule: Rule, i: int) -> pl.DataFrame:
    m = rule.metric
    rows = _of_rule(s, m)
    hits = rows.filter(pl.col("inwin") & (pl.col("delta") >= m.min_increase))
    if hits.height == 0:
        return pl.DataFrame(schema=_NARROW)
    mine = rows.join(hits.select(_SER).unique(), on=_SER, how="semi")  # only the series that rose
    total = mine.filter(pl.col("inwin")).group_by(_SER).agg(increase=pl.col("delta").fill_null(0).sum())
    by = _SER + (["value"] if rule.lookup is not None else [])
    first = hits.group_by(by, maintain_order=True).first()  # rows are in time order within a series
    return first.join(total, on=_SER, how="left").select(
        *_SER, "ts", "value", "prev", "increase", median=pl.lit(None, pl.Float64), _rule=pl.lit(i, pl.UInt32))


def _beyond(s: Samples, rule: Rule, i: int) -> pl.DataFrame:
    m = rule.metric
    rows = _of_rule(s, m)
    cond = (pl.col("value") > m.threshold) if m.kind == "above" else (pl.col("value") < m.threshold)
    rows = rows.with_columns(_c=cond & pl.col("inwin"))
    rows = rows.with_columns(_run=((pl.col("_c") != pl.col("_c").shift()) | (pl.col("_k") != pl.col("_k").shift()))
                             .fill_null(True).cum_sum())
    rows = rows.filter(pl.col("_c")).with_columns(
        _t0=pl.col("ts").min().over("_run"),
        _peak=(pl.col("value").max() if m.kind == "above" else pl.col("value").min()).over("_run"))
    held = rows.filter(pl.col("ts") - pl.col("_t0") >= pl.duration(microseconds=int(m.for_s * 1e6)))
    first = held.group_by(_SER, maintain_order=True).first()
    return first.select(*_SER, "ts", value="_peak", prev=pl.lit(None, pl.Float64),
                        increase=pl.lit(None, pl.Float64), median=pl.lit(None, pl.Float64), _rule=pl.lit(i, pl.UInt32))


def _outlier(s: Samples, rule: Rule, i: int) -> pl.DataFrame:
    m = rule.metric
    rows = (_of_rule(s, m).filter(pl.col("inwin"))
            .join(s.series.select("_sid", "node"), on="_sid", how="left", maintain_order="left"))
    job = ["_j_job"]
    rows = rows.join(s.windows.select("_j", _j_job=pl.struct(KEY).hash()), on="_j", how="left", maintain_order="left")
    node = [*job, "node"]
    stat = {"increase": pl.col("delta").fill_null(0).sum(), "max": pl.col("value").max(),
            "mean": pl.col("value").mean()}[m.stat]
    per = rows.group_by(node).agg(stat=stat)
    per = per.with_columns(median=pl.col("stat").median().over(job), n=pl.len().over(job))
    out = per.filter((pl.col("n") >= m.min_nodes) & (pl.col("stat") >= m.min_value)
                     & (pl.col("stat") > m.factor * pl.col("median")))
    out = out.filter(pl.len().over(job) == 1)  # the one node that differs; two or more: not an outlier
    if out.height == 0:
        return pl.DataFrame(schema=_NARROW)
    mine = rows.join(out, on=node)
    when = (pl.col("delta") > 0) if m.stat == "increase" else (pl.col("value") > m.factor * pl.col("median"))
    first = mine.filter(when).sort("ts").group_by(node, maintain_order=True).first()
    return first.select(*_SER, "ts", value="stat", prev=pl.lit(None, pl.Float64), increase="stat", median="median",
                        _rule=pl.lit(i, pl.UInt32))


_KIND = {"rise": _rise, "above": _beyond, "below": _beyond, "outlier": _outlier}


def _pretty(v: pl.Expr) -> pl.Expr:
    """1.0 -> "1", 0.5 -> "0.5": what an operator reads (and what a lookup key holds)."""
    return pl.when(v.is_null()).then(None).when(v == v.round(0)).then(v.cast(pl.Int64, strict=False).cast(pl.String)) \
        .otherwise(v.round(3).cast(pl.String))


def extract_metrics(metrics: pl.DataFrame | None, jobs: pl.DataFrame, ruleset: Ruleset,
                    margin_s: float = MARGIN_S, grace_s: float = GRACE_S) -> pl.DataFrame:
    """Every metric rule over the samples of every job in `jobs` (KEY, start_time, end_time, nodes)."""
    rules = ruleset.metric_rules
    if metrics is None or metrics.height == 0 or not rules or jobs.height == 0:
        return empty_symptoms()
    s = samples_in_windows(metrics, jobs, sorted({r.metric.name for r in rules}), margin_s, grace_s)
    if s.frame.height == 0:
        return empty_symptoms()
    parts = [_KIND[r.metric.kind](s, r, i).cast(_NARROW) for i, r in enumerate(rules)]
    hits = (pl.concat(parts).join(s.series, on="_sid", how="left")
            .join(s.windows.select("_j", *KEY), on="_j", how="left").drop("_j", "_sid")
            .select(list(_HIT_SCHEMA)).cast(_HIT_SCHEMA))
    hits = hits.sort("_rule", *KEY, "ts", "node", "gpu", nulls_last=True)
    if hits.height == 0:
        return empty_symptoms()
    value, gpu_s = _pretty(pl.col("value")), pl.col("gpu").cast(pl.String)
    idx = list(range(len(rules)))
    what = pl.col("_rule").replace_strict(idx, [r.metric.kind for r in rules], return_dtype=pl.String)
    thr_s = pl.col("_rule").replace_strict(idx, [f"{r.metric.threshold:g}" if r.metric.threshold is not None else None
                                                 for r in rules], return_dtype=pl.String)
    for_s = pl.col("_rule").replace_strict(idx, [f"{r.metric.for_s:g}s" for r in rules], return_dtype=pl.String)
    pci = pl.coalesce(pl.col("labels").str.json_path_match("$.pci_bus_id"), pl.format("index {}", gpu_s),
                      pl.lit("(none)"))
    code = pl.col("value").round(0).cast(pl.Int64, strict=False)
    hits = hits.with_columns(
        _code=code.cast(pl.String),
        captures=pl.struct(metric=pl.col("name"), value=value, prev=_pretty(pl.col("prev")),
                           increase=_pretty(pl.col("increase")), code=code, gpu_pci=pci, gpu=pl.col("gpu"),
                           median=_pretty(pl.col("median")), threshold=thr_s).struct.json_encode())
    const = _rule_constants(rules)[hits["_rule"]]
    # Per-rule lookups (the code of a Xid gauge -> what that Xid means), joined row-wise.
    over = pl.DataFrame(schema={"_i": pl.UInt32, **{f"lk_{c}": pl.String for c in
                                                    ("symptom", "role", "domain", "implicates", "outcome",
                                                     "summary", "action")}, "lk_priority": pl.String})
    hits = hits.with_row_index("_i")
    looked = []
    for i, r in enumerate(rules):
        if r.lookup is None:
            continue
        mine = hits.filter(pl.col("_rule") == i).select("_i", key=pl.col("_code"))
        looked.append(mine.join(_lookup_frame(r.lookup), on="key", how="left").drop("key"))
    if looked:
        over = pl.concat([over, *[f.cast({c: over.schema[c] for c in f.columns}) for f in looked]], how="diagonal")
    hits = hits.join(over, on="_i", how="left", maintain_order="left")
    base = pl.concat([hits, const], how="horizontal")
    series = pl.concat_str(pl.col("name"), pl.when(pl.col("gpu").is_not_null()).then(pl.concat_str(pl.lit("{gpu="), gpu_s, pl.lit("}")))
                           .otherwise(pl.lit("")), pl.when(pl.col("labels") != "{}").then(pl.col("labels"))
                           .otherwise(pl.lit("")))
    q = lambda e: e.fill_null("?")  # noqa: E731 - a line is always readable
    line = (pl.when(what == "rise").then(pl.format("{} on {}: rose {} -> {} (increase {} in the job window)", q(series),
                                                     q(pl.col("node")), q(_pretty(pl.col("prev"))), q(value),
                                                     q(_pretty(pl.col("increase")))))
            .when(what == "outlier").then(pl.format("{} on {}: {} over the job window, the job's nodes' median {}",
                                                    q(series), q(pl.col("node")), q(value),
                                                    q(_pretty(pl.col("median")))))
            .otherwise(pl.format("{} on {}: {} {} {} for {}", q(series), q(pl.col("node")), q(value),
                                 pl.when(what == "above").then(pl.lit("above")).otherwise(pl.lit("below")),
                                 q(thr_s), q(for_s))))
    out = base.with_columns(
        *[pl.coalesce(f"lk_{c}", c).alias(c) for c in ("symptom", "role", "domain", "implicates", "outcome", "summary",
                                                      "action")],
        priority=pl.coalesce(pl.col("lk_priority").cast(pl.Int32, strict=False), pl.col("priority")),
        peer=pl.lit(None, pl.String), address=pl.lit(None, pl.String), peer_rank=pl.lit(None, pl.String),
        rank=pl.lit(None, pl.Int32), local_rank=pl.lit(None, pl.Int32), source=pl.lit("metrics"),
        file=pl.format("metric:{}:{}:{}:{}", pl.col("rule_id"), pl.col("node"), gpu_s.fill_null("-"), series),
        seq=pl.col("ts").dt.epoch("s"), line=line)
    return out.select(list(SYMPTOM_SCHEMA)).cast(SYMPTOM_SCHEMA)


# ---------------------------------------------------------------------------------------- rule tests
T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def test_frames(cases: list[tuple[Rule, dict]]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(metrics, jobs) for promtool-style cases: case i is job `case<i>`, its series on its own nodes."""
    rows, jobs = [], []
    for i, (rule, t) in enumerate(cases):
        n = max((len(s["values"]) for s in t["series"]), default=1)
        for s in t["series"]:
            labels = json.dumps(dict(sorted(s["labels"].items())), separators=(",", ":"))
            for k, v in enumerate(s["values"]):
                if v is not None:
                    rows.append({"cluster": "test", "node": f"case{i}/{s['node']}",
                                 "gpu": None if s["gpu"] is None else int(s["gpu"]), "name": s["name"] or rule.metric.name,
                                 "ts": T0 + timedelta(seconds=k * t["interval"]), "value": float(v), "labels": labels})
        end = t["end"] if t["end"] is not None else (n - 1) * t["interval"]
        jobs.append({"cluster": "test", "job_id": f"case{i}", "attempt": 0,
                     "start_time": T0 + timedelta(seconds=t["start"]), "end_time": T0 + timedelta(seconds=end),
                     "nodes": sorted({f"case{i}/{s['node']}" for s in t["series"]})})
    metrics = pl.DataFrame(rows, schema={"cluster": pl.String, "node": pl.String, "gpu": pl.Int32, "name": pl.String,
                                         "ts": pl.Datetime("us", "UTC"), "value": pl.Float64, "labels": pl.String})
    jobs_f = pl.DataFrame(jobs, schema={"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32,
                                        "start_time": pl.Datetime("us", "UTC"), "end_time": pl.Datetime("us", "UTC"),
                                        "nodes": pl.List(pl.String)})
    return metrics, jobs_f


def run_metric_rule_tests(ruleset: Ruleset, only: str | None = None):
    """(cases, failures) of every metric rule's own cases: a match case must give the rule's symptom with
    the expected fields, on the expected node only; a no_match case must give none of it."""
    from faultline.rules.testing import TestFailure

    cases = [(r, t, ok) for r in ruleset.metric_rules if not only or r.id.startswith(only)
             for ok, tests in ((True, r.tests_match), (False, r.tests_no_match)) for t in tests if t.metric]
    if not cases:
        return 0, []
    metrics, jobs = test_frames([(r, t.metric) for r, t, _ in cases])
    hits = extract_metrics(metrics, jobs, ruleset, margin_s=10 ** 7, grace_s=0)
    failures = []
    for i, (rule, t, ok) in enumerate(cases):
        rows = [{**h, "node": h["node"].split("/", 1)[1]}
                for h in hits.filter((pl.col("job_id") == f"case{i}") & (pl.col("rule_id") == rule.id)).iter_rows(named=True)]
        text = "; ".join(f"{s['node']}:{s['gpu']} {len(s['values'])} samples" for s in t.metric["series"])
        if not ok:
            if rows:
                failures.append(TestFailure(rule.id, t.where, text, f"gave a symptom it must not: {rows[0]['line']}"))
            continue
        if not rows:
            failures.append(TestFailure(rule.id, t.where, text, "gave no symptom"))
            continue
        want_node = t.metric["expect"].get("node")
        if want_node is not None and any(r["node"] != str(want_node) for r in rows):
            failures.append(TestFailure(rule.id, t.where, text, f"also fired on {sorted({r['node'] for r in rows})}"))
        caps = {k: v for k, v in json.loads(rows[0]["captures"] or "{}").items() if v is not None}
        got = {**{k: v for k, v in rows[0].items() if k != "captures"}, **caps}
        for key, want in t.metric["expect"].items():
            have = got.get(key)
            if (None if have is None else str(have)) != (None if want is None else str(want)):
                failures.append(TestFailure(rule.id, t.where, text, f"{key}: expected {want!r}, got {have!r}"))
    return len(cases), failures
