"""Prefect's environment for faultline, set before Prefect is imported.

With no server configured Prefect starts a temporary one per process; its home and database
live under the data dir, analytics are off (they lock the SQLite database), and cold starts
get time. A configured PREFECT_API_URL (a real server) is left alone.
"""

from __future__ import annotations

import os
from pathlib import Path


def configure_prefect(data_dir: Path | str) -> None:
    home = Path(data_dir).resolve() / "prefect"
    home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(home))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_UI_ENABLED", "false")
