"""The nightly fleet report: one self-contained HTML file and a short markdown summary.

Pure functions over Polars frames (the `diagnoses` table and the trend frames of
`faultline.trends`); the only I/O is `write_report`. The HTML loads nothing: no scripts,
fonts, style sheets or images from anywhere; charts are inline SVG drawn here. Every string
that comes from data (log lines, node names, job ids, queues, ...) is HTML-escaped.
"""

from __future__ import annotations

import html
import math
import os
from datetime import date, datetime, timedelta
from pathlib import Path

import polars as pl

from faultline import trends
from faultline.taxonomy import OUTCOMES

# Paul Tol's "muted" qualitative palette, then his "bright" and "light" ones: distinguishable with the
# common colour-vision deficiencies. Each outcome of the taxonomy has its own colour, fixed by its place
# in faultline.taxonomy.OUTCOMES, so a colour means the same outcome in every report; healthy and
# unknown verdicts have fixed greys.
PALETTE = ("#332288", "#88CCEE", "#117733", "#DDCC77", "#CC6677", "#44AA99", "#882255", "#EE8866", "#4477AA",
           "#999933", "#AA4499", "#66CCEE", "#228833", "#CCBB44", "#EE6677", "#AA3377", "#BBCC33")
OTHER = "#8F8F8F"
FIXED = {"healthy": "#D4D4D4", "unknown": "#5E5E5E"}
OUTCOME_COLORS = {**dict(zip([o for o in OUTCOMES if o not in FIXED], PALETTE, strict=True)), **FIXED}
STATUS_COLORS = {"ok": "#117733", "empty": "#DDCC77", "error": "#CC6677", "not_configured": "#BBBBBB"}
ACCENT = "#332288"
MAX_LINE = 300


def _e(x) -> str:
    """HTML-escape anything (None -> an em dash)."""
    if x is None:
        return "—"
    return html.escape(str(x), quote=True)


def _clip(s: str | None, n: int = MAX_LINE) -> str | None:
    if s is None:
        return None
    return s if len(s) <= n else s[: n - 1] + "…"


def _num(x: float, digits: int = 0) -> str:
    if x is None:
        return "—"
    if digits == 0:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def _hours(x: float) -> str:
    return _num(x, 1) if x < 100 else _num(x)


def _ts(x) -> str:
    if x is None:
        return "—"
    if isinstance(x, datetime):
        return x.strftime("%Y-%m-%d %H:%M UTC") if x.tzinfo else x.strftime("%Y-%m-%d %H:%M")
    return str(x)


# --------------------------------------------------------------------------- SVG charts

def nice_ticks(vmax: float, n: int = 4, integer: bool = False) -> list[float]:
    """0 and about n round steps (1, 2, 2.5, 5 x 10^k; whole numbers if `integer`) covering vmax."""
    if vmax <= 0:
        return [0.0, 1.0]
    raw = vmax / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1, math.ceil(step))
    count = math.ceil(vmax / step - 1e-9)
    return [i * step for i in range(count + 1)]


def _tick_label(v: float) -> str:
    if v >= 10_000:
        return f"{v / 1000:,.0f}k"
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.2f}".rstrip("0").rstrip(".")


def _svg_open(w: int, h: int, label: str) -> str:
    return (f'<svg class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
            f'aria-label="{_e(label)}" preserveAspectRatio="xMinYMin meet">')


def _y_axis(ticks: list[float], width: int, ml: int, mr: int, mt: int, ph: float, y_title: str | None) -> list[str]:
    """Grid lines, tick labels and the rotated title of a vertical value axis."""
    top = ticks[-1]
    out = []
    for t in ticks:
        y = mt + ph - ph * t / top
        out.append(f'<line class="grid" x1="{ml}" x2="{width - mr}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text class="tick" x="{ml - 6}" y="{y + 4:.1f}" text-anchor="end">{_tick_label(t)}</text>')
    if y_title:
        out.append(f'<text class="axis-title" x="12" y="{mt + ph / 2:.0f}" text-anchor="middle" '
                   f'transform="rotate(-90 12 {mt + ph / 2:.0f})">{_e(y_title)}</text>')
    return out


def stacked_bar_chart(categories: list[str], series: list[tuple[str, list[float], str]], *,
                      label: str, width: int = 1040, height: int = 280, y_title: str = "",
                      category_titles: list[str] | None = None, integer: bool = False) -> str:
    """Vertical bars, one per category (e.g. a day), stacked by series (name, values, colour)."""
    ml, mr, mt, mb = 52, 12, 14, 38
    pw, ph = width - ml - mr, height - mt - mb
    n = max(len(categories), 1)
    totals = [sum(s[1][i] for s in series) for i in range(len(categories))]
    ticks = nice_ticks(max(totals, default=0), integer=integer)
    top = ticks[-1]
    out = [_svg_open(width, height, label), *_y_axis(ticks, width, ml, mr, mt, ph, y_title)]
    band = pw / n
    bw = max(1.0, min(band * 0.74, 48))
    every = max(1, math.ceil(n / 16))
    for i, cat in enumerate(categories):
        x = ml + band * i + (band - bw) / 2
        y = mt + ph
        full = (category_titles or categories)[i]
        for name, values, color in series:
            v = values[i]
            if v <= 0:
                continue
            h = ph * v / top
            y -= h
            out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw:.1f}" height="{h:.1f}" fill="{color}">'
                       f'<title>{_e(full)} · {_e(name)}: {_tick_label(v)}</title></rect>')
        if totals[i] > 0 and bw >= 18:
            out.append(f'<text class="val" x="{x + bw / 2:.1f}" y="{y - 4:.1f}" text-anchor="middle">'
                       f'{_tick_label(totals[i])}</text>')
        if i % every == 0:
            out.append(f'<text class="tick" x="{x + bw / 2:.1f}" y="{mt + ph + 16}" text-anchor="middle">'
                       f'{_e(cat)}</text>')
    out.append(f'<line class="axis" x1="{ml}" x2="{width - mr}" y1="{mt + ph}" y2="{mt + ph}"/>')
    out.append("</svg>")
    return "".join(out)


def hbar_chart(labels: list[str], series: list[tuple[str, list[float], str]], *, label: str,
               width: int = 1040, row: int = 26, label_width: int = 190, max_value: float | None = None,
               value_labels: list[str] | None = None, axis: bool = True, tick_suffix: str = "",
               integer: bool = False) -> str:
    """Horizontal bars, one per label, stacked by series (name, values, colour); the total (or
    `value_labels[i]`) is written after each bar."""
    longest = min(28, max((len(lab) for lab in labels), default=0))  # labels are cut at 28 characters
    ml, mr, mt = max(label_width, int(7 * longest) + 14), 80, 6  # room for the longest label
    mb = 24 if axis else 4
    pw = width - ml - mr
    n = len(labels)
    height = mt + n * row + mb
    totals = [sum(s[1][i] for s in series) for i in range(n)]
    ticks = nice_ticks(max_value if max_value is not None else max(totals, default=0), integer=integer)
    top = ticks[-1]
    out = [_svg_open(width, height, label)]
    if axis:
        for t in ticks:
            x = ml + pw * t / top
            out.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{mt}" y2="{mt + n * row}"/>'
                       f'<text class="tick" x="{x:.1f}" y="{mt + n * row + 16}" text-anchor="middle">'
                       f'{_tick_label(t)}{_e(tick_suffix)}</text>')
    for i, lab in enumerate(labels):
        y = mt + i * row
        short = lab if len(lab) <= 28 else lab[:27] + "…"
        out.append(f'<text class="lab" x="{ml - 8}" y="{y + row / 2 + 4:.1f}" text-anchor="end">'
                   f'<title>{_e(lab)}</title>{_e(short)}</text>')
        x = float(ml)
        for name, values, color in series:
            v = values[i]
            if v <= 0:
                continue
            w = pw * v / top
            out.append(f'<rect x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="{row - 8}" fill="{color}">'
                       f'<title>{_e(lab)} · {_e(name)}: {_tick_label(v)}</title></rect>')
            x += w
        text = value_labels[i] if value_labels else _tick_label(totals[i])
        out.append(f'<text class="val" x="{x + 6:.1f}" y="{y + row / 2 + 4:.1f}">{_e(text)}</text>')
    out.append(f'<line class="axis" x1="{ml}" x2="{ml}" y1="{mt}" y2="{mt + n * row}"/>')
    out.append("</svg>")
    return "".join(out)


def line_chart(categories: list[str], series: list[tuple[str, list[float], str]], *, label: str,
               width: int = 1040, height: int = 220, y_title: str = "",
               category_titles: list[str] | None = None) -> str:
    """One polyline per series (name, values, colour) over shared categories."""
    ml, mr, mt, mb = 52, 12, 14, 38
    pw, ph = width - ml - mr, height - mt - mb
    n = max(len(categories), 1)
    ticks = nice_ticks(max((v for s in series for v in s[1]), default=0))
    top = ticks[-1]
    out = [_svg_open(width, height, label), *_y_axis(ticks, width, ml, mr, mt, ph, y_title)]
    band = pw / n
    every = max(1, math.ceil(n / 16))
    xs = [ml + band * i + band / 2 for i in range(n)]
    for i, cat in enumerate(categories):
        if i % every == 0:
            out.append(f'<text class="tick" x="{xs[i]:.1f}" y="{mt + ph + 16}" text-anchor="middle">{_e(cat)}</text>')
    for name, values, color in series:
        pts = [(xs[i], mt + ph - ph * v / top) for i, v in enumerate(values)]
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2.5" stroke-linejoin="round" '
                   f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in pts)}"/>')
        if n <= 62:
            for i, (x, y) in enumerate(pts):
                full = (category_titles or categories)[i]
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}">'
                           f'<title>{_e(full)} · {_e(name)}: {_tick_label(values[i])}</title></circle>')
    out.append(f'<line class="axis" x1="{ml}" x2="{width - mr}" y1="{mt + ph}" y2="{mt + ph}"/>')
    out.append("</svg>")
    return "".join(out)


def legend(items: list[tuple[str, str]]) -> str:
    return '<ul class="legend">' + "".join(
        f'<li><span class="sw" style="background:{c}"></span>{_e(n)}</li>' for n, c in items) + "</ul>"


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
footer{color:var(--muted);font-size:12px;text-align:center;padding:10px 0 24px}
"""

_LIGHT = {"#88CCEE", "#44AA99", "#999933", "#DDCC77", "#BBBBBB", "#EE8866", "#D4D4D4"}


def _outcome_colors(counts: pl.DataFrame) -> dict[str, str]:
    """The taxonomy's colour of each outcome in `counts` (largest first); an outcome outside it: OTHER."""
    ranked = counts.sort(["jobs", "outcome"], descending=[True, False])["outcome"].to_list()
    return {o: OUTCOME_COLORS.get(o, OTHER) for o in ranked}


def _chip(outcome: str | None, colors: dict[str, str]) -> str:
    c = colors.get(outcome or "", OTHER)
    cls = "chip light" if c in _LIGHT else "chip"
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
        counts = ", ".join(f"{a.replace('_', ' ')} ×{r[a]}" for a in trends.NODE_ACTIONS if r[a])
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


def _section(title: str, note: str, body: str, sid: str) -> str:
    n = f'<p class="note">{note}</p>' if note else ""
    return f'<section id="{sid}"><h2>{_e(title)}</h2>{n}{body}</section>'


# --------------------------------------------------------------------------- the report

def render_report(diagnoses: pl.DataFrame, *, outcome_day: pl.DataFrame | None = None,
                  lemons: pl.DataFrame | None = None,
                  title: str = "faultline — fleet failure report", generated_at: datetime | str | None = None,
                  lemon_window_days: float = 7, lemon_k: int = 3, top_nodes: int = 15,
                  max_rows: int = 50, actions: pl.DataFrame | None = None, rate: dict | None = None) -> str:
    """One self-contained HTML page. Trend frames not given are computed from `diagnoses`
    (a TABLES["diagnoses"] frame; reduced to one verdict per job attempt with `trends.current`).
    Output depends only on the arguments: `generated_at` defaults to the newest `diagnosed_at`."""
    d = trends.current(diagnoses)
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
    parts.append(_headline(head, by_outcome, lem))
    parts.append(_actions_section(actions if actions is not None else trends.actions(d), rate, colors, max_rows))
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


def _headline(head: dict, by_outcome: pl.DataFrame, lem: pl.DataFrame) -> str:
    failed = by_outcome.filter(pl.col("outcome") != "healthy").sort(["jobs", "outcome"], descending=[True, False])
    top = failed.row(0, named=True) if failed.height else None
    top_s = f'{_e(top["outcome"])} · {top["jobs"]} jobs' if top else "—"
    cards = [
        ("", "Jobs diagnosed", _num(head["jobs"]), f'{head["healthy"]} healthy'),
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


# --------------------------------------------------------------------------- markdown + file

_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_[]|#<>"})


def _md(x) -> str:
    """Escape for markdown (pipes, emphasis, links) and for the HTML it is rendered into."""
    if x is None:
        return "—"
    return html.escape(str(x).replace("\n", " "), quote=False).translate(_MD_SPECIAL)


def render_markdown(diagnoses: pl.DataFrame, *, lemons: pl.DataFrame | None = None,
                    report_path: str | os.PathLike | None = None, title: str = "faultline fleet report",
                    generated_at: datetime | str | None = None, lemon_window_days: float = 7,
                    lemon_k: int = 3, top: int = 5, actions: pl.DataFrame | None = None,
                    rate: dict | None = None) -> str:
    """A short markdown summary (Prefect artifact): headline, the drain/reset list, top outcomes, lemons,
    ambiguous count, and where the HTML report is."""
    d = trends.current(diagnoses)
    head = trends.headline(d)
    lem = lemons if lemons is not None else trends.lemons(d, lemon_window_days, lemon_k)
    bo = trends.gpu_hours_lost_by_outcome(d).filter(pl.col("outcome") != "healthy")
    gen = _ts(generated_at) if generated_at is not None else _ts(d["diagnosed_at"].max() if d.height else None)
    out = [f"# {_md(title)}", "",
           f"Generated {_md(gen)}: **{head['jobs']}** jobs diagnosed, **{head['failed']}** failed, "
           f"**{_hours(head['gpu_hours_lost'])}** GPU-hours lost, **{head['ambiguous']}** ambiguous "
           f"verdict(s) awaiting review.", ""]
    if rate:
        out += [f"{rate['failed']:,} of {rate['jobs']:,} job attempts failed ({rate['rate']:.1%}); "
                f"{_hours(rate['gpu_hours_failed'])} of {_hours(rate['gpu_hours'])} GPU-hours "
                f"({rate['gpu_hours_share']:.0%}).", ""]
    act = actions if actions is not None else trends.actions(d)
    out += ["## Drain / reset list", ""]
    if act.height:
        out += ["| node | cluster | action | why | jobs | first seen | last seen | state |",
                "|---|---|---|---|---:|---|---|---|"]
        for r in act.head(top * 4).iter_rows(named=True):
            out.append(f"| {_md(r['node'])} | {_md(r['cluster'])} | {_md(r['action'])} | {_md(_clip(r['why'], 90))} | "
                       f"{r['jobs']} | {_md(_ts(r['first_seen']))} | {_md(_ts(r['last_seen']))} | {_md(r['state'])} |")
        if act.height > top * 4:
            out.append(f"\nand {act.height - top * 4} more")
    else:
        out.append("none")
    out.append("")
    if bo.height:
        out += ["## Top outcomes", "", "| outcome | jobs | GPU-hours lost | share |", "|---|---:|---:|---:|"]
        out += [f"| {_md(r['outcome'])} | {r['jobs']} | {_hours(r['gpu_hours_lost'])} | {r['share']:.0%} |"
                for r in bo.head(top).iter_rows(named=True)]
        out.append("")
    out += [f"## Lemon nodes (culprit of ≥ {lemon_k} jobs in {lemon_window_days:g} days)", ""]
    if lem.height:
        out += ["| node | cluster | jobs | outcomes | last seen |", "|---|---|---:|---|---|"]
        for r in lem.head(top * 2).iter_rows(named=True):
            outs = ", ".join(sorted(set(r["outcomes"])))
            out.append(f"| {_md(r['node'])} | {_md(r['cluster'])} | {r['times_culprit']} | {_md(outs)} | "
                       f"{_md(_ts(r['last_seen']))} |")
        if lem.height > top * 2:
            out.append(f"\nand {lem.height - top * 2} more")
    else:
        out.append("none")
    out.append("")
    if report_path is not None:
        out.append(f"Full report: {_md(os.fspath(report_path))}")
    return "\n".join(out).rstrip() + "\n"


def write_report(path: str | os.PathLike, html_text: str) -> Path:
    """Write the report atomically (temp file + rename); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(html_text, encoding="utf-8")
    os.replace(tmp, p)
    return p
