"""What users asked of the server, counted once per thing a user did (served at ``/metrics``).

``omnitrio_requests_total`` (:mod:`omnitrio.metrics`) counts *pipeline* requests, and one realtime
session makes many (its ASR session takes every ``input_audio_buffer.append`` as a command). This
counter counts what a user made::

    omnitrio_api_requests_total{kind, outcome}   counter
        kind:    chat | speech | transcription   one HTTP request to that route
                 realtime_session                one WebSocket session opened (or refused)
                 realtime_response               one realtime response, however it was started
        outcome: ok | client_error | rejected | server_error | cancelled

``client_error`` is a 4xx the client can fix (or a realtime response that failed with an
``invalid_request_error``), ``rejected`` a 429/503 (the server was full or stopping), ``cancelled``
a request the client left before its answer started (or a cancelled realtime response).

The ASGI middleware :class:`CountRequests` counts the HTTP routes; the realtime code calls
:meth:`ApiMetrics.count`. One :class:`ApiMetrics` per registry (:func:`api_metrics`); a pipeline
without a registry gets a private one, so counting never fails.
"""

from __future__ import annotations

import weakref
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HTTP_KINDS: Final = {
    "/v1/chat/completions": "chat",
    "/v1/audio/speech": "speech",
    "/v1/audio/transcriptions": "transcription",
}


def outcome_of(status: int | None) -> str:
    """The outcome an HTTP status (None: no answer was started) counts as."""
    match status:
        case None:
            return "cancelled"
        case 429 | 503:
            return "rejected"
        case _ if status >= 500:
            return "server_error"
        case _ if status >= 400:
            return "client_error"
    return "ok"


def response_outcome(status: str, error_type: str | None) -> str:
    """The outcome a realtime response that ended with ``status`` (``response.done``) counts as."""
    match status:
        case "completed":
            return "ok"
        case "cancelled":
            return "cancelled"
    return "client_error" if error_type == "invalid_request_error" else "server_error"


class ApiMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "omnitrio_api_requests",
            "What users asked of the server, by kind and outcome",
            ["kind", "outcome"],
            registry=registry,
        )

    def count(self, kind: str, outcome: str) -> None:
        self.requests.labels(kind, outcome).inc()


_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, ApiMetrics] = weakref.WeakKeyDictionary()


def api_metrics(registry: Any) -> ApiMetrics:
    """The API metrics of ``registry`` (created on first use; a private registry for None)."""
    if not isinstance(registry, CollectorRegistry):
        return ApiMetrics(CollectorRegistry())
    metrics = _by_registry.get(registry)
    if metrics is None:
        metrics = _by_registry[registry] = ApiMetrics(registry)
    return metrics


class CountRequests:
    """ASGI middleware: each HTTP request to a route of :data:`HTTP_KINDS` counted once, when it ends."""

    def __init__(self, app: ASGIApp, *, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = HTTP_KINDS.get(scope.get("path", "")) if scope["type"] == "http" and scope["method"] == "POST" else None
        if kind is None:
            await self.app(scope, receive, send)
            return
        status: int | None = None

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        failed = True
        try:
            await self.app(scope, receive, watched)
            failed = False
        except Exception:
            status = status or 500  # the app raised before answering: the server's error handler answers 500
            raise
        finally:
            self.metrics.count(kind, outcome_of(None if failed and status is None else status))
