"""The front of an omni model: ``preprocess`` → the encoders a request needs → ``aggregate``.

::

    preprocess ─┬─▶ audio_encoder ─┐        (only when the request has audio)
                ├─▶ image_encoder ─┤        (only when it has images)
                └──────────────────┴─▶ aggregate

``preprocess`` decides which encoders a request needs and every handoff on these edges carries that
list as ``encoders`` (a tuple of stage names in graph order): :func:`route_preprocess` sends the request
to those encoders and always to ``aggregate``, and :func:`wait_for_aggregate` (evaluated on whichever
input reaches ``aggregate`` first) makes ``aggregate`` wait for exactly those.  The family's graph module
names these functions in its config; its handoffs are any classes with an ``encoders`` attribute.
"""

from __future__ import annotations

from typing import Any

from omnitrio.contract import StagePayload
from schedulers.graph.tasks import wants_audio

PREPROCESS = "preprocess"
AUDIO_ENCODER = "audio_encoder"
IMAGE_ENCODER = "image_encoder"
AGGREGATE = "aggregate"


def encoders_of(payload: Any, where: str) -> tuple[str, ...]:
    """The ``encoders`` a front handoff carries; ``ValueError`` naming ``where`` when it carries none."""
    encoders = getattr(getattr(payload, "data", None), "encoders", None)
    if not isinstance(encoders, tuple) or not all(isinstance(name, str) for name in encoders):
        data = getattr(payload, "data", None)
        raise ValueError(f"{where}: expected a front handoff with 'encoders', got {type(data).__name__}")
    return encoders


def route_preprocess(request_id: str, payload: StagePayload) -> list[str]:
    """The encoders the request needs, then ``aggregate``."""
    return [*encoders_of(payload, "route_preprocess"), AGGREGATE]


def wait_for_aggregate(request_id: str, from_stage: str, payload: StagePayload) -> list[str]:
    """``preprocess`` and the encoders the request needs."""
    return [PREPROCESS, *encoders_of(payload, f"wait_for_aggregate (from {from_stage!r})")]


def answer_terminals(inputs: Any, text: str, audio: str) -> list[str]:
    """The terminal stages of a chat's answer: ``text`` always, ``audio`` too when the answer is spoken."""
    return [text, audio] if wants_audio(inputs) else [text]


__all__ = [
    "AGGREGATE",
    "AUDIO_ENCODER",
    "IMAGE_ENCODER",
    "PREPROCESS",
    "answer_terminals",
    "encoders_of",
    "route_preprocess",
    "wait_for_aggregate",
]
