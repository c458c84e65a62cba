"""The ASGI application: every route in one list, and the error handlers that keep every answer OpenAI-shaped.

:func:`create_app` builds a Starlette app around one pipeline. It runs on any ASGI server whose
async library is trio (routes use trio directly); :mod:`omnitrio.serve.server` runs it on hypercorn.
Unknown routes and methods answer 404/405 with the OpenAI error body; a route whose task the
pipeline does not serve (``PipelineConfig.serves``) answers 404 naming the routes it does serve,
and ``/v1/models`` lists them per model (``serves``), with OpenAI's model names each route answers to
(:mod:`.routes.models`). An unexpected exception answers 500 ``internal server error`` with the
traceback in the log, never in the body. This module serves ``/health`` and ``/metrics`` itself;
every other route lives with what it serves: ``/`` the voice page (:mod:`.page`), the OpenAI HTTP
routes (:mod:`.routes`), and the realtime session over each of its transports, ``/v1/realtime``
(:mod:`.transports.websocket`) and ``/v1/realtime/calls`` (:mod:`.transports.webrtc.calls`, served
while the app's lifespan runs).

Before a route runs, a request passes, in order: the count of what users asked
(:mod:`.api_metrics`), CORS and the WebSocket origin check (:mod:`.origins`), the API key check
(:mod:`.auth`), and admission (:mod:`.admission`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

import attrs
import prometheus_client
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from omnitrio.serve.admission import Admission
from omnitrio.serve.api_errors import ApiError, as_api_error
from omnitrio.serve.api_metrics import CountRequests, api_metrics
from omnitrio.serve.auth import ApiKeys, RequireApiKey
from omnitrio.serve.context import (
    DEFAULT_LEAD,
    DEFAULT_REQUEST_TIMEOUT_S,
    ServeContext,
    ServedPipeline,
    error_response,
    realtime_answer_of,
    served_tasks,
    stage_voices_of,
)
from omnitrio.serve.limits import ServeLimits
from omnitrio.serve.origins import browser_middleware
from omnitrio.serve.page import page_routes
from omnitrio.serve.routes.chat import chat_completions
from omnitrio.serve.routes.client_secrets import ClientSecrets, client_secrets_route
from omnitrio.serve.routes.models import list_models, retrieve_model
from omnitrio.serve.routes.speech import create_speech
from omnitrio.serve.routes.transcription import create_transcription
from omnitrio.serve.transports.webrtc.calls import WebRTCCalls, available
from omnitrio.serve.transports.websocket import websocket_routes


def create_app(
    pipeline: ServedPipeline,
    *,
    max_body_bytes: int | None = None,
    request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT_S,
    limits: ServeLimits | None = None,
    api_keys: ApiKeys | Iterable[str] = (),
    public_metrics: bool = False,
    allowed_origins: Sequence[str] = (),
    serves: Iterable[str] | None = None,
    realtime_audio_lead: float = DEFAULT_LEAD,
    webrtc_hosts: Sequence[str] = ("127.0.0.1",),
) -> Starlette:
    """The OpenAI-compatible app for ``pipeline``.

    ``limits`` bound what the app takes (:mod:`.limits`; ``max_body_bytes``, when given, overrides
    its field: 413 beyond). ``request_timeout`` is the deadline of each pipeline request, in seconds
    (a realtime session's each response and each turn-detection command, not the socket): past it
    the client gets a 504 ``timeout`` error (an ``error`` event on a stream or socket). None leaves
    the pipeline's own ``default_timeout``, which may be no deadline at all. With ``api_keys``,
    ``/v1/*`` (and ``/metrics`` unless ``public_metrics``) need one of them; ``allowed_origins``
    turns CORS on for those origins.
    ``serves`` names the tasks offered (``"chat"``, ``"speech"``, ``"transcription"``,
    ``"realtime"``); None takes ``pipeline.config.serves``, and offers every route when that is unset.
    ``realtime_audio_lead`` is how far (seconds) realtime audio may be sent ahead of real time.
    ``webrtc_hosts``: the addresses WebRTC calls gather ICE candidates on (the server's listen host).
    WebRTC calls are served while the app's lifespan runs (:mod:`.transports.webrtc.calls`).
    """
    limits = limits or ServeLimits()
    if max_body_bytes is not None:
        limits = attrs.evolve(limits, max_body_bytes=max_body_bytes)
    keys = api_keys if isinstance(api_keys, ApiKeys) else ApiKeys(tuple(api_keys))
    ctx = ServeContext(
        pipeline,
        served_tasks(pipeline, serves),
        max_body_bytes=limits.max_body_bytes,
        request_timeout=request_timeout,
        realtime_audio_lead=realtime_audio_lead,
        realtime_answer=realtime_answer_of(pipeline),
        stage_voices=stage_voices_of(pipeline),
        limits=limits,
    )
    metrics = api_metrics(pipeline.metrics_registry)
    calls = WebRTCCalls(ctx, webrtc_hosts)
    minted = ClientSecrets()
    routes = [
        *page_routes(ctx, keys, webrtc=available()),
        Route("/health", partial(_health, ctx), methods=["GET"]),
        Route("/metrics", partial(_metrics, ctx), methods=["GET"]),
        Route("/v1/models", partial(list_models, ctx), methods=["GET"]),
        Route("/v1/models/{model:path}", partial(retrieve_model, ctx), methods=["GET"]),
        Route("/v1/chat/completions", partial(chat_completions, ctx), methods=["POST"]),
        Route("/v1/audio/speech", partial(create_speech, ctx), methods=["POST"]),
        Route("/v1/audio/transcriptions", partial(create_transcription, ctx), methods=["POST"]),
        *websocket_routes(ctx, metrics),
        Route("/v1/realtime/client_secrets", client_secrets_route(ctx, minted), methods=["POST"]),
        *calls.routes(),
    ]
    handlers: dict[Any, Any] = {ApiError: _api_error, HTTPException: _http_error, Exception: _internal_error}
    middleware = [
        Middleware(CountRequests, metrics=metrics),
        *browser_middleware(allowed_origins),
        Middleware(RequireApiKey, keys=keys, public_metrics=public_metrics, ephemeral=minted),
        Middleware(Admission, limits=limits),
    ]
    return Starlette(routes=routes, exception_handlers=handlers, middleware=middleware, lifespan=calls.lifespan)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    match exc.status_code:
        case 404:
            error = ApiError(404, f"no route {request.method} {request.url.path}", code="not_found")
        case 405:
            error = ApiError(405, f"{request.method} is not allowed on {request.url.path}", code="method_not_allowed")
        case status:
            error = ApiError(status, str(exc.detail))
    return error_response(error)


async def _internal_error(request: Request, exc: Exception) -> Response:
    return error_response(as_api_error(exc))


async def _health(ctx: ServeContext, request: Request) -> Response:
    """The pipeline's health dict; 200 only when every stage is alive."""
    try:
        report = await ctx.pipeline.health()
    except Exception as exc:
        error = ApiError(503, f"the pipeline cannot report its health: {exc}", "server_error", code="unavailable")
        return error_response(error)
    alive = all(stage.get("alive", False) for stage in report.get("stages", {}).values())
    return JSONResponse(report, status_code=200 if alive else 503)


async def _metrics(ctx: ServeContext, request: Request) -> Response:
    await ctx.pipeline.refresh_stage_gauges()
    registry = ctx.pipeline.metrics_registry or prometheus_client.CollectorRegistry()
    return Response(prometheus_client.generate_latest(registry), media_type=prometheus_client.CONTENT_TYPE_LATEST)
