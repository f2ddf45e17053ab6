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


DATA_ENV = "FAULTLINE_DATA_DIR"


def data_dir_of(data_dir: str | None) -> str:
    """The fleet data dir of a flow run: its `data_dir` parameter, else the worker's FAULTLINE_DATA_DIR.
    Neither, or a folder without a faultline.yaml, is a clear error naming both settings."""
    chosen = data_dir or os.environ.get(DATA_ENV)
    if not chosen:
        raise ValueError(f"faultline: no data dir: pass the flow's data_dir parameter or set {DATA_ENV} in the "
                         "worker's environment (e.g. ./data after `faultline demo`)")
    if not (Path(chosen) / "faultline.yaml").is_file():
        source = "data_dir parameter" if data_dir else DATA_ENV
        raise ValueError(f"faultline: {chosen} (the {source}) has no faultline.yaml: run `faultline demo` "
                         "(it writes ./data) or write one (docs/fleet.md)")
    return str(chosen)
