"""The front of an omni model: ``preprocess`` → the encoders a request needs → ``aggregate``.

::

    preprocess ─┬─▶ audio_encoder ─┐        (only when the request has audio)
                ├─▶ image_encoder ─┤        (only when it has images)
                └──────────────────┴─▶ aggregate

``preprocess`` decides which encoders a request needs and every handoff on these edges carries that
list as ``encoders`` (a tuple of stage names in graph order): :func:`route_preprocess` sends the request
to those encoders and always to ``aggregate``, and :func:`wait_for_aggregate` (evaluated on whichever
input reaches ``aggregate`` first) makes ``aggregate`` wait for exactly those.  A family's config names
these functions here; its handoffs are any classes with an ``encoders`` attribute.

A family's projections and merge are :class:`FrontEdges` over its handoff classes: a field means the same
thing under the same name in every handoff of a front (``input_ids``, ``audio_embeds``,
``image_grid_thw``, ...), so each handoff is built from the same-named fields of what arrived (tensors
shared, never copied or written).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import attrs

from omnitrio.contract import StagePayload
from schedulers.front.handoffs import AudioEmbeddings, AudioEncoderInput, ImageEncoderInput

PREPROCESS = "preprocess"
AUDIO_ENCODER = "audio_encoder"
IMAGE_ENCODER = "image_encoder"
AGGREGATE = "aggregate"
T = TypeVar("T")


def handoff_of(payload: Any, kind: type[T], where: str) -> T:
    """``payload.data``, a ``kind``; a ``ValueError`` naming ``where`` otherwise."""
    data = getattr(payload, "data", None)
    if not isinstance(data, kind):
        raise ValueError(f"{where}: expected a payload holding a {kind.__name__}, got {type(data).__name__}")
    return data


def with_handoff(payload: StagePayload, data: Any) -> StagePayload:
    """A new payload of the same request holding ``data`` (``payload`` itself is left as it is)."""
    return StagePayload(payload.request_id, payload.request, data)


def encoders_of(payload: Any, where: str) -> tuple[str, ...]:
    """The ``encoders`` a front handoff carries; ``ValueError`` naming ``where`` when it carries none."""
    encoders = getattr(getattr(payload, "data", None), "encoders", None)
    if not isinstance(encoders, tuple) or not all(isinstance(name, str) for name in encoders):
        data = getattr(payload, "data", None)
        raise ValueError(f"{where}: expected a front handoff with 'encoders', got {type(data).__name__}")
    return encoders


def _project(payload: StagePayload, source: type, target: type[T], where: str) -> StagePayload:
    data: Any = handoff_of(payload, source, where)
    values = {}
    for field in attrs.fields(target):  # type: ignore[arg-type]
        value = getattr(data, field.name, None)
        if value is None and field.default is attrs.NOTHING:
            raise ValueError(f"{where}: the request has no {field.name}")
        if hasattr(data, field.name):
            values[field.name] = value
    return with_handoff(payload, target(**values))


@attrs.frozen
class FrontEdges:
    """One family's projections and merge over its handoff classes (module docstring): ``preprocessed``
    (what ``preprocess`` gives), ``text`` (what of it reaches ``aggregate``), ``image_embeddings`` (what
    the image encoder gives), ``thinker_input`` (what the merge builds); the encoders' inputs and the
    audio encoder's output are :mod:`schedulers.front.handoffs`'.  A family's graph module holds one
    instance, ``EDGES``, and its config names the methods (``pkg.graph:EDGES.project_to_audio_encoder``).

    A projection whose source lacks a value the target requires (a field without a default), or an input
    that is not the class its edge carries, is a ``ValueError`` naming the function."""

    preprocessed: type
    text: type
    image_embeddings: type
    thinker_input: type

    def project_to_audio_encoder(self, payload: StagePayload) -> StagePayload:
        """What ``audio_encoder`` reads of ``preprocess``'s output."""
        return _project(payload, self.preprocessed, AudioEncoderInput, "project_to_audio_encoder")

    def project_to_image_encoder(self, payload: StagePayload) -> StagePayload:
        """What ``image_encoder`` reads of ``preprocess``'s output."""
        return _project(payload, self.preprocessed, ImageEncoderInput, "project_to_image_encoder")

    def project_to_aggregate(self, payload: StagePayload) -> StagePayload:
        """What ``aggregate`` reads of ``preprocess``'s output."""
        return _project(payload, self.preprocessed, self.text, "project_to_aggregate")

    def merge_aggregate(self, inputs: Mapping[str, StagePayload]) -> StagePayload:
        """The thinker's input from ``preprocess``'s text and the encoders' outputs that arrived (the
        request's encoders); the request is ``preprocess``'s."""
        kinds = {PREPROCESS: self.text, AUDIO_ENCODER: AudioEmbeddings, IMAGE_ENCODER: self.image_embeddings}
        names = [field.name for field in attrs.fields(self.thinker_input)]
        values = {}
        for stage, payload in inputs.items():
            data: Any = handoff_of(payload, kinds[stage], f"merge_aggregate (from {stage!r})")
            values.update({name: getattr(data, name) for name in names if hasattr(data, name)})
        return with_handoff(inputs[PREPROCESS], self.thinker_input(**values))


def route_preprocess(request_id: str, payload: StagePayload) -> list[str]:
    """The encoders the request needs, then ``aggregate``."""
    return [*encoders_of(payload, "route_preprocess"), AGGREGATE]


def wait_for_aggregate(request_id: str, from_stage: str, payload: StagePayload) -> list[str]:
    """``preprocess`` and the encoders the request needs."""
    return [PREPROCESS, *encoders_of(payload, f"wait_for_aggregate (from {from_stage!r})")]


__all__ = [
    "AGGREGATE",
    "AUDIO_ENCODER",
    "IMAGE_ENCODER",
    "PREPROCESS",
    "FrontEdges",
    "encoders_of",
    "handoff_of",
    "route_preprocess",
    "wait_for_aggregate",
    "with_handoff",
]
