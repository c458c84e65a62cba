"""Which model names a route accepts: the served pipeline's, and OpenAI's names for that kind of model.

Code moved from OpenAI names OpenAI's models (``whisper-1``, ``tts-1``, ``gpt-realtime``…). Each
route accepts, besides the pipeline's own name, the names of :data:`MODEL_ALIASES` for its task,
as aliases of the one pipeline served, and their dated or numbered versions (``gpt-realtime-2.1``,
``gpt-4o-mini-2024-07-18``: an alias, a hyphen, then a digit), since clients default to those;
``/v1/models`` lists the aliases (:mod:`.routes.models`). Any other name is a 404
``model_not_found`` naming the model(s) the route does serve. An alias is only offered for a task
the pipeline serves.

The HTTP routes check the ``model`` of their body (:func:`check_model`); the WebSocket route checks
its ``?model=`` (:func:`is_accepted`, :func:`unknown_model`).
"""

from __future__ import annotations

from typing import Final

from omnitrio.serve.api_errors import ApiError
from omnitrio.serve.context import ServeContext

MODEL_ALIASES: Final[dict[str, tuple[str, ...]]] = {
    "chat": (
        "gpt-4o-mini",
        "gpt-4o",
        "gpt-4o-audio-preview",
        "gpt-4o-mini-audio-preview",
        "gpt-4.1",
        "gpt-4.1-mini",
        "gpt-4.1-nano",
        "gpt-5",
        "gpt-5-mini",
        "gpt-5-nano",
        "gpt-3.5-turbo",
    ),
    "speech": ("tts-1", "tts-1-hd", "gpt-4o-mini-tts"),
    "transcription": ("whisper-1", "gpt-4o-mini-transcribe", "gpt-4o-transcribe"),
    "realtime": ("gpt-realtime", "gpt-realtime-mini", "gpt-4o-realtime-preview", "gpt-4o-mini-realtime-preview"),
}


def accepted_models(ctx: ServeContext, task: str) -> tuple[str, ...]:
    """The names ``task``'s route answers to: the pipeline's first, then its aliases."""
    return (ctx.pipeline.name, *MODEL_ALIASES.get(task, ()))


def is_accepted(ctx: ServeContext, task: str, model: str) -> bool:
    """Whether ``task``'s route answers to ``model``: a name of :func:`accepted_models` or a version of an alias."""
    if model in accepted_models(ctx, task):
        return True
    return any(
        model.startswith(f"{alias}-") and model[len(alias) + 1 : len(alias) + 2].isdigit()
        for alias in MODEL_ALIASES.get(task, ())
    )


def unknown_model(ctx: ServeContext, task: str, model: str) -> ApiError:
    """The 404 for ``model`` on ``task``'s route, naming what the route serves."""
    aliases = ", ".join(MODEL_ALIASES.get(task, ()))
    also = f" (also answering to {aliases})" if aliases else ""
    return ApiError(
        404,
        f"model {model!r} not found; this server serves {ctx.pipeline.name!r}{also}",
        param="model",
        code="model_not_found",
    )


def check_model(ctx: ServeContext, task: str, model: str | None) -> None:
    """404 unless ``model`` is absent or accepted for ``task`` (:func:`is_accepted`)."""
    if model is not None and not is_accepted(ctx, task, model):
        raise unknown_model(ctx, task, model)
