"""Issue 10, defect 8: a killed `faultline flow ...` left its temporary Prefect server running (12 of 12
times, 181 MB each). The flow commands now serve Prefect's API inside their own process
(faultline/flows/server.py), so killing faultline in any way leaves nothing behind.

Each command runs in its own process group, with a stand-in sacct that marks when the flow has reached
its first task (the API is up and in use) and then hangs a few seconds; the command is then killed by SIGTERM,
SIGINT or SIGKILL, and no process of its group may be a Prefect server or uvicorn."""

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faultline.collectors.slurm import SACCT_FIELDS
from faultline.fleet.config import write_config

FAULTLINE = Path(sys.executable).with_name("faultline")


def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every live process in process group `pgid`, from /proc."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z" or int(fields[2]) != pgid:
                continue
            out.append((int(d.name), (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _default_sigint() -> None:
    # A process started in the background of a non-interactive shell inherits SIGINT ignored; a
    # terminal's Ctrl-C reaches a process that has it at its default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_flow(tmp: Path) -> tuple[subprocess.Popen, Path]:
    tmp.mkdir()
    marker = tmp / "sacct-called"
    sacct = tmp / "sacct"
    # Prefect's engine waits for a running task when told to stop: the stand-in hangs a while, not forever
    sacct.write_text(f"#!/bin/sh\ntouch {marker}\nsleep 5\necho '{'|'.join(SACCT_FIELDS)}'\n")
    sacct.chmod(sacct.stat().st_mode | stat.S_IEXEC)
    data = tmp / "data"
    write_config(data, [{"name": "alpha", "scheduler": {"kind": "sacct", "command": str(sacct)}}])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    proc = subprocess.Popen([str(FAULTLINE), "flow", "collect", "--data-dir", str(data), "--start",
                             "2026-11-20T00:00:00", "--end", "2026-11-21T00:00:00"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=_default_sigint)
    return proc, marker


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_defect8_a_killed_flow_leaves_no_prefect_server(tmp_path):
    sigs = {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT, "SIGKILL": signal.SIGKILL}
    runs = {name: start_flow(tmp_path / name) for name in sigs}  # side by side: one cold start's wait
    try:
        deadline = time.monotonic() + 240
        pending = dict(runs)
        killed = {}
        while pending:
            assert time.monotonic() < deadline, f"flows never reached their first task: {sorted(pending)}"
            for name, (proc, marker) in list(pending.items()):
                assert proc.poll() is None, f"{name}: faultline flow exited early ({proc.returncode})"
                if marker.exists():
                    # Ctrl-C reaches a terminal's whole foreground group; `kill` and an OOM killer one process
                    (os.killpg if name == "SIGINT" else os.kill)(proc.pid, sigs[name])
                    killed[name] = proc
                    del pending[name]
            time.sleep(0.2)
        for name, proc in killed.items():
            proc.wait(timeout=120)
            time.sleep(0.5)  # a child that outlives its parent is re-parented, still in the group
            servers = [(pid, cmd) for pid, cmd in group_members(proc.pid)
                       if "prefect" in cmd or "uvicorn" in cmd]
            assert servers == [], f"{name}: left behind {servers}"
    finally:
        for proc, _ in runs.values():  # the stand-in sacct's sleep (and anything else of the groups)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
