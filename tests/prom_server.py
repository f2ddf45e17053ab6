"""A real Prometheus (Debian's `prometheus` package) for tests: history written as OpenMetrics,
backfilled with `promtool tsdb create-blocks-from openmetrics`, the server started on 127.0.0.1 with a
free port and its own data dir (no systemd, no scrape targets), stopped when the tests end."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
MISSING = None if PROMETHEUS and PROMTOOL else (
    "the prometheus binaries are not installed (Debian: apt-get install prometheus; .ci/run does it)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def openmetrics(series: list[tuple[str, dict, list[tuple[float, float]]]]) -> str:
    """[(name, labels, [(unix s, value), ...])] -> an OpenMetrics text (families together, series in time order)."""
    by_name: dict[str, list] = {}
    for name, labels, samples in series:
        by_name.setdefault(name, []).append((labels, samples))
    out = []
    for name, members in by_name.items():
        out.append(f"# TYPE {name} gauge")
        for labels, samples in members:
            lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            out += [f"{name}{{{lab}}} {v:g} {t:.3f}" for t, v in sorted(samples)]
    return "\n".join(out) + "\n# EOF\n"


class Prometheus:
    def __init__(self, root: Path, series: list):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        (root / "history.om").write_text(openmetrics(series))
        data = root / "tsdb"
        out = subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(root / "history.om"),
                              str(data)], capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"promtool failed: {out.stderr[-800:]}")
        (root / "prometheus.yml").write_text("global: {scrape_interval: 1h}\nscrape_configs: []\n")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(root / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={data}",
             "--storage.tsdb.retention.time=100y", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not start: {(root / 'prometheus.log').read_text()[-800:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
