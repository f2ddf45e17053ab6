"""Inline SVG charts for the HTML report: no scripts, no external assets; every data string escaped."""

from __future__ import annotations

import math

from faultline.report.fmt import e as _e

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


