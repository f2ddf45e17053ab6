import os
import tempfile

# Prefect reads its settings at import: a private home, no analytics (they lock SQLite), patience.
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="faultline-prefect-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# The validated-ruleset cache of this run stays out of the user's ~/.cache.
os.environ.setdefault("FAULTLINE_CACHE_DIR", tempfile.mkdtemp(prefix="faultline-cache-"))

from pathlib import Path

import pytest

from faultline.rules.loader import load_ruleset

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
CORPUS = SHARED / "corpus" / "real-logs"


@pytest.fixture(scope="session")
def ruleset():
    return load_ruleset()


@pytest.fixture
def write(tmp_path):
    """write('node-a/dmesg.log', lines...) -> path; lines joined with newlines."""
    def _write(rel: str, *lines: str, data: bytes | None = None) -> Path:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if data is not None else ("\n".join(lines) + "\n").encode())
        return p
    return _write
