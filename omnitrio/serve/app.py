"""The ASGI application: routes, and the error handlers that keep every answer OpenAI-shaped.

:func:`create_app` builds a Starlette app around one pipeline. It runs on any ASGI server whose
async library is trio (routes use trio directly); :mod:`omnitrio.serve.server` runs it on hypercorn.
Unknown routes and methods answer 404/405 with the OpenAI error body; a route whose task the
pipeline does not serve (``PipelineConfig.serves``) answers 404 naming the routes it does serve,
and ``/v1/models`` lists them per model (``serves``), with OpenAI's model names each route answers to
(:mod:`.routes.models`). A plain HTTP request to ``/v1/realtime`` answers
426 saying to connect with a WebSocket, or 400 naming what was wrong with its upgrade headers.
An unexpected exception answers 500 ``internal server error`` with the traceback in the log, never
in the body. ``/`` is the voice page (:mod:`.page`); ``/v1/realtime/calls`` the realtime session
over WebRTC (:mod:`.webrtc.calls`, served while the app's lifespan runs); ``/v1/realtime/client_secrets``
mints ephemeral keys (:mod:`.routes.client_secrets`).

Before a route runs, a request passes, in order: the count of what users asked
(:mod:`.api_metrics`), CORS and the WebSocket origin check (:mod:`.origins`), the API key check
(:mod:`.auth`), and admission (:mod:`.admission`).
"""

from __future__ import annotations

import json
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
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from omnitrio.serve.admission import Admission
from omnitrio.serve.api_errors import ApiError, as_api_error
from omnitrio.serve.api_metrics import ApiMetrics, CountRequests, api_metrics
from omnitrio.serve.auth import ApiKeys, RequireApiKey
from omnitrio.serve.context import (
    DEFAULT_LEAD,
    DEFAULT_REQUEST_TIMEOUT_S,
    ServeContext,
    ServedPipeline,
    new_id,
    realtime_answer_of,
    served_tasks,
    stage_voices_of,
)
from omnitrio.serve.limits import ServeLimits
from omnitrio.serve.origins import browser_middleware
from omnitrio.serve.page import page_routes
from omnitrio.serve.routes.chat import chat_completions
from omnitrio.serve.routes.client_secrets import ClientSecrets, client_secrets_route
from omnitrio.serve.routes.models import is_accepted, model_card, model_cards, unknown_model
from omnitrio.serve.routes.speech import create_speech
from omnitrio.serve.routes.transcription import create_transcription
from omnitrio.serve.transports.webrtc.calls import WebRTCCalls, available
from omnitrio.serve.transports.websocket import realtime_endpoint


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
    WebRTC calls are served while the app's lifespan runs (:mod:`.webrtc.calls`).
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
        Route("/v1/models", partial(_models, ctx), methods=["GET"]),
        Route("/v1/models/{model:path}", partial(_model, ctx), methods=["GET"]),
        Route("/v1/chat/completions", partial(chat_completions, ctx), methods=["POST"]),
        Route("/v1/audio/speech", partial(create_speech, ctx), methods=["POST"]),
        Route("/v1/audio/transcriptions", partial(create_transcription, ctx), methods=["POST"]),
        Route("/v1/realtime", partial(_realtime_over_http, ctx), methods=["GET"]),
        WebSocketRoute("/v1/realtime", partial(_realtime, ctx, metrics)),
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


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers or None)


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


async def _models(ctx: ServeContext, request: Request) -> Response:
    return JSONResponse({"object": "list", "data": model_cards(ctx)})


async def _model(ctx: ServeContext, request: Request) -> Response:
    return JSONResponse(model_card(ctx, request.path_params["model"]))


async def _realtime(ctx: ServeContext, metrics: ApiMetrics, websocket: WebSocket) -> None:
    """The realtime session, or a 404 answer to the upgrade when the pipeline does not serve realtime.

    A ``?model=`` the route does not serve is refused as OpenAI refuses it: the socket opens, one
    ``error`` event (``invalid_request_error``, ``model_not_found``, naming the served model) is
    sent, and the socket closes with 1008 (policy violation)."""
    try:
        ctx.require("realtime")
    except ApiError as error:
        metrics.count("realtime_session", "client_error")
        await websocket.send_denial_response(error_response(error))
        return
    model = websocket.query_params.get("model")
    if model is not None and not is_accepted(ctx, "realtime", model):
        metrics.count("realtime_session", "client_error")
        refusal = unknown_model(ctx, "realtime", model)
        await websocket.accept()
        await websocket.send_text(json.dumps({"type": "error", "event_id": new_id("event"), **refusal.body()}))
        await websocket.close(1008, f"model {model!r} not found"[:120])
        return
    metrics.count("realtime_session", "ok")
    await realtime_endpoint(ctx, websocket)


async def _realtime_over_http(ctx: ServeContext, request: Request) -> Response:
    """A request that reached ``/v1/realtime`` without a WebSocket upgrade: say what to do instead."""
    ctx.require("realtime")
    upgrade = request.headers.get("upgrade")
    connection = request.headers.get("connection", "")
    match upgrade:
        case None:
            error = ApiError(
                426,
                "/v1/realtime is a WebSocket endpoint: connect with a WebSocket client "
                f"(ws://{request.url.netloc}/v1/realtime), not a plain HTTP request",
                code="upgrade_required",
                headers={"Upgrade": "websocket", "Connection": "Upgrade"},
            )
        case str() if upgrade.strip().lower() != "websocket":
            error = ApiError(400, f"the Upgrade header is {upgrade!r}; /v1/realtime needs 'Upgrade: websocket'")
        case _:
            error = ApiError(
                400, f"a WebSocket upgrade needs the header 'Connection: Upgrade'; the request had {connection!r}"
            )
    return error_response(error)
