"""What every route shares: the pipeline it serves, the server's limits, ids and capped body reads."""

from __future__ import annotations

import time
import uuid
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import attrs
from starlette.requests import Request

from omnitrio.serve.api_errors import ApiError

DEFAULT_MAX_BODY_BYTES = 25 * 1024 * 1024  # OpenAI's upload limit for audio files


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
    """The pipeline and the limits; one per app."""

    pipeline: ServedPipeline
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    request_timeout: float | None = None
    created: int = attrs.field(factory=lambda: int(time.time()))


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
