"""OpenAI-shaped errors: what a client sees when a request cannot be served.

Every error leaves the server as ``{"error": {"message", "type", "param", "code"}}`` with a status
that says whose fault it was: 4xx for the request (the message names the field), 5xx for the
server. As OpenAI does, every request a client can fix is a 400 ``invalid_request_error`` (a
malformed body, a wrong type, a value out of range, a request that cannot fit the model's context:
``param`` names the field, ``code`` says what is wrong), so the OpenAI SDKs raise ``BadRequestError``.
Pipeline exceptions map to statuses in :func:`from_pipeline_error` (a stage's
:class:`~omnitrio.errors.BadRequest` is such a 400); anything unexpected becomes a 500 whose body
carries no traceback (the traceback goes to the ``omnitrio.serve`` log).
"""

from __future__ import annotations

import logging
from typing import Any

import attrs

from omnitrio.contract import InvalidRequest
from omnitrio.errors import (
    BadRequest,
    DuplicateRequest,
    Overloaded,
    PipelineClosed,
    RequestAborted,
    RequestFailed,
    RequestTimeout,
)

log = logging.getLogger("omnitrio.serve")


@attrs.define
class ApiError(Exception):
    """An error answer: HTTP ``status`` plus the OpenAI error fields."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = attrs.field(factory=dict)

    def __str__(self) -> str:
        return f"{self.status} {self.message}"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """400: the body is malformed or a field has the wrong type or is missing."""
    return ApiError(400, message, param=param, code=code)


def invalid_value(message: str, param: str | None = None, code: str | None = "invalid_value") -> ApiError:
    """400 ``invalid_value``: the body is well formed but a value is not one this server accepts."""
    return ApiError(400, message, param=param, code=code)


def from_pipeline_error(exc: BaseException) -> ApiError | None:
    """The answer for an exception the pipeline raised on purpose, or None if it is unexpected."""
    match exc:
        case BaseExceptionGroup(exceptions=[single]):  # one error that crossed a nursery
            return from_pipeline_error(single)
        case BadRequest(code=code, param=param) | InvalidRequest(code=code, param=param):
            return ApiError(400, str(exc), param=param, code=code)
        case Overloaded():
            return ApiError(429, str(exc), "server_error", code="overloaded", headers={"Retry-After": "1"})
        case PipelineClosed():
            return ApiError(503, f"the pipeline is not running: {exc}", "server_error", code="unavailable")
        case RequestTimeout():
            return ApiError(504, str(exc), "server_error", code="timeout")
        case RequestFailed():
            return ApiError(500, str(exc), "server_error", code="stage_failed")
        case RequestAborted():
            return ApiError(500, str(exc), "server_error", code="aborted")
        case DuplicateRequest():
            return ApiError(409, str(exc), code="duplicate_request")
        case ApiError():
            return exc
        case _:
            return None


def as_api_error(exc: Exception) -> ApiError:
    """Like :func:`from_pipeline_error`, but an unexpected exception is logged and becomes a bare 500."""
    known = from_pipeline_error(exc)
    if known is not None:
        return known
    log.error("unexpected error while serving a request", exc_info=exc)
    return ApiError(500, "internal server error", "server_error", code="internal_error")
