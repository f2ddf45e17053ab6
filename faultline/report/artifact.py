"""The Prefect markdown artifact of the nightly report: headline, denominator, last 24 h against the
previous 7 days, the drain/reset list, top outcomes, lemons, and where the HTML report is."""

from __future__ import annotations

import html
import os
from datetime import datetime

import polars as pl

from faultline.report import actions as act_mod, compare as cmp, trends
from faultline.report.fmt import clip as _clip, hours as _hours, ts as _ts

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
                    rate: dict | None = None, comparison: cmp.Comparison | None = None) -> str:
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
    if comparison is not None:
        out += _compare_md(comparison)
    act = actions if actions is not None else act_mod.actions(d)
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




def _compare_md(vs: cmp.Comparison) -> list[str]:
    """Outcomes and clusters, and flagged or recently blamed nodes, last 24 h against the 7 days before."""
    def r(k, n):
        return f"{k / n:.1%} ({k}/{n})" if n else "no jobs"

    rows = vs.rows.filter((pl.col("kind") != "node") | (pl.col("recent") > 0) | (pl.col("flag") != ""))
    out = ["## Last 24 h against the previous 7 days", "",
           f"{vs.recent_jobs:,} job attempts ended in the 24 h up to {_md(_ts(vs.now))}; baseline "
           f"{vs.baseline_days:g} of 7 days. Flag: {_md(cmp.RULE)}.", ""]
    if rows.height == 0:
        return out + ["no jobs in the last 8 days", ""]
    out += ["| kind | what | last 24 h | previous 7 days | change | flag |", "|---|---|---:|---:|---:|---|"]
    for x in rows.head(30).iter_rows(named=True):
        what = x["key"] if x["kind"] != "node" else f"{x['key']} ({x['cluster']})"
        ch = "—" if not (x["recent_jobs"] and x["base_jobs"]) else ("new" if x["change"] is None else f"×{x['change']:.2g}")
        flag = {"up": f"▲ up (p={x['p_up']:.1g})", "down": f"▼ down (p={x['p_down']:.1g})"}.get(x["flag"], "")
        out.append(f"| {x['kind']} | {_md(what)} | {r(x['recent'], x['recent_jobs'])} | "
                   f"{r(x['base'], x['base_jobs'])} | {ch} | {flag} |")
    return out + [""]
