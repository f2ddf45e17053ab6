"""The one error shape of the API, `{"error": "<code>", "detail": ...}`, and the handlers that give it
to every failure FastAPI or Starlette raise. Never a stack trace: unexpected errors are logged
server-side and answered with a 500 that names no internals."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


class JSONBody(JSONResponse):
    """JSON as `faultline diagnose --format json` writes it (values it cannot encode become text)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, default=str,
                          separators=(",", ":")).encode("utf-8")


class ApiError(Exception):
    """An answer other than success: HTTP status, a stable error code and a human detail."""

    def __init__(self, status: int, error: str, detail: Any = None, headers: dict[str, str] | None = None):
        super().__init__(f"{status} {error}: {detail}")
        self.status, self.error, self.detail, self.headers = status, error, detail, headers or {}


def error_body(error: str, detail: Any = None) -> dict:
    return {"error": error, "detail": detail}


def error_response(status: int, error: str, detail: Any = None, headers: dict[str, str] | None = None) -> JSONBody:
    return JSONBody(error_body(error, detail), status_code=status, headers=headers)


# Starlette's own HTTP errors (unknown route, wrong method, bad multipart ...) get a stable code.
_HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large",
               415: "unsupported_media_type"}


def _validation_detail(errors: list[dict]) -> list[dict]:
    """Pydantic's errors without the echoed input (it may be a whole log file)."""
    return [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in errors]


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError):
        return error_response(exc.status, exc.error, exc.detail, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        return error_response(400, "invalid_request", _validation_detail(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, _HTTP_CODES.get(exc.status_code, "http_error"), exc.detail,
                              getattr(exc, "headers", None))
