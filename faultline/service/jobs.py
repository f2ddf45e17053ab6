"""One diagnosis, run in a worker thread.

inline        the uploaded files go into a private folder and through `faultline.pipeline.diagnose_files`,
              with the job id, cluster, state and exit code as `faultline diagnose` passes them; the
              evidence then names each file as the client named it (not the temp folder), so the
              same upload gives the same verdict every time.
by reference  `faultline.fleet.single.diagnose_one`: the job's scheduler and log source, through the
              warehouse, as `faultline flow job` does.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from faultline.fleet.config import FleetConfig
from faultline.limits import CLI_READ, ReadLimits
from faultline.fleet.single import JobNotFinished, JobNotFound, SourceError, diagnose_one
from faultline.rules.model import Ruleset
from faultline.service.engine import JobMeta, attribute, collect_uploaded_files
from faultline.service.errors import ApiError
from faultline.service.inputs import InlineJob, RefJob
from faultline.service.uploads import BadUpload, write_upload
from faultline.warehouse.store import WarehouseError

# Files of an upload sit in <tmp>/faultline-serve-XXXX/job/...: a top-level file's folder name ("job")
# is one that never reads as a node name, just as a file given on its own to `faultline diagnose`.
UPLOAD_FOLDER = "job"


def diagnose_inline(job: InlineJob, ruleset: Ruleset, tmp_dir: Path | None = None,
                    limits: ReadLimits = CLI_READ) -> dict:
    base = Path(tempfile.mkdtemp(prefix="faultline-serve-", dir=tmp_dir))
    try:
        root = base / UPLOAD_FOLDER
        root.mkdir()
        try:
            paths = write_upload(root, job.uploads)
        except BadUpload as exc:
            raise ApiError(400, "invalid_file", str(exc)) from None
        meta = JobMeta(cluster=job.cluster, job_id=job.job_id, state=job.state, exit_code=job.exit_code)
        return attribute(collect_uploaded_files(root, paths, ruleset, meta, limits), ruleset)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def relativize(d: dict, root: Path) -> dict:
    """The diagnosis with every evidence `file` named relative to the upload folder (as uploaded)."""
    prefix = str(root) + "/"

    def rel(ev: list[dict]) -> list[dict]:
        return [{**e, "file": e["file"][len(prefix):] if isinstance(e.get("file"), str)
                 and e["file"].startswith(prefix) else e.get("file")} for e in ev]

    out = {**d, "evidence": rel(d.get("evidence") or [])}
    out["candidates"] = [{**c, "evidence": rel(c.get("evidence") or [])} for c in d.get("candidates") or []]
    return out


# The documented order of a diagnosis's keys (docs/service.md): by-reference and stored answers are
# written with sorted keys by the warehouse; every answer of the API uses this one order.
DIAGNOSIS_KEYS = ("cluster", "job_id", "attempt", "outcome", "domain", "root_cause", "culprit", "affected", "ambiguous",
                  "candidates", "confidence", "confidence_reason", "evidence", "recommended_action", "coverage",
                  "ruleset", "diagnosed_at")


def in_order(d: dict) -> dict:
    return {**{k: d[k] for k in DIAGNOSIS_KEYS if k in d}, **{k: v for k, v in d.items() if k not in DIAGNOSIS_KEYS}}


def full_shape(d: dict, ruleset: Ruleset) -> dict:
    """A job that did not fail gets the same shape as any diagnosis (the fleet path answers a short one)."""
    if "culprit" in d:
        return in_order(d)
    from datetime import datetime, timezone
    return in_order({
        "cluster": d.get("cluster"), "job_id": d.get("job_id"), "attempt": d.get("attempt"),
        "outcome": d.get("outcome", "healthy"), "domain": d.get("domain", "unknown"), "root_cause": d.get("root_cause", ""),
        "culprit": {"nodes": [], "ranks": [], "gpus": []}, "affected": {"nodes": [], "ranks": []}, "ambiguous": False,
        "candidates": [], "confidence": d.get("confidence", "high"),
        "confidence_reason": "the scheduler reports that the job did not fail", "evidence": [],
        "recommended_action": {"action": "no_action", "targets": [], "reason": "nothing to repair"},
        "coverage": [], "ruleset": {"version": ruleset.version, "packs": list(ruleset.packs)},
        "diagnosed_at": datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")})


def diagnose_by_reference(cfg: FleetConfig, job: RefJob, ruleset: Ruleset) -> dict:
    try:
        return full_shape(diagnose_one(cfg, job.cluster, job.job_id, ruleset), ruleset)
    except JobNotFound as exc:
        raise ApiError(404, "job_not_found", str(exc)) from None
    except JobNotFinished as exc:
        raise ApiError(409, "job_not_finished", str(exc)) from None
    except SourceError as exc:
        raise ApiError(502, "source_failed", str(exc)) from None
    except WarehouseError as exc:
        raise ApiError(500, "warehouse_error", f"the diagnosis could not be stored: {exc}") from None
