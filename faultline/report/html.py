"""The nightly fleet report as one self-contained HTML page.

Pure functions over Polars frames (the `diagnoses` table and the frames of `report.trends`,
`report.actions` and `report.compare`); the only I/O is `write_report`. The HTML loads nothing: no
scripts, fonts, style sheets or images from anywhere; charts are inline SVG (`report.charts`). Every
string that comes from data (log lines, node names, job ids, queues, ...) is HTML-escaped.
"""

from __future__ import annotations

import os
from datetime import date, datetime, timedelta
from pathlib import Path

import polars as pl

from faultline.report import actions as act_mod, compare as cmp, trends
from faultline.report.charts import hbar_chart, legend, line_chart, stacked_bar_chart
from faultline.report.colors import LIGHT, OTHER, OUTCOME_COLORS, PALETTE, STATUS_COLORS
from faultline.report.fmt import clip as _clip, e as _e, hours as _hours, num as _num, ts as _ts
from faultline.taxonomy import OUTCOMES


# --------------------------------------------------------------------------- pieces

CSS = """
:root{--fg:#1d2330;--muted:#5b6474;--line:#e3e6ec;--bg:#f6f7f9;--card:#fff;--accent:#332288}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,-apple-system,"Segoe UI",
Roboto,"Helvetica Neue",Arial,sans-serif}
header{background:#1d2330;color:#fff;padding:22px 32px 18px}
header h1{margin:0;font-size:22px;font-weight:650;letter-spacing:.2px}
header .meta{color:#c9cfdb;font-size:13px;margin-top:4px}
main{max-width:1120px;margin:0 auto;padding:20px 24px 40px}
section{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:18px 22px;margin:0 0 18px}
h2{font-size:17px;margin:0 0 4px}
p.note{color:var(--muted);margin:0 0 12px;font-size:13px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(160px,1fr));gap:12px;margin:0 0 18px}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:12px 16px;
border-top:4px solid var(--accent)}
.card .k{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.5px}
.card .v{font-size:26px;font-weight:650;margin-top:2px}
.card .s{color:var(--muted);font-size:12px}
.card.warn{border-top-color:#CC6677}.card.amb{border-top-color:#DDCC77}
svg.chart{display:block;width:100%;height:auto;font-family:inherit}
svg .grid{stroke:#eceef2;stroke-width:1}
svg .axis{stroke:#9aa1ad;stroke-width:1}
svg .tick{fill:#5b6474;font-size:11px}
svg .lab{fill:#1d2330;font-size:12px}
svg .val{fill:#1d2330;font-size:11px;font-weight:600}
svg .axis-title{fill:#5b6474;font-size:11px}
h3.sub{font-size:12px;color:var(--muted);margin:14px 0 2px;font-weight:600;text-transform:uppercase;
letter-spacing:.5px}
ul.legend{list-style:none;padding:0;margin:8px 0 4px;display:flex;flex-wrap:wrap;gap:6px 16px;font-size:12px}
ul.legend li{display:flex;align-items:center;gap:6px}
.sw{display:inline-block;width:12px;height:12px;border-radius:2px}
.two{display:grid;grid-template-columns:1fr 1fr;gap:18px}
@media (max-width:900px){.two{grid-template-columns:1fr}}
table{width:100%;border-collapse:collapse;font-size:13px;margin-top:10px}
th{text-align:left;color:var(--muted);font-weight:600;border-bottom:2px solid var(--line);padding:6px 8px;
white-space:nowrap}
td{border-bottom:1px solid var(--line);padding:6px 8px;vertical-align:top}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
code,.ev{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"Liberation Mono",monospace;font-size:12px}
.ev{display:block;background:#f3f4f7;border-left:3px solid #c5cad3;padding:3px 7px;margin:2px 0;
white-space:pre-wrap;overflow-wrap:anywhere;color:#2b3140}
.ev b{font-weight:600;color:var(--muted)}
.chip{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;color:#fff;margin:1px 4px 1px 0;
white-space:nowrap}
.chip.light{color:#1d2330}
.pill{display:inline-block;padding:0 6px;border-radius:4px;background:#eef0f4;font-size:12px;margin:1px 3px 1px 0}
.empty{color:var(--muted);font-style:italic;margin:6px 0}
.more{color:var(--muted);font-size:12px;margin-top:6px}
td.nw{white-space:nowrap}td.when{font-size:12px;color:var(--muted)}
.evrow{margin:0 0 6px}.jobs{font-size:12px;color:var(--muted)}
.flag{font-weight:650;white-space:nowrap}.flag.up{color:#b2182b}.flag.down{color:#117733}
tr.flagged td{background:#fff6f4}
footer{color:var(--muted);font-size:12px;text-align:center;padding:10px 0 24px}
"""

def _outcome_colors(counts: pl.DataFrame) -> dict[str, str]:
    """The taxonomy's colour of each outcome in `counts` (largest first); an outcome outside it: OTHER."""
    ranked = counts.sort(["jobs", "outcome"], descending=[True, False])["outcome"].to_list()
    return {o: OUTCOME_COLORS.get(o, OTHER) for o in ranked}


def _chip(outcome: str | None, colors: dict[str, str]) -> str:
    c = colors.get(outcome or "", OTHER)
    cls = "chip light" if c in LIGHT else "chip"
    desc = OUTCOMES.get(outcome or "", "")
    return f'<span class="{cls}" style="background:{c}" title="{_e(desc)}">{_e(outcome)}</span>'


def _ev(line: str | None, who: str | None = None) -> str:
    if line is None:
        return '<span class="empty">no evidence line</span>'
    prefix = f"<b>{_e(who)}</b> " if who else ""
    return f'<span class="ev">{prefix}{_e(_clip(line))}</span>'


def _job(cluster, job_id, attempt) -> str:
    a = f".{attempt}" if attempt else ""
    return f"<code>{_e(job_id)}{_e(a)}</code><br><span class=\"pill\">{_e(cluster)}</span>"


def _days(dates: list[date]) -> list[date]:
    if not dates:
        return []
    lo, hi = min(dates), max(dates)
    return [lo + timedelta(days=i) for i in range((hi - lo).days + 1)]


def _actions_section(act: pl.DataFrame, rate: dict | None, colors: dict[str, str], max_rows: int) -> str:
    """The drain/reset list: what an operator does now, strongest action first."""
    note = ""
    if rate:
        note = (f"{rate['failed']:,} of {rate['jobs']:,} job attempts failed ({rate['rate']:.1%}), "
                f"{_hours(rate['gpu_hours_failed'])} of {_hours(rate['gpu_hours'])} GPU-hours "
                f"({rate['gpu_hours_share']:.0%}). ")
    note += ("Nodes that confident verdicts say to drain or reset; <b>state</b> comes from the node events "
             "since the node was first blamed.")
    if act.height == 0:
        return _section("Drain / reset list", note, '<p class="empty">no node to drain or reset</p>', "actions")
    trs = []
    for r in act.head(max_rows).iter_rows(named=True):
        chips = "".join(_chip(o, colors) for o in r["outcomes"])
        counts = ", ".join(f"{a.replace('_', ' ')} ×{r[a]}" for a in act_mod.NODE_ACTIONS if r[a])
        state = r["state"] + (f" (drained {_ts(r['drained_at'])})" if r["drained_at"] is not None else "")
        cls = "warn" if r["state"] in ("not drained", "back in service") else ""
        trs.append(f'<tr><td class="nw"><code>{_e(r["node"])}</code><br><span class="pill">{_e(r["cluster"])}</span></td>'
                   f'<td class="nw"><b>{_e(r["action"].replace("_", " "))}</b><br><span class="note">{_e(counts)}</span></td>'
                   f'<td>{chips}<div>{_e(_clip(r["why"]))}</div>{_ev(r["evidence"])}</td>'
                   f'<td class="n">{r["jobs"]}</td><td class="nw when">{_e(_ts(r["first_seen"]))}<br>'
                   f'{_e(_ts(r["last_seen"]))}</td><td class="{cls}">{_e(state)}</td></tr>')
    more = f'<p class="more">and {act.height - max_rows} more</p>' if act.height > max_rows else ""
    table = ('<table><thead><tr><th>node</th><th>action</th><th>why, and the line that blames the node</th>'
             '<th class="n">jobs</th><th>first / last seen</th><th>state</th></tr></thead><tbody>'
             + "".join(trs) + "</tbody></table>" + more)
    return _section("Drain / reset list", note, table, "actions")


def _rate(k: int, n: int) -> str:
    return f'{_pct(k / n)} <span class="more">({k:,} / {n:,})</span>' if n else '<span class="more">no jobs</span>'


def _pct(x: float) -> str:
    return f"{x:.1%}" if x >= 0.001 or x == 0 else f"{x:.2%}"


def _flag(r: dict) -> str:
    if r["flag"] == "up":
        return f'<span class="flag up">▲ up</span> <span class="more">p={r["p_up"]:.1g}</span>'
    if r["flag"] == "down":
        return f'<span class="flag down">▼ down</span> <span class="more">p={r["p_down"]:.1g}</span>'
    return ""


def _change(x: float | None) -> str:
    return "new" if x is None else f"×{x:.2g}" if x < 10 else f"×{x:.0f}"


def _compare_section(vs: cmp.Comparison | None, colors: dict[str, str], max_nodes: int = 12) -> str:
    """The last 24 h against the 7 days before: per outcome, cluster and blamed node."""
    title = "Last 24 hours against the previous 7 days"
    if vs is None:
        return _section(title, "", '<p class="empty">no jobs table: the rates need their denominator</p>', "compare")
    base = (f"{vs.baseline_days:g} of 7 days hold jobs" if vs.baseline_days < 7 else "7 days")
    note = (f"Last 24 h: jobs ending {_e(_ts(vs.now - cmp.RECENT))} – {_e(_ts(vs.now))} "
            f"({vs.recent_jobs:,} job attempts); baseline: the 7 days before ({_e(base)}). Rate = failures / job "
            "attempts at risk (for a node: the jobs that ran on it, counting confident hardware, network and "
            f"infrastructure blames). A change is {_e(cmp.RULE)}.")
    rows = vs.rows
    if rows.height == 0:
        return _section(title, note, '<p class="empty">no jobs in the last 8 days</p>', "compare")

    def table(kind: str, head: str, label, limit: int | None = None) -> str:
        part = rows.filter(pl.col("kind") == kind)
        if kind == "node":  # only nodes blamed in the last 24 h, or flagged
            part = part.filter((pl.col("recent") > 0) | (pl.col("flag") != ""))
        if part.height == 0:
            return f'<h3 class="sub">{head}</h3><p class="empty">none in the last 24 h</p>'
        shown = part.head(limit) if limit else part
        trs = "".join(
            f'<tr class="{"flagged" if r["flag"] else ""}"><td>{label(r)}</td>'
            f'<td class="n">{_rate(r["recent"], r["recent_jobs"])}</td>'
            f'<td class="n">{_rate(r["base"], r["base_jobs"])}</td>'
            f'<td class="n">{_change(r["change"]) if r["recent_jobs"] and r["base_jobs"] else "—"}</td>'
            f'<td class="nw">{_flag(r)}</td></tr>' for r in shown.iter_rows(named=True))
        more = f'<p class="more">and {part.height - limit} more</p>' if limit and part.height > limit else ""
        return (f'<h3 class="sub">{head}</h3><table><thead><tr><th>{kind}</th><th class="n">last 24 h</th>'
                '<th class="n">previous 7 days</th><th class="n">change</th><th>flag</th></tr></thead>'
                f'<tbody>{trs}</tbody></table>{more}')

    body = (table("outcome", "By outcome (share of all job attempts)", lambda r: _chip(r["key"], colors))
            + '<div class="two"><div>'
            + table("cluster", "By cluster (failed job attempts)", lambda r: f'<span class="pill">{_e(r["key"])}</span>')
            + '</div><div>'
            + table("node", "Blamed nodes (jobs that ran on the node)",
                    lambda r: f'<code>{_e(r["key"])}</code> <span class="pill">{_e(r["cluster"])}</span>', max_nodes)
            + "</div></div>")
    return _section(title, note, body, "compare")


def _section(title: str, note: str, body: str, sid: str) -> str:
    n = f'<p class="note">{note}</p>' if note else ""
    return f'<section id="{sid}"><h2>{_e(title)}</h2>{n}{body}</section>'


# --------------------------------------------------------------------------- the report

def render_report(diagnoses: pl.DataFrame, *, outcome_day: pl.DataFrame | None = None,
                  lemons: pl.DataFrame | None = None,
                  title: str = "faultline — fleet failure report", generated_at: datetime | str | None = None,
                  lemon_window_days: float = 7, lemon_k: int = 3, top_nodes: int = 15,
                  max_rows: int = 50, actions: pl.DataFrame | None = None, rate: dict | None = None,
                  comparison: cmp.Comparison | None = None, jobs: pl.DataFrame | None = None) -> str:
    """One self-contained HTML page. Trend frames not given are computed from `diagnoses`
    (a TABLES["diagnoses"] frame; reduced to one verdict per job attempt with `trends.current`).
    The last-24-hours comparison needs `comparison` or the `jobs` table (its denominator).
    Output depends only on the arguments: `generated_at` defaults to the newest `diagnosed_at`."""
    d = trends.current(diagnoses)
    if comparison is None and jobs is not None:
        comparison = cmp.of(jobs, d)
    od = outcome_day if outcome_day is not None else trends.outcome_day(d)
    lem = lemons if lemons is not None else trends.lemons(d, lemon_window_days, lemon_k)
    head = trends.headline(d)
    by_outcome = trends.gpu_hours_lost_by_outcome(d)
    colors = _outcome_colors(by_outcome)
    gen = _ts(generated_at) if generated_at is not None else _ts(d["diagnosed_at"].max() if d.height else None)
    rulesets = sorted(x for x in d["ruleset"].unique().to_list() if x) if d.height else []
    clusters = sorted(x for x in d["cluster"].unique().to_list() if x) if d.height else []

    span = (f' · jobs ending {_e(_ts(head["first_end"]))} – {_e(_ts(head["last_end"]))}'
            if head["first_end"] is not None else "")
    parts = [f'<header><h1>{_e(title)}</h1><div class="meta">generated {_e(gen)}{span} · clusters: '
             f'{_e(", ".join(clusters) or "—")}</div></header><main>']
    parts.append(_headline(head, by_outcome, lem, rate))
    parts.append(_compare_section(comparison, colors))
    parts.append(_actions_section(actions if actions is not None else act_mod.actions(d), rate, colors, max_rows))
    parts.append(_outcomes_section(by_outcome, colors))
    parts.append(_timeline_section(od, colors))
    parts.append(_culprits_section(d, lem, colors, top_nodes, lemon_k, lemon_window_days, max_rows))
    parts.append(_queues_section(od, colors, max_rows))
    parts.append(_ambiguous_section(d, colors, max_rows))
    parts.append(_coverage_section(d))
    parts.append(f'</main><footer>faultline · ruleset {_e(", ".join(rulesets) or "—")} · '
                 f'{head["jobs"]} verdicts · this file loads nothing from the network</footer>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
            + "".join(parts) + "</body></html>\n")


def _headline(head: dict, by_outcome: pl.DataFrame, lem: pl.DataFrame, rate: dict | None = None) -> str:
    failed = by_outcome.filter(pl.col("outcome") != "healthy").sort(["jobs", "outcome"], descending=[True, False])
    top = failed.row(0, named=True) if failed.height else None
    top_s = f'{_e(top["outcome"])} · {top["jobs"]} jobs' if top else "—"
    cards = [
        # the scheduler's denominator when known: "0 healthy" of the diagnosed failures says nothing
        ("", "Jobs diagnosed", _num(head["jobs"]),
         f'of {rate["jobs"]:,} job attempts ({rate["rate"]:.1%} failed)' if rate and rate.get("jobs")
         else f'{head["healthy"]} healthy'),
        ("warn", "Failures", _num(head["failed"]), f'top: {top_s}'),
        ("warn", "GPU-hours lost", _hours(head["gpu_hours_lost"]), "GPUs × run time of failed jobs"),
        ("amb", "Ambiguous", _num(head["ambiguous"]), "verdicts awaiting review"),
        ("warn", "Lemon nodes", _num(lem.height), f'{head["culprit_nodes"]} nodes blamed at all'),
    ]
    return '<div class="cards">' + "".join(
        f'<div class="card {c}"><div class="k">{_e(k)}</div><div class="v">{v}</div><div class="s">{s}</div></div>'
        for c, k, v, s in cards) + "</div>"


def _outcomes_section(by_outcome: pl.DataFrame, colors: dict[str, str]) -> str:
    if by_outcome.height == 0:
        return _section("Failures and GPU-hours lost by cause", "", '<p class="empty">no verdicts</p>', "causes")
    jobs = by_outcome.sort(["jobs", "outcome"], descending=[True, False])
    hrs = by_outcome.filter(pl.col("gpu_hours_lost") > 0)
    left = hbar_chart(jobs["outcome"].to_list(),
                      [(o, [float(j) if o == oo else 0.0 for oo, j in zip(jobs["outcome"], jobs["jobs"])], colors[o])
                       for o in jobs["outcome"]],
                      label="jobs per outcome", width=520, label_width=180, integer=True)
    right = (hbar_chart(hrs["outcome"].to_list(),
                        [(o, [float(h) if o == oo else 0.0 for oo, h in zip(hrs["outcome"], hrs["gpu_hours_lost"])],
                          colors[o]) for o in hrs["outcome"]],
                        label="GPU-hours lost per outcome", width=520, label_width=180,
                        value_labels=[f"{_hours(h)} h · {s:.0%}" for h, s in zip(hrs["gpu_hours_lost"], hrs["share"])])
             if hrs.height else '<p class="empty">no GPU-hours lost</p>')
    body = (f'<div class="two"><div><h3 class="sub">Jobs by outcome</h3>{left}</div>'
            f'<div><h3 class="sub">GPU-hours lost by cause</h3>{right}</div></div>')
    return _section("Failures and GPU-hours lost by cause",
                    "Every diagnosed job attempt by its verdict; GPU-hours lost = GPUs × run time "
                    "(healthy jobs lose none).", body, "causes")


def _timeline_section(od: pl.DataFrame, colors: dict[str, str]) -> str:
    if od.height == 0:
        return _section("Outcomes over time", "", '<p class="empty">no verdicts</p>', "timeline")
    days = _days(od["date"].drop_nulls().to_list())
    per = od.group_by(["date", "outcome"]).agg(pl.col("jobs").sum(), pl.col("gpu_hours_lost").sum())
    cats = [dd.strftime("%b %d") for dd in days]
    full = [dd.isoformat() for dd in days]
    idx = {dd: i for i, dd in enumerate(days)}
    named = [o for o, c in colors.items() if c != OTHER]
    series = []
    for o in named + ["other"]:
        vals = [0.0] * len(days)
        rows = per.filter(pl.col("outcome") == o) if o != "other" else per.filter(~pl.col("outcome").is_in(named))
        for dd, j in zip(rows["date"], rows["jobs"]):
            if dd in idx:
                vals[idx[dd]] += j
        if any(vals):
            series.append((o, vals, colors.get(o, OTHER)))
    bars = stacked_bar_chart(cats, series, label="failures per day by outcome", y_title="jobs",
                             category_titles=full, integer=True)
    # GPU-hours lost per day, one line per cluster (at most 6, the rest summed as "other clusters")
    per_c = od.group_by(["date", "cluster"]).agg(pl.col("gpu_hours_lost").sum())
    ctot = per_c.group_by("cluster").agg(pl.col("gpu_hours_lost").sum()).sort(
        ["gpu_hours_lost", "cluster"], descending=[True, False])
    cl = ctot["cluster"].to_list()
    shown = cl[:6]
    lines = []
    for i, c in enumerate(shown + (["other clusters"] if len(cl) > 6 else [])):
        vals = [0.0] * len(days)
        rows = (per_c.filter(pl.col("cluster") == c) if c != "other clusters"
                else per_c.filter(~pl.col("cluster").is_in(shown)))
        for dd, h in zip(rows["date"], rows["gpu_hours_lost"]):
            if dd in idx:
                vals[idx[dd]] += h
        lines.append((str(c), vals, PALETTE[i * 2 % len(PALETTE)] if c != "other clusters" else OTHER))
    line = line_chart(cats, lines, label="GPU-hours lost per day by cluster", y_title="GPU-hours",
                      category_titles=full)
    body = (legend([(n, c) for n, _, c in series]) + bars +
            '<h3 class="sub">GPU-hours lost per day</h3>' + legend([(n, c) for n, _, c in lines]) + line)
    return _section("Outcomes over time", "Diagnosed jobs per day (UTC day of the job's end), stacked by "
                    "outcome; below, the GPU-hours those failures cost per cluster.", body, "timeline")


def _culprits_section(d: pl.DataFrame, lem: pl.DataFrame, colors: dict[str, str], top: int,
                      k: int, window: float, max_rows: int) -> str:
    cc = trends.culprit_counts(d, top=top)
    note = ("Nodes named culprit by a confident (non-ambiguous) verdict of the hardware, network or "
            "infrastructure domains; ambiguous verdicts never count against a node. "
            f"Lemons: culprit of ≥ {k} jobs within {window:g} days of the newest job.")
    if cc.height == 0:
        return _section("Top culprit nodes and lemons", note, '<p class="empty">no node was blamed</p>', "culprits")
    # stacked by outcome: explode (node, outcome) counts
    named = [o for o, c in colors.items() if c != OTHER]
    rows = (trends._culprit_rows(d, trends.NODE_DOMAINS)
            .with_columns(outcome=pl.when(pl.col("outcome").is_in(named)).then(pl.col("outcome"))
                          .otherwise(pl.lit("other")))
            .group_by(["cluster", "node", "outcome"]).agg(n=pl.len())
            .join(cc.select("cluster", "node"), on=["cluster", "node"], how="semi"))
    labels = [f"{n} ({c})" for c, n in zip(cc["cluster"], cc["node"])]
    pos = {(c, n): i for i, (c, n) in enumerate(zip(cc["cluster"], cc["node"]))}
    outs = sorted(rows["outcome"].unique().to_list(), key=lambda o: (list(colors).index(o) if o in colors else 99, o))
    series = []
    for o in outs:
        vals = [0.0] * len(labels)
        for c, n, v in rows.filter(pl.col("outcome") == o).select("cluster", "node", "n").iter_rows():
            vals[pos[(c, n)]] = float(v)
        series.append((o, vals, colors.get(o, OTHER)))
    chart = legend([(o, c) for o, _, c in series]) + hbar_chart(labels, series, label="jobs blamed per node",
                                                                 label_width=220, integer=True)
    if lem.height == 0:
        table = f'<p class="empty">no node reached {k} confident blames in the window</p>'
    else:
        trs = []
        for r in lem.head(max_rows).iter_rows(named=True):
            groups: dict[tuple, list[str]] = {}  # identical (outcome, line) pairs shown once
            for j, a, o, line in zip(r["job_ids"], r["attempts"], r["outcomes"], r["evidence"]):
                groups.setdefault((o, line), []).append(f"{j}.{a}" if a else str(j))
            ev = "".join(
                f'<div class="evrow">{_chip(o, colors)}<span class="jobs">'
                f'{len(jobs)} job{"s" if len(jobs) > 1 else ""}: '
                + ", ".join(f"<code>{_e(x)}</code>" for x in jobs[:8]) + (", …" if len(jobs) > 8 else "")
                + f"</span>{_ev(line)}</div>" for (o, line), jobs in groups.items())
            trs.append(f'<tr><td class="nw"><code>{_e(r["node"])}</code><br><span class="pill">{_e(r["cluster"])}'
                       f'</span></td><td class="n">{r["times_culprit"]}</td><td class="nw when">'
                       f'{_e(_ts(r["first_seen"]))}<br>{_e(_ts(r["last_seen"]))}</td><td>{ev}</td></tr>')
        more = f'<p class="more">and {lem.height - max_rows} more</p>' if lem.height > max_rows else ""
        table = ('<h3 class="sub">Lemon nodes</h3><table><thead><tr><th>node</th><th class="n">jobs</th>'
                 '<th>first / last</th><th>outcome, jobs and the line that blames the node</th></tr></thead><tbody>'
                 + "".join(trs) + "</tbody></table>" + more)
    return _section("Top culprit nodes and lemons", note, chart + table, "culprits")


def _queues_section(od: pl.DataFrame, colors: dict[str, str], max_rows: int) -> str:
    if od.height == 0:
        return ""
    failed = od.filter(pl.col("outcome") != "healthy")
    top = (failed.group_by(["cluster", "queue", "outcome"]).agg(pl.col("jobs").sum())
           .sort(["jobs", "outcome"], descending=[True, False])
           .group_by(["cluster", "queue"], maintain_order=True).agg(top=pl.col("outcome").first(),
                                                                   top_jobs=pl.col("jobs").first()))
    q = (failed.group_by(["cluster", "queue"]).agg(pl.col("jobs").sum(), pl.col("gpu_hours_lost").sum(),
                                                   pl.col("ambiguous").sum())
         .join(top, on=["cluster", "queue"], how="left", nulls_equal=True)
         .sort(["gpu_hours_lost", "jobs", "cluster", "queue"], descending=[True, True, False, False], nulls_last=True))
    if q.height == 0:
        return ""
    trs = "".join(
        f'<tr><td>{_e(r["cluster"])}</td><td>{_e(r["queue"])}</td><td class="n">{r["jobs"]}</td>'
        f'<td class="n">{_hours(r["gpu_hours_lost"])}</td><td class="n">{r["ambiguous"]}</td>'
        f'<td>{_chip(r["top"], colors)} {r["top_jobs"]}</td></tr>'
        for r in q.head(max_rows).iter_rows(named=True))
    body = ('<table><thead><tr><th>cluster</th><th>queue</th><th class="n">failures</th>'
            '<th class="n">GPU-hours lost</th><th class="n">ambiguous</th><th>top outcome</th></tr></thead>'
            f'<tbody>{trs}</tbody></table>')
    return _section("Failures by cluster and queue", "Failed jobs (all outcomes but healthy), costliest first.",
                    body, "queues")


def _ambiguous_section(d: pl.DataFrame, colors: dict[str, str], max_rows: int) -> str:
    amb = trends.ambiguous_review(d)
    note = ("More than one cause fits these jobs, so faultline blamed no node and asks a person to decide. "
            "Newest first.")
    if amb.height == 0:
        return _section("Ambiguous verdicts awaiting review", note, '<p class="empty">none</p>', "ambiguous")
    trs = []
    for r in amb.head(max_rows).iter_rows(named=True):
        cands = "".join(
            f'<div>{_chip(c["outcome"], colors)}'
            + ("".join(f'<code class="pill">{_e(n)}</code>' for n in (c["nodes"] or [])) or "")
            + ("".join(f'<span class="pill">rank {_e(x)}</span>' for x in (c["ranks"] or [])) or "")
            + "</div>" for c in (r["candidates"] or []))
        evs = "".join(_ev(line, who) for line, who in list(zip(r["evidence"] or [], r["evidence_nodes"] or []))[:3])
        cand_lines = "".join(_ev(c["line"], c["outcome"]) for c in (r["candidates"] or []) if c["line"])
        trs.append(f'<tr><td>{_job(r["cluster"], r["job_id"], r["attempt"])}</td>'
                   f'<td class="nw when">{_e(_ts(r["end_time"]))}<br><span class="pill">{_e(r["queue"])}</span></td>'
                   f'<td>{cands or "—"}<div class="more">{_e(r["confidence_reason"] or "")}</div></td>'
                   f'<td>{evs or cand_lines or _ev(None)}</td></tr>')
    more = f'<p class="more">and {amb.height - max_rows} more</p>' if amb.height > max_rows else ""
    body = ('<table><thead><tr><th>job</th><th>ended</th><th>candidates</th><th>evidence</th></tr></thead>'
            f'<tbody>{"".join(trs)}</tbody></table>{more}')
    return _section(f"Ambiguous verdicts awaiting review ({amb.height})", note, body, "ambiguous")


def _coverage_section(d: pl.DataFrame) -> str:
    cov = trends.coverage_summary(d)
    note = ("Share of diagnosed jobs for which each telemetry source was present (ok), present but empty, "
            "failed to load (error) or not configured. Missing telemetry lowers confidence.")
    if cov.height == 0:
        return _section("Telemetry coverage", note, '<p class="empty">no coverage records</p>', "coverage")
    series = [(s, [100.0 * v for v in cov[f"{s}_share"].to_list()], STATUS_COLORS[s]) for s in trends.COVERAGE_STATUSES]
    chart = hbar_chart(cov["source"].to_list(), series, label="telemetry coverage by source", max_value=100,
                       label_width=140, tick_suffix="%", value_labels=[f"{ok:.0%} ok" for ok in cov["ok_share"]])
    trs = "".join(
        f'<tr><td><code>{_e(r["source"])}</code></td>' + "".join(
            f'<td class="n">{r[s]} <span class="more">({r[s + "_share"]:.0%})</span></td>'
            for s in trends.COVERAGE_STATUSES) + "</tr>"
        for r in cov.iter_rows(named=True))
    table = ('<table><thead><tr><th>source</th>' + "".join(f'<th class="n">{s}</th>' for s in trends.COVERAGE_STATUSES)
             + f'</tr></thead><tbody>{trs}</tbody></table>')
    return _section("Telemetry coverage", note,
                    legend([(s, STATUS_COLORS[s]) for s in trends.COVERAGE_STATUSES]) + chart + table, "coverage")


def write_report(path: str | os.PathLike, html_text: str) -> Path:
    """Write the report atomically (temp file + rename); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(html_text, encoding="utf-8")
    os.replace(tmp, p)
    return p
