"""Text formatting shared by the HTML report and its markdown artifact."""

from __future__ import annotations

import html
from datetime import datetime

MAX_LINE = 300


def e(x) -> str:
    """HTML-escape anything (None -> an em dash)."""
    if x is None:
        return "—"
    return html.escape(str(x), quote=True)


def clip(s: str | None, n: int = MAX_LINE) -> str | None:
    if s is None:
        return None
    return s if len(s) <= n else s[: n - 1] + "…"


def num(x: float, digits: int = 0) -> str:
    if x is None:
        return "—"
    if digits == 0:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def hours(x: float) -> str:
    return num(x, 1) if x < 100 else num(x)


def ts(x) -> str:
    if x is None:
        return "—"
    if isinstance(x, datetime):
        return x.strftime("%Y-%m-%d %H:%M UTC") if x.tzinfo else x.strftime("%Y-%m-%d %H:%M")
    return str(x)
