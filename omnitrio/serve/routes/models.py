"""``GET /v1/models`` and ``GET /v1/models/{model}``: the model cards.

The list holds the pipeline (``owned_by`` ``omnitrio``, ``serves`` naming every route it answers),
then each alias of :data:`~omnitrio.serve.model_names.MODEL_ALIASES` for a task it serves, its
``owned_by`` saying whose alias it is and ``serves`` naming that task's route. A name that is no
card is a 404 ``model_not_found`` naming the served model.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omnitrio.serve.api_errors import ApiError
from omnitrio.serve.context import ROUTES, ServeContext
from omnitrio.serve.model_names import MODEL_ALIASES


async def list_models(ctx: ServeContext, request: Request) -> Response:
    """``GET /v1/models``: every card (:func:`model_cards`)."""
    return JSONResponse({"object": "list", "data": model_cards(ctx)})


async def retrieve_model(ctx: ServeContext, request: Request) -> Response:
    """``GET /v1/models/{model}``: one card (:func:`model_card`)."""
    return JSONResponse(model_card(ctx, request.path_params["model"]))


def model_cards(ctx: ServeContext) -> list[dict[str, Any]]:
    """``/v1/models``' list: the pipeline, then each alias of a task it serves."""
    name = ctx.pipeline.name
    cards = [_card(ctx, name, "omnitrio", ctx.routes())]
    for task in ctx.serves:
        for alias in MODEL_ALIASES.get(task, ()):
            route = ROUTES[task]
            cards.append(_card(ctx, alias, f"omnitrio: an alias of {name!r} for {route}", [route]))
    return cards


def model_card(ctx: ServeContext, model: str) -> dict[str, Any]:
    """The card ``/v1/models/{model}`` answers, or a 404 naming the served model."""
    for card in model_cards(ctx):
        if card["id"] == model:
            return card
    raise ApiError(
        404,
        f"model {model!r} not found; this server serves {ctx.pipeline.name!r}",
        param="model",
        code="model_not_found",
    )


def _card(ctx: ServeContext, model: str, owned_by: str, serves: list[str]) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": ctx.created, "owned_by": owned_by, "serves": serves}
