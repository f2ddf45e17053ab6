"""The nightly HTML report and markdown summary: self-contained, escaped, well-formed, and it renders."""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import zlib
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest

from faultline.report import artifact, charts, html as report_html, trends
from faultline.report.colors import PALETTE

from .test_trends import diag_row, ev, frame, synthetic_fleet

GEN = datetime(2024, 4, 4, 6, 0, tzinfo=timezone.utc)
EVIL = "<script>alert(1)</script>"
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
# SVG elements written self-closing (<line/>) come through handle_startendtag
LOADING_TAGS = {"script", "link", "img", "iframe", "object", "embed", "base", "audio", "video", "source", "image",
                "use", "frame", "portal"}


class Checker(HTMLParser):
    """Nesting must balance; collects every tag, attribute and text run."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str, str | None]] = []
        self.text: list[str] = []
        self.style: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, k, v) for k, v in attrs]
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, k, v) for k, v in attrs]

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'} at {self.getpos()}")
            return
        self.stack.pop()

    def handle_data(self, data):
        (self.style if self.stack and self.stack[-1] == "style" else self.text).append(data)


def check(html_text: str) -> Checker:
    c = Checker()
    c.feed(html_text)
    c.close()
    assert not c.errors, c.errors[:5]
    assert c.stack == [], f"unclosed: {c.stack}"
    return c


@pytest.fixture(scope="module")
def fleet() -> pl.DataFrame:
    return synthetic_fleet()


def jobs_of(d: pl.DataFrame) -> pl.DataFrame:
    """A jobs table (the rates' denominator) for a diagnoses frame: every verdict's job plus as many
    healthy ones, on the verdict's culprit and affected nodes."""
    jobs = d.select("cluster", "job_id", "attempt", "end_time",
                    state=pl.when(pl.col("outcome") == "healthy").then(pl.lit("COMPLETED")).otherwise(pl.lit("FAILED")),
                    nodes=pl.concat_list("culprit_nodes", "affected_nodes").list.unique().list.sort())
    ok = jobs.with_columns(job_id=pl.col("job_id") + "-ok", state=pl.lit("COMPLETED"))
    return pl.concat([jobs, ok])


@pytest.fixture(scope="module")
def page(fleet) -> str:
    return report_html.render_report(fleet, title="Fleet report <test>", generated_at=GEN, jobs=jobs_of(fleet))


def test_well_formed_and_self_contained(page):
    c = check(page)
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page.lower().replace("&lt;script", "")
    assert "<script src" not in page and "<link" not in page
    assert not LOADING_TAGS & set(c.tags), LOADING_TAGS & set(c.tags)
    for tag, k, v in c.attrs:
        assert not k.startswith("on"), (tag, k)  # no event handlers
        if k in ("src", "href", "xlink:href", "srcset", "action", "poster", "data"):
            raise AssertionError(f"resource attribute {tag} {k}={v}")
    css = "".join(c.style)
    assert "url(" not in css and "@import" not in css and "@font-face" not in css
    assert "http" not in page  # nothing in this fleet's logs names a URL, so nothing at all may
    assert c.tags.count("svg") >= 5


def test_log_text_is_escaped(page):
    assert EVIL not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "Fleet report &lt;test&gt;" in page
    c = check(page)
    assert any(EVIL in t for t in c.text)  # shown to the reader as text


def test_urls_in_logs_stay_text():
    d = frame([diag_row(job_id='x"><img src=x onerror=alert(1)>', ambiguous=True, outcome="network_ib",
                        domain="network", queue="<b>q</b>", cluster="c&1",
                        evidence=[ev('GET http://evil.example/x.js "quoted" \' <link rel=stylesheet href=//x>', "n1")],
                        candidates=[{"outcome": "network_ib", "domain": "network",
                                     "culprit": {"nodes": ["<n1>"], "ranks": [], "gpus": []},
                                     "evidence": [ev("<iframe src=http://x>", "n1")]}])])
    page = report_html.render_report(d, generated_at=GEN)
    c = check(page)
    assert not LOADING_TAGS & set(c.tags)
    assert not [a for a in c.attrs if a[1].startswith("on") or a[1] in ("src", "href")]
    assert "<img" not in page and "<iframe" not in page and "<b>q</b>" not in page
    assert "http://evil.example/x.js" in "".join(c.text)


def test_sections_and_numbers(fleet, page):
    c = check(page)
    text = " ".join(c.text)
    for sid in ("compare", "causes", "timeline", "culprits", "queues", "ambiguous", "coverage"):
        assert f'id="{sid}"' in page
    for heading in ("Jobs diagnosed", "Failures", "GPU-hours lost", "Ambiguous", "Lemon nodes",
                    "Outcomes over time", "Top culprit nodes and lemons", "GPU-hours lost by cause",
                    "Ambiguous verdicts awaiting review", "Telemetry coverage",
                    "Last 24 hours against the previous 7 days", "By outcome", "Blamed nodes"):
        assert heading in text, heading
    head = trends.headline(fleet)
    assert f'>{head["jobs"]:,}<' in page
    assert f'>{head["ambiguous"]:,}<' in page
    lem = trends.lemons(fleet, 7, 3)
    for node in lem["node"]:
        assert node in text
    assert "alpha-gpu017" in text and "beta-gpu042" in text
    for src in ("applog", "syslog", "scheduler", "k8s_event"):
        assert src in text
    assert "legend" in page and "<title>" in page  # legends and hover titles
    # the comparison's rates carry their denominators: the last 24 h hold twice the verdicts of that day
    last = fleet.filter(pl.col("end_time") > fleet["end_time"].max() - timedelta(hours=24))
    assert f"/ {2 * last.height:,})" in text
    assert "conditional binomial test" in text


def test_comparison_needs_its_denominator(fleet):
    page = report_html.render_report(fleet, generated_at=GEN)
    assert "the rates need their denominator" in page


def test_deterministic_and_empty(fleet, page):
    assert report_html.render_report(fleet, title="Fleet report <test>", generated_at=GEN, jobs=jobs_of(fleet)) == page
    empty = report_html.render_report(frame([]), generated_at=GEN)
    check(empty)
    assert "no verdicts" in empty
    assert artifact.render_markdown(frame([])).startswith("# ")


def test_given_trends_are_used(fleet):
    lem = trends.lemons(fleet, 7, 3).head(1)
    page = report_html.render_report(fleet, lemons=lem, outcome_day=trends.outcome_day(fleet), generated_at=GEN)
    assert "alpha-gpu017" in page
    assert page.count("<tr><td class=\"nw\"><code>") == 1  # one lemon row


def test_markdown(fleet, tmp_path):
    md = artifact.render_markdown(fleet, report_path="/reports/2024-04-04 | nightly.html", generated_at=GEN)
    head = trends.headline(fleet)
    assert md.startswith("# ")
    assert f"**{head['jobs']}** jobs diagnosed" in md
    assert f"**{head['ambiguous']}** ambiguous" in md
    assert "alpha-gpu017" in md and "beta-gpu042" in md
    assert "nccl\\_timeout\\_hang" in md
    assert "/reports/2024-04-04 \\| nightly.html" in md
    evil = frame([diag_row(cluster="c|<x>", culprit_nodes=["n|1"], job_id=str(i)) for i in range(3)])
    md = artifact.render_markdown(evil)
    assert "<x>" not in md and "n\\|1" in md
    from faultline.report import compare

    md = artifact.render_markdown(fleet, comparison=compare.of(jobs_of(fleet), fleet))
    assert "## Last 24 h against the previous 7 days" in md and "| outcome |" in md


def test_write_report(tmp_path, page):
    p = report_html.write_report(tmp_path / "sub" / "report.html", page)
    assert p.read_text(encoding="utf-8") == page
    assert [x.name for x in p.parent.iterdir()] == ["report.html"]


def test_svg_helpers():
    assert charts.nice_ticks(0) == [0.0, 1.0]
    assert charts.nice_ticks(74)[-1] >= 74
    assert charts.nice_ticks(9) == [0, 2.5, 5.0, 7.5, 10.0]
    svg = charts.stacked_bar_chart(["a", "b"], [("x<y", [1, 2], "#000"), ("z", [0, 3], "#111")], label="t")
    check(svg)
    assert "x&lt;y" in svg and svg.count("<rect") == 3
    check(charts.hbar_chart(["n1"], [("s", [2.0], "#000")], label="t"))
    check(charts.line_chart(["d1", "d2"], [("c", [1.0, 2.0], "#000")], label="t"))


# --------------------------------------------------------------------------- rendering in Chromium

def decode_png(data: bytes) -> tuple[int, int, int, list[bytes]]:
    """(width, height, bytes per pixel, rows) of an 8-bit, non-interlaced grey/RGB/RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, ihdr = 8, [], None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = ihdr
    assert depth == 8 and interlace == 0 and ctype in (0, 2, 4, 6), ihdr
    bpp = {0: 1, 2: 3, 4: 2, 6: 4}[ctype]
    raw = zlib.decompress(b"".join(idat))
    stride = w * bpp
    prev, rows = bytearray(stride), []
    for y in range(h):
        f = raw[y * (stride + 1)]
        cur = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(bpp, stride):
                cur[i] = (cur[i] + cur[i - bpp]) & 255
        elif f == 2:
            cur = bytearray((a + b) & 255 for a, b in zip(cur, prev))
        elif f == 3:
            for i in range(stride):
                cur[i] = (cur[i] + (((cur[i - bpp] if i >= bpp else 0) + prev[i]) >> 1)) & 255
        elif f == 4:
            for i in range(stride):
                a = cur[i - bpp] if i >= bpp else 0
                b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(cur))
        prev = cur
    return w, h, bpp, rows


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return None


def screenshot(html_path: Path, png: Path, profile: Path, size: str = "1280,2400", timeout: float = 120) -> None:
    exe = _chromium()
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--hide-scrollbars", "--force-device-scale-factor=1", f"--user-data-dir={profile}",
           f"--screenshot={png}", f"--window-size={size}", html_path.resolve().as_uri()]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "HOME": str(profile)})
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # chromium's own process group, started above
        proc.communicate()
        raise
    assert png.exists(), out.decode(errors="replace")[-2000:]


@pytest.mark.skipif(_chromium() is None, reason="chromium not installed (Debian: apt-get install -y chromium)")
def test_renders_in_headless_chromium(page, tmp_path):
    html_path = report_html.write_report(tmp_path / "report.html", page)
    png = tmp_path / "report.png"
    screenshot(html_path, png, tmp_path / "profile")
    data = png.read_bytes()
    assert len(data) > 30_000, f"suspiciously small screenshot: {len(data)} bytes"
    w, h, bpp, rows = decode_png(data)
    assert (w, h) == (1280, 2400)
    colors, inked = set(), 0
    samples = 0
    for y in range(0, h, 7):
        row = rows[y]
        for x in range(0, w, 5):
            px = row[x * bpp:x * bpp + 3]
            colors.add(px)
            samples += 1
            inked += px not in (b"\xff\xff\xff", b"\xf6\xf7\xf9")  # page and card backgrounds
    assert len(colors) >= 40, f"only {len(colors)} distinct colours: blank page?"
    assert inked / samples > 0.03, f"only {inked / samples:.1%} of the page is drawn on"
    # the dark header band is at the top, and the charts use the palette somewhere
    assert rows[10][600 * bpp:600 * bpp + 3] == bytes.fromhex("1d2330")
    assert any(bytes.fromhex(c[1:]) in colors for c in PALETTE)
    if out := os.environ.get("FAULTLINE_SCREENSHOT_OUT"):  # refresh docs/report-screenshot.png
        shutil.copyfile(png, out)


def test_headline_names_the_denominator(fleet):
    rate = {"jobs": 4000, "failed": 1000, "rate": 0.25, "gpu_hours": 10.0, "gpu_hours_failed": 5.0,
            "gpu_hours_share": 0.5}
    page = report_html.render_report(fleet, generated_at=GEN, rate=rate)
    assert "of 4,000 job attempts (25.0% failed)" in page and "1,000 of 4,000 job attempts failed" in page
