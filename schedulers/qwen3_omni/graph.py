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
  when the request asks for audio, so a text-only request never runs the talker or code2wav (nor gets
  its end of stream: the runtime sends that only where the thinker's routes went);
* :func:`terminal_stages` (the pipeline's ``terminal_stages_fn``): the ASR stage for its tasks, the
  model's terminals for a chat.

The task routing and the front's routes are the family-agnostic ones of :mod:`schedulers.graph`; this
module names Qwen3-Omni's stages, builds its handoffs and composes them.
"""

from __future__ import annotations

from omnitrio.contract import StagePayload
from schedulers.graph.front import (
    AGGREGATE,
    AUDIO_ENCODER,
    IMAGE_ENCODER,
    PREPROCESS,
    FrontEdges,
    handoff_of,
    route_preprocess,
    wait_for_aggregate,
)
from schedulers.graph.tasks import ASR, STREAM_ASR, TaskRoutes, create_ingress_stage, task_of
from schedulers.qwen3_omni.handoffs import (
    ImageEmbeddings,
    Preprocessed,
    PreprocessedText,
    ThinkerInput,
    ThinkerResult,
)

THINKER = "thinker"
DECODE = "decode"
TALKER = "talker"
CODE2WAV = "code2wav"
INGRESS = "ingress"

EDGES = FrontEdges(Preprocessed, PreprocessedText, ImageEmbeddings, ThinkerInput)
project_to_audio_encoder = EDGES.project_to_audio_encoder
project_to_image_encoder = EDGES.project_to_image_encoder
project_to_aggregate = EDGES.project_to_aggregate
merge_aggregate = EDGES.merge_aggregate

TASKS = TaskRoutes(model=PREPROCESS, text=DECODE, audio=CODE2WAV)
route_ingress = TASKS.route_ingress
chat_terminal_stages = TASKS.chat_terminal_stages
terminal_stages = TASKS.terminal_stages


def route_thinker(request_id: str, payload: StagePayload) -> list[str]:
    return [DECODE, TALKER] if handoff_of(payload, ThinkerResult, "route_thinker").want_audio else [DECODE]


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
