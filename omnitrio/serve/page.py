"""The voice page: ``GET /`` and its static files, shipped in the package (no build step, no CDN).

The page (``static/voice.js``) holds one realtime session with this server, over WebRTC when the
server offers it (``/v1/realtime/calls``) and over the WebSocket otherwise. It learns what to do from
``GET /voice.json``: ``{"model", "webrtc": bool, "api_key": bool, "voices": [...], "transcribes": bool}``
(``transcribes``: the pipeline has an ASR stage for input transcription, which the page then asks for); with
``api_key`` true it mints a short-lived key (``/v1/realtime/client_secrets``) from the key typed
into it. The page, its files and ``/voice.json`` need no key: they hold nothing but the page.
Same-origin, so the WebSocket needs no ``--allowed-origin`` (:mod:`.origins`).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from omnitrio.serve.auth import ApiKeys
from omnitrio.serve.context import ServeContext
from omnitrio.serve.openai_types import VOICES

STATIC = Path(__file__).with_name("static")


def page_routes(ctx: ServeContext, keys: ApiKeys, *, webrtc: bool) -> list[BaseRoute]:
    """The page's routes; ``webrtc``: whether ``/v1/realtime/calls`` is served."""
    return [
        Route("/", _index, methods=["GET"]),
        Route("/voice.json", partial(_config, ctx, keys, webrtc), methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]


async def _index(request: Request) -> Response:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


async def _config(ctx: ServeContext, keys: ApiKeys, webrtc: bool, request: Request) -> Response:
    offered = "realtime" in ctx.serves
    transcribes = "transcription" in ctx.serves
    body = {"model": ctx.pipeline.name, "webrtc": webrtc and offered, "api_key": bool(keys), "voices": list(VOICES)}
    return JSONResponse({**body, "transcribes": transcribes})
