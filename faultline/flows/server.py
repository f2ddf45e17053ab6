"""The temporary Prefect API of a faultline command that has no server configured, run inside the
faultline process itself.

Left to itself, Prefect starts its temporary ("ephemeral") server as a child process and stops it from
an atexit hook, which never runs when the process is killed: every `faultline flow ...` killed by
SIGTERM, or whose parent was SIGKILLed, left a 181 MB server behind (issue 10, defect 8). Here the
same Prefect server app (`prefect.server.api.server.create_app`, ephemeral: no UI, no background
services) is served by uvicorn in a daemon thread of this process, on a free loopback port, and
PREFECT_API_URL points at it for the command's duration. A process cannot outlive itself, so whatever
kills faultline stops its server too: no child, no signal handling, no pid files.

A configured PREFECT_API_URL (a real server) is used as it is.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator

STARTUP_TIMEOUT_S = 180.0  # cold start: the SQLite database is created and migrated on first use


@contextlib.contextmanager
def prefect_api() -> Iterator[str | None]:
    """Within it, Prefect talks to a server: the configured one, else one served in this process
    (its URL is yielded; None when a configured server is used)."""
    if os.environ.get("PREFECT_API_URL"):
        yield None
        return
    import uvicorn
    from prefect.server.api.server import create_app
    from prefect.settings import PREFECT_API_URL, temporary_settings

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))  # a free port, held from here on: no race with another process
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/api"
    config = uvicorn.Config(create_app(ephemeral=True, final=True), log_level="error", lifespan="on")
    server = uvicorn.Server(config)
    # uvicorn installs no signal handlers off the main thread: the command's own Ctrl-C stays its own.
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="prefect-api", daemon=True)
    thread.start()
    try:
        _wait_started(server, thread)
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def _wait_started(server, thread: threading.Thread) -> None:
    deadline = time.monotonic() + float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS",
                                                       STARTUP_TIMEOUT_S))
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the temporary Prefect API failed to start (see the log above)")
        if time.monotonic() > deadline:
            raise RuntimeError("the temporary Prefect API did not start in time "
                               "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)")
        time.sleep(0.05)
