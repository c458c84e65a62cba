"""What every route shares: the pipeline it serves, what it offers, the server's limits, ids, capped body
reads and the answer an error gets."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import attrs
from starlette.requests import Request
from starlette.responses import JSONResponse

from omnitrio.serve.api_errors import ApiError
from omnitrio.serve.limits import DEFAULT_MAX_BODY_BYTES, ServeLimits

DEFAULT_LEAD = 1.0  # seconds of audio a realtime client may hold ahead of playback (see .realtime.pacing)
DEFAULT_REQUEST_TIMEOUT_S = 300.0
"""The deadline of every pipeline request the server makes, unless told otherwise: a request
that never finishes fails as a timeout instead of waiting forever."""
ROUTES = {
    "chat": "POST /v1/chat/completions",
    "speech": "POST /v1/audio/speech",
    "transcription": "POST /v1/audio/transcriptions",
    "realtime": "WS /v1/realtime",
}  # each task a pipeline can serve, and the route that hands it over


class ServedPipeline(Protocol):
    """The part of the pipeline API the server uses (``omnitrio.open_pipeline`` returns one)."""

    name: str
    metrics_registry: Any

    def stream(
        self, request_id: str, inputs: Any, *, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> AbstractAsyncContextManager[Any]: ...

    async def abort(self, request_id: str, *, wait: bool = False) -> bool: ...

    async def health(self) -> dict[str, Any]: ...

    async def refresh_stage_gauges(self) -> None: ...


@attrs.define
class ServeContext:
    """The pipeline, the tasks it serves (keys of :data:`ROUTES`) and the limits; one per app."""

    pipeline: ServedPipeline
    serves: tuple[str, ...] = tuple(ROUTES)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT_S
    realtime_audio_lead: float = DEFAULT_LEAD  # seconds of audio a realtime client may hold ahead of playback
    realtime_answer: str = "cascade"  # how realtime turns are answered (PipelineConfig.realtime_answer)
    stage_voices: bool = False  # the pipeline's stages check voice names (PipelineConfig.stage_voices)
    created: int = attrs.field(factory=lambda: int(time.time()))
    limits: ServeLimits = attrs.field(factory=ServeLimits)

    def routes(self) -> list[str]:
        """The routes that hand the pipeline a task it serves, e.g. ``["POST /v1/chat/completions"]``."""
        return [ROUTES[task] for task in self.serves]

    def require(self, task: str) -> None:
        """404 naming what the pipeline does serve, unless it serves ``task``."""
        if task not in self.serves:
            raise ApiError(
                404,
                f"{self.pipeline.name!r} does not serve {ROUTES[task]}; it serves {', '.join(self.routes())}",
                code="route_not_served",
            )


def served_tasks(pipeline: Any, serves: Iterable[str] | None) -> tuple[str, ...]:
    """``serves`` if given, else the pipeline config's ``serves``, else every task of :data:`ROUTES`."""
    if serves is None:
        serves = getattr(getattr(pipeline, "config", None), "serves", None)
    if serves is None:
        return tuple(ROUTES)
    unknown = sorted(set(serves) - ROUTES.keys())
    if unknown:
        raise ValueError(f"serves names unknown tasks {unknown}; known: {list(ROUTES)}")
    return tuple(task for task in ROUTES if task in serves)


def realtime_answer_of(pipeline: Any) -> str:
    """The pipeline config's ``realtime_answer`` (``"cascade"`` when the pipeline has no config)."""
    return str(getattr(getattr(pipeline, "config", None), "realtime_answer", "cascade"))


def stage_voices_of(pipeline: Any) -> bool:
    """The pipeline config's ``stage_voices`` (False when the pipeline has no config)."""
    return bool(getattr(getattr(pipeline, "config", None), "stage_voices", False))


def error_response(error: ApiError) -> JSONResponse:
    """The HTTP answer to ``error``: its status, its OpenAI error body and its headers."""
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers or None)


def new_id(prefix: str) -> str:
    """A fresh id such as ``chatcmpl-3f2a…``; also the pipeline request id of that request."""
    return f"{prefix}-{uuid.uuid4().hex}"


async def read_body(request: Request, limit: int) -> bytes:
    """The whole request body, or a 413 as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> ApiError:
    return ApiError(413, f"the request body is {size} bytes or more; the limit is {limit} bytes", code="too_large")
