"""Prefect pull steps of prefect.yaml: where a worker finds faultline's flows.

`set_project_dir` chooses the checkout the flow runs from: its `directory` argument, else the
worker's `FAULTLINE_PROJECT_DIR`, else the checkout this faultline is installed from (an editable
`pip install -e .` of a clone). A directory without faultline's flows is a clear error, not a later
`FileNotFoundError` on the entrypoint.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "FAULTLINE_PROJECT_DIR"
ENTRY = Path("faultline") / "flows" / "flows.py"


def project_dir(directory: str | None = None) -> Path:
    installed = Path(__file__).resolve().parents[2]
    chosen = directory or os.environ.get(ENV) or (str(installed) if (installed / ENTRY).is_file() else "")
    if not chosen:
        raise RuntimeError(f"faultline: no project directory: set {ENV} in the worker's environment to the "
                           "faultline checkout the flows run from (README, 'Deployments')")
    path = Path(chosen).expanduser().resolve()
    if not (path / ENTRY).is_file():
        how = "its directory argument" if directory else (ENV if os.environ.get(ENV) else "the installed package")
        raise FileNotFoundError(f"faultline: {path} (from {how}) is not a faultline checkout: no {ENTRY} there; "
                                f"set {ENV} to the clone the worker runs from")
    return path


def set_project_dir(directory: str | None = None) -> dict:
    """The pull step: change into the faultline checkout; returns {"directory": ...} as Prefect's own
    set_working_directory does."""
    path = project_dir(directory)
    os.chdir(path)
    return {"directory": str(path)}
