"""Schema-driven fuzzing (schemathesis) of the OpenAPI of a real `faultline serve` process: every
operation, generated requests; no answer >= 500 and every answer matching its documented schema
(status, content type, body). Short profile here (FAULTLINE_FUZZ_EXAMPLES examples per operation,
default 25); a long run: FAULTLINE_FUZZ_EXAMPLES=1000 pytest tests/test_schemathesis.py."""

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

from faultline.fleet.config import write_config  # noqa: E402

from .fleet_fixture import write_sim  # noqa: E402

EXAMPLES = int(os.environ.get("FAULTLINE_FUZZ_EXAMPLES", "25"))
# Conformance of every answer: no 5xx, a documented status, content type, headers and body schema.
# (Schemathesis's positive_data_acceptance is not among them: a request can be schema-valid and still
# refused, e.g. a file named `../x` or a by-reference body without job_id; those 400s are documented.)
from schemathesis import checks as st_checks  # noqa: E402

CHECKS = [st_checks.not_a_server_error, st_checks.status_code_conformance, st_checks.content_type_conformance,
          st_checks.response_headers_conformance, st_checks.response_schema_conformance]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    sim = write_sim(tmp / "sim")
    write_config(tmp / "data", [{"name": "alpha", "scheduler": {"kind": "sacct_files", "path": str(sim)},
                                 "logs": {"kind": "loki_files", "path": str(sim)}}])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "faultline", "serve", "--config", str(tmp / "data"), "--port", str(port),
           "--max-body-mb", "4", "--max-json-mb", "2", "--queue-timeout", "20", "--tmp-dir", str(tmp)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(tmp / "serve.log", "wb"), cwd=tmp)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, (tmp / "serve.log").read_text()[-2000:]
        time.sleep(0.2)
    yield url, tmp / "serve.log"
    proc.terminate()
    proc.wait(20)


def test_every_operation_answers_within_its_schema_and_never_5xx(served):
    """Every operation of the served schema, EXAMPLES generated requests each (schemathesis strategies
    driven by Hypothesis; its pytest plugin is not used, so the test works with any pytest)."""
    from hypothesis import given

    api = schemathesis.openapi.from_url(served[0] + "/openapi.json")
    operations = [r.ok() for r in api.get_all_operations()]
    assert len(operations) >= 10
    seen: dict[str, set] = {}

    for op in operations:
        @given(case=op.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case):
            response = case.call(timeout=60)
            seen.setdefault(op.label, set()).add(response.status_code)
            assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:500])
            case.validate_response(response, checks=CHECKS)

        check()
    assert set(seen) == {op.label for op in operations}
    assert any(200 <= c < 300 for codes in seen.values() for c in codes)  # not only refusals


def test_the_server_logged_no_traceback(served):
    # runs after the fuzzing above (file order): nothing it sent made the server fail
    log = served[1].read_text()
    assert "Traceback" not in log and "unhandled error" not in log, log[-3000:]
