"""POST /v1/diagnose bodies -> what to run (pure: no I/O, no FastAPI).

Two forms, told apart by `files`:
- inline: `files` given -> the logs are in the request (JSON `text`/`base64`, or multipart uploads);
- by reference: no `files` -> `cluster` + `job_id` name a job the fleet config can find.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from faultline.collectors.files import slurm_job_id
from faultline.service.uploads import BadUpload, Upload, check_names, safe_name
from faultline.taxonomy import JOB_STATES

# A cluster name becomes a warehouse folder name: the warehouse's rule for names.
CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
JOB_ID = re.compile(r"^[^\x00-\x1f\x7f/\\]{1,200}$")
DEFAULT_CLUSTER = "local"
DEFAULT_JOB_ID = "job"
INT32 = (-(2**31), 2**31 - 1)
FORM_FIELDS = ("job_id", "cluster", "state", "exit_code")


class FileIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    text: str | None = None
    base64: str | None = None

    @model_validator(mode="after")
    def _one_content(self):
        if (self.text is None) == (self.base64 is None):
            raise ValueError("give exactly one of `text` and `base64`")
        return self


class DiagnoseIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job_id: str | None = None
    cluster: str | None = None
    state: str | None = None
    exit_code: int | None = None
    files: list[FileIn] | None = None

    @field_validator("job_id")
    @classmethod
    def _job_id(cls, v):
        if v is not None and (not JOB_ID.match(v) or any(0xD800 <= ord(c) <= 0xDFFF for c in v)):
            raise ValueError("1-200 characters, no '/', '\\' or control characters")
        return v

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, v):
        if v is not None and not CLUSTER_NAME.match(v):
            raise ValueError("letters, digits, '.', '_' and '-' (at most 128), starting with a letter or digit")
        return v

    @field_validator("state")
    @classmethod
    def _state(cls, v):
        if v is None:
            return v
        if v.upper() not in JOB_STATES:
            raise ValueError(f"one of {', '.join(JOB_STATES)}")
        return v.upper()

    @field_validator("exit_code")
    @classmethod
    def _exit_code(cls, v):
        if v is not None and not INT32[0] <= v <= INT32[1]:
            raise ValueError("a 32-bit integer")
        return v


@dataclass
class InlineJob:
    job_id: str
    cluster: str
    state: str
    exit_code: int | None
    uploads: list[Upload] = field(default_factory=list)


@dataclass(frozen=True)
class RefJob:
    cluster: str
    job_id: str


class BadRequest(ValueError):
    """The body is well-formed but asks for something invalid; `detail` says what (a 400)."""

    def __init__(self, error: str, detail: Any):
        super().__init__(f"{error}: {detail}")
        self.error, self.detail = error, detail


def _validation_detail(exc: ValidationError) -> list[dict]:
    return [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors(include_input=False)]


def parse_json(body: Any, max_files: int) -> InlineJob | RefJob:
    """A decoded JSON body -> the job to run."""
    if not isinstance(body, dict):
        raise BadRequest("invalid_request", "the body must be a JSON object")
    try:
        req = DiagnoseIn.model_validate(body)
    except ValidationError as exc:
        raise BadRequest("invalid_request", _validation_detail(exc)) from None
    if req.files is None:
        return _reference(req)
    try:
        uploads = [Upload(safe_name(f.name), text=f.text, b64=f.base64) for f in req.files]
        check_names([u.name for u in uploads], max_files)
    except BadUpload as exc:
        raise BadRequest("invalid_file", str(exc)) from None
    return _inline(req, uploads)


def parse_form(fields: dict[str, str], files: list[tuple[str, Any]], max_files: int) -> InlineJob | RefJob:
    """multipart/form-data: text `fields` and (filename, open file) pairs of the `files` field."""
    unknown = sorted(set(fields) - set(FORM_FIELDS))
    if unknown:
        raise BadRequest("invalid_request", f"unknown form field(s) {', '.join(unknown)}; "
                                            f"fields: {', '.join(FORM_FIELDS)} and files")
    try:
        req = DiagnoseIn.model_validate({k: v for k, v in fields.items() if v != ""})
    except ValidationError as exc:
        raise BadRequest("invalid_request", _validation_detail(exc)) from None
    if not files:
        return _reference(req)
    try:
        uploads = [Upload(safe_name(name or ""), stream=fh) for name, fh in files]
        check_names([u.name for u in uploads], max_files)
    except BadUpload as exc:
        raise BadRequest("invalid_file", str(exc)) from None
    return _inline(req, uploads)


def _inline(req: DiagnoseIn, uploads: list[Upload]) -> InlineJob:
    # The job id as `faultline diagnose` takes it: given, else from a slurm-<id>.out among the files.
    job_id = req.job_id or slurm_job_id([str(u.name) for u in uploads]) or DEFAULT_JOB_ID
    return InlineJob(job_id=job_id, cluster=req.cluster or DEFAULT_CLUSTER, state=req.state or "UNKNOWN",
                     exit_code=req.exit_code, uploads=uploads)


def _reference(req: DiagnoseIn) -> RefJob:
    missing = [k for k in ("cluster", "job_id") if not getattr(req, k)]
    if missing:
        raise BadRequest("invalid_request", f"by reference (no `files`) a request needs {' and '.join(missing)}; "
                                            "to diagnose logs, send them in `files`")
    extra = [k for k in ("state", "exit_code") if getattr(req, k) is not None]
    if extra:
        raise BadRequest("invalid_request", f"{' and '.join(extra)} apply to inline files only: by reference "
                                            "the job's scheduler is asked")
    return RefJob(cluster=req.cluster, job_id=req.job_id)
