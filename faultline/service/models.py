"""Response models: what each endpoint answers, for the OpenAPI schema (`/openapi.json`, `/docs`).

The endpoints return JSON they build themselves (the engine's diagnosis dict); these models describe
it. Every answer other than success is `ErrorOut`. FastAPI's automatic 422 is never sent (validation
errors are 400 `invalid_request`), so `openapi()` removes it and lists the statuses really sent.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorOut(BaseModel):
    error: str = Field(description="a stable error code, e.g. invalid_request, payload_too_large, busy")
    detail: Any = Field(None, description="a sentence, or for validation errors a list of {loc, msg, type}")


class Place(_Open):
    nodes: list[str] = []
    ranks: list[int] = []
    gpus: list[Any] = []


class Affected(_Open):
    nodes: list[str] = []
    ranks: list[int] = []


class EvidenceOut(_Open):
    rule_id: str | None = None
    symptom: str | None = None
    role: str | None = None
    source: str | None = None
    node: str | None = None
    rank: int | None = None
    gpu: Any = None
    ts: str | None = None
    file: str | None = None
    line_no: int | None = None
    line: str | None = None


class CandidateOut(_Open):
    outcome: str
    domain: str | None = None
    culprit: Place = Place()
    priority: int | None = None
    evidence: list[EvidenceOut] = []


class ActionOut(_Open):
    action: str = Field(description="drain_node, reset_gpu, restart, restart_excluding, fix_and_resubmit, "
                                    "no_action or human_review")
    targets: list[str] = []
    reason: str = ""


class CoverageOut(_Open):
    source: str
    status: str
    rows: int | None = None
    reason: str | None = None


class RulesetRef(_Open):
    version: str
    packs: list[str] | None = None


class DiagnosisOut(_Open):
    """One job's diagnosis, the JSON of `faultline diagnose --format json` (DESIGN.md)."""

    cluster: str | None = None
    job_id: str | None = None
    attempt: int | None = None
    outcome: str
    domain: str | None = None
    root_cause: str = ""
    culprit: Place | None = None
    affected: Affected | None = None
    ambiguous: bool | None = None
    candidates: list[CandidateOut] | None = None
    confidence: str | None = None
    confidence_reason: str | None = None
    evidence: list[EvidenceOut] | None = None
    recommended_action: ActionOut | None = None
    coverage: list[CoverageOut] | None = None
    ruleset: RulesetRef
    diagnosed_at: str | None = None


class DiagnosisRow(_Open):
    cluster: str
    job_id: str
    attempt: int | None = None
    ruleset: str | None = None
    outcome: str | None = None


class DiagnosesOut(BaseModel):
    ruleset: RulesetRef
    count: int
    limit: int
    diagnoses: list[DiagnosisRow]


class PackOut(BaseModel):
    pack: str
    rules: int
    lookup_rows: int


class RulesOut(BaseModel):
    ruleset: RulesetRef
    rules: int
    packs: list[PackOut]


class WorkersOut(BaseModel):
    max: int
    running: int
    waiting: int


class SlotsOut(BaseModel):
    max: int
    held: int


class HealthOut(_Open):
    status: str
    version: str
    ruleset: RulesetRef
    uptime_s: float
    workers: WorkersOut
    json_slots: SlotsOut
    fleet_configured: bool


def errors(*statuses: int) -> dict:
    """`responses=` for a route: each status with the error model and what it means."""
    meaning = {400: "invalid request (bad JSON, fields, file names, Host header)", 401: "no or unknown token",
               403: "the token lacks the scope, or a browser's cross-site request", 404: "not found",
               408: "the request body did not arrive in time", 409: "conflict (by reference: the job has not ended yet)",
               413: "body over the limit", 415: "unsupported media type", 429: "over a rate or session limit",
               500: "server error", 501: "not configured", 502: "a source failed",
               503: "busy: retry after Retry-After"}
    return {s: {"model": ErrorOut, "description": meaning.get(s, "error")} for s in statuses}


def drop_phantom_422(schema: dict) -> dict:
    """FastAPI documents a 422 for every route with parameters; this API answers 400 instead."""
    for path in schema.get("paths", {}).values():
        for op in path.values():
            responses = op.get("responses", {})
            if responses.pop("422", None) is not None and "400" not in responses:
                responses["400"] = {"description": "invalid request",
                                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}}
    comps = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        comps.pop(name, None)
    return schema


class EvidenceCounts(BaseModel):
    batches: int
    lines: int
    bytes: int | None = None


class SessionOut(_Open):
    session_id: str
    cluster: str
    job_id: str
    attempt: int
    workload: dict
    created_at: str
    updated_at: str
    expires_at: str
    final: bool
    evidence: EvidenceCounts
    batch_ids: list[str]
    attributions: int


class ObservationAck(_Open):
    session_id: str
    batch_id: str
    stored: bool = Field(description="false when this batch id was already received with the same content (a retry)")
    duplicate: bool
    evidence: EvidenceCounts


class SessionCoverage(_Open):
    batches: int
    lines: int
    scheduler: str
    sources: dict[str, str]
    nodes_without_logs: list[str]
    ranks_without_logs: list[int]
    metrics: dict
    node_events: dict
    missing: list[str] = Field(description="what the attribution still lacks, in words")


class AttributionOut(_Open):
    session_id: str
    attribution: int = Field(description="1 for the first attribution of the session, 2 for the next ...")
    final: bool
    coverage: SessionCoverage
    diagnosis: DiagnosisOut


class VerdictsOut(BaseModel):
    session_id: str
    count: int
    verdicts: list[AttributionOut]


class DeliveryOut(BaseModel):
    attribution: int
    url: str
    attempt: int
    status: int | None = None
    error: str | None = None
    delivered: bool
    at: str | None = None


class DeliveriesOut(BaseModel):
    session_id: str
    count: int
    deliveries: list[DeliveryOut]
