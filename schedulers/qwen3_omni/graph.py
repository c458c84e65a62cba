"""Qwen3-Omni's graph: the ingress, the routes a request takes, its terminal stages, the merge.

The front of a served pipeline sits beside the model (server VAD and input transcription for realtime
sessions: ``omnitrio.serve.realtime.listen`` sends requests of task ``asr_session`` to a streaming ASR
stage, ``schedulers.speech``'s ``stream_asr``, and task ``transcription`` to an ASR stage when the
config has one). The model itself hears a turn's audio in a ``chat`` request. ``ingress`` sends each
task where it goes::

    ingress ─┬─ asr_session ──▶ stream_asr           (VAD events; terminal)
             ├─ transcription ─▶ asr                  (only when the config has one; terminal)
             └─ chat ──────────▶ preprocess ─▶ ...     (the model, below)

``ingress`` puts an ``asr_session`` command into ``request.metadata["session"]``, where the session
stage reads it; other requests pass unchanged (``payload.data`` is what ``preprocess`` reads).

A chat request's branches through the model, and what each receives::

    preprocess ─┬─▶ audio_encoder ─┐                     (only when the request has audio)
                ├─▶ image_encoder ─┤                     (only when it has images)
                └──────────────────┴─▶ aggregate ─▶ thinker ─┬─▶ decode                 (text, terminal)
                                                    stream ┘└─▶ talker ─▶ code2wav    (audio, terminal)

What crosses each edge is a class of :mod:`.handoffs`:

* :func:`route_preprocess` sends a request to the encoders it needs and always to ``aggregate``;
  :func:`wait_for_aggregate` makes ``aggregate`` wait for exactly those (every branch carries the list,
  ``encoders``, since it is evaluated on whichever input arrives first);
* the ``project_*`` functions give each branch only what it reads of ``preprocess``'s
  :class:`~.handoffs.Preprocessed` (:class:`~.handoffs.AudioEncoderInput`,
  :class:`~.handoffs.ImageEncoderInput`, :class:`~.handoffs.PreprocessedText`; tensors are shared,
  never written);
* :func:`merge_aggregate` builds the thinker's :class:`~.handoffs.ThinkerInput` from the text and the
  encoders' :class:`~.handoffs.AudioEmbeddings` / :class:`~.handoffs.ImageEmbeddings`;
* :func:`route_thinker` / :func:`chat_terminal_stages`: ``decode`` always, ``talker`` / ``code2wav`` too
  when the request asks for audio, so a text-only request never runs the talker or code2wav;
  :func:`route_thinker` is also the thinker's ``stream_done_to_fn``: its end of stream goes only where
  its stream and result go (an end of stream alone would start a request at the talker that nothing ends);
* :func:`terminal_stages` (the pipeline's ``terminal_stages_fn``): the ASR stage for its tasks, the
  model's terminals for a chat.

The task routing and the front's routes are the family-agnostic ones of :mod:`schedulers.graph`; this
module names Qwen3-Omni's stages, builds its handoffs and composes them.
"""

from __future__ import annotations

from typing import Any, TypeVar

from omnitrio.contract import StagePayload
from schedulers.graph.front import (
    AGGREGATE,
    AUDIO_ENCODER,
    IMAGE_ENCODER,
    PREPROCESS,
    answer_terminals,
    route_preprocess,
    wait_for_aggregate,
)
from schedulers.graph.tasks import ASR, ASR_STAGES, STREAM_ASR, admit_session_command, task_of
from schedulers.qwen3_omni.handoffs import (
    AudioEmbeddings,
    AudioEncoderInput,
    ImageEmbeddings,
    ImageEncoderInput,
    Preprocessed,
    PreprocessedText,
    ThinkerInput,
    ThinkerResult,
)
from schedulers.simple import SimpleScheduler

THINKER = "thinker"
DECODE = "decode"
TALKER = "talker"
CODE2WAV = "code2wav"
INGRESS = "ingress"
T = TypeVar("T")


def _data(payload: Any, kind: type[T], where: str) -> T:
    data = getattr(payload, "data", None)
    if not isinstance(data, kind):
        raise ValueError(f"{where}: expected a payload holding a {kind.__name__}, got {type(data).__name__}")
    return data


def _with(payload: StagePayload, data: Any) -> StagePayload:
    return StagePayload(payload.request_id, payload.request, data)


def project_to_audio_encoder(payload: StagePayload) -> StagePayload:
    data = _data(payload, Preprocessed, "project_to_audio_encoder")
    if data.input_features is None or data.feature_attention_mask is None:
        raise ValueError("project_to_audio_encoder: the request has no audio features")
    return _with(payload, AudioEncoderInput(data.input_features, data.feature_attention_mask, data.encoders))


def project_to_image_encoder(payload: StagePayload) -> StagePayload:
    data = _data(payload, Preprocessed, "project_to_image_encoder")
    if data.pixel_values is None or data.image_grid_thw is None:
        raise ValueError("project_to_image_encoder: the request has no image pixels")
    return _with(payload, ImageEncoderInput(data.pixel_values, data.image_grid_thw, data.encoders))


def project_to_aggregate(payload: StagePayload) -> StagePayload:
    data = _data(payload, Preprocessed, "project_to_aggregate")
    return _with(payload, PreprocessedText(data.input_ids, data.encoders, data.knobs))


def merge_aggregate(inputs: dict[str, StagePayload]) -> StagePayload:
    """The thinker's input (module docstring) from the preprocess payload and the encoders' outputs."""
    base = inputs[PREPROCESS]
    text = _data(base, PreprocessedText, "merge_aggregate")
    audio = _data(inputs[AUDIO_ENCODER], AudioEmbeddings, "merge_aggregate") if AUDIO_ENCODER in inputs else None
    image = _data(inputs[IMAGE_ENCODER], ImageEmbeddings, "merge_aggregate") if IMAGE_ENCODER in inputs else None
    merged = ThinkerInput(
        text.input_ids,
        text.knobs,
        audio_embeds=None if audio is None else audio.audio_embeds,
        audio_feature_lengths=None if audio is None else audio.audio_feature_lengths,
        image_embeds=None if image is None else image.image_embeds,
        deepstack_image_embeds=None if image is None else image.deepstack_image_embeds,
        image_grid_thw=None if image is None else image.image_grid_thw,
    )
    return _with(base, merged)


def route_thinker(request_id: str, payload: StagePayload) -> list[str]:
    return [DECODE, TALKER] if _data(payload, ThinkerResult, "route_thinker").want_audio else [DECODE]


def chat_terminal_stages(request_id: str, inputs: Any) -> list[str]:
    """``decode`` always; ``code2wav`` too when the request asks for audio."""
    return answer_terminals(inputs, DECODE, CODE2WAV)


def route_ingress(request_id: str, payload: StagePayload) -> str:
    """The first stage of the request's task (module docstring)."""
    return ASR_STAGES.get(task_of(payload.request.inputs, strict=False), PREPROCESS)


def terminal_stages(request_id: str, inputs: Any) -> list[str]:
    """The ASR stage for its tasks; the model's terminal stages (:func:`chat_terminal_stages`) for a chat."""
    task = task_of(inputs, strict=False)
    return [ASR_STAGES[task]] if task in ASR_STAGES else chat_terminal_stages(request_id, inputs)


def create_ingress_stage() -> SimpleScheduler:
    """Routes by task (module docstring); no model, no weights."""
    return SimpleScheduler(admit_session_command)


__all__ = [
    "AGGREGATE",
    "ASR",
    "AUDIO_ENCODER",
    "CODE2WAV",
    "DECODE",
    "IMAGE_ENCODER",
    "INGRESS",
    "PREPROCESS",
    "STREAM_ASR",
    "TALKER",
    "THINKER",
    "chat_terminal_stages",
    "create_ingress_stage",
    "merge_aggregate",
    "project_to_aggregate",
    "project_to_audio_encoder",
    "project_to_image_encoder",
    "route_ingress",
    "route_preprocess",
    "route_thinker",
    "task_of",
    "terminal_stages",
    "wait_for_aggregate",
]
