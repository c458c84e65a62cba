"""Qwen2.5-Omni's graph: the ingress, the routes a request takes, its terminal stages, the aggregate's merge.

The ingress sends each task where it goes (:mod:`schedulers.graph.tasks`): a realtime session's turn
detection (``asr_session``) to ``stream_asr``, a transcription to ``asr`` (when the config has one), and
a chat to the model::

    ingress ─┬─ asr_session ──▶ stream_asr           (VAD events; terminal)
             ├─ transcription ─▶ asr                  (only when the config has one; terminal)
             └─ chat ──────────▶ preprocess ─▶ ...     (the model, below)

A chat request's branches through the model::

    preprocess ─┬─▶ audio_encoder ─┐                     (only when the request has audio)
                ├─▶ image_encoder ─┤                     (only when it has images)
                └──────────────────┴─▶ aggregate ─▶ thinker ─┬─▶ decode                  (text, terminal)
                                                    stream ┘└─▶ talker ─▶ token2wav    (audio, terminal)

What crosses each edge of the front is a class of :mod:`.handoffs`:

* :func:`route_preprocess` sends a request to the encoders it needs and always to ``aggregate``;
  :func:`wait_for_aggregate` makes ``aggregate`` wait for exactly those (every branch carries the list,
  ``encoders``, since it is evaluated on whichever input arrives first);
* the ``project_*`` functions give each branch only what it reads of ``preprocess``'s
  :class:`~.handoffs.Preprocessed` (:class:`~.handoffs.AudioEncoderInput`,
  :class:`~.handoffs.ImageEncoderInput`, :class:`~.handoffs.PreprocessedText`; tensors are shared,
  never written);
* :func:`merge_aggregate` builds the thinker's :class:`~.handoffs.ThinkerInput` from the text and the
  encoders' :class:`~.handoffs.AudioEmbeddings` / :class:`~.handoffs.ImageEmbeddings`;
* :func:`route_thinker`: ``decode`` always, ``talker`` too when the answer is spoken (the thinker's result
  says so in its ``want_audio``), so a text-only request never reaches the talker or token2wav (nor its
  end of stream: the runtime sends that only where the thinker's routes went);
* :func:`chat_terminal_stages` / :func:`terminal_stages` (the pipeline's ``terminal_stages_fn``):
  ``decode``, and ``token2wav`` when the request asks for audio; the ASR stage for its tasks.

The task routing and the front's routes are the family-agnostic ones of :mod:`schedulers.graph`; this
module names Qwen2.5-Omni's stages, builds its handoffs and composes them.
"""

from __future__ import annotations

from omnitrio.contract import StagePayload
from schedulers.graph.front import (
    AGGREGATE,
    AUDIO_ENCODER,
    IMAGE_ENCODER,
    PREPROCESS,
    FrontEdges,
    route_preprocess,
    wait_for_aggregate,
)
from schedulers.graph.tasks import ASR, STREAM_ASR, TaskRoutes, create_ingress_stage
from schedulers.qwen2_5_omni.handoffs import (
    ImageEmbeddings,
    Preprocessed,
    PreprocessedText,
    ThinkerInput,
)

INGRESS = "ingress"
THINKER = "thinker"
DECODE = "decode"
TALKER = "talker"
TOKEN2WAV = "token2wav"

EDGES = FrontEdges(Preprocessed, PreprocessedText, ImageEmbeddings, ThinkerInput)
project_to_audio_encoder = EDGES.project_to_audio_encoder
project_to_image_encoder = EDGES.project_to_image_encoder
project_to_aggregate = EDGES.project_to_aggregate
merge_aggregate = EDGES.merge_aggregate

TASKS = TaskRoutes(model=PREPROCESS, text=DECODE, audio=TOKEN2WAV)
route_ingress = TASKS.route_ingress
chat_terminal_stages = TASKS.chat_terminal_stages
terminal_stages = TASKS.terminal_stages


def route_thinker(request_id: str, payload: StagePayload) -> list[str]:
    """``decode``, and ``talker`` when the thinker's result says the answer is spoken (``want_audio``)."""
    want_audio = getattr(getattr(payload, "data", None), "want_audio", None)
    if not isinstance(want_audio, bool):
        raise ValueError(f"route_thinker: the thinker's result needs a bool 'want_audio', got {want_audio!r}")
    return [DECODE, TALKER] if want_audio else [DECODE]


__all__ = [
    "AGGREGATE",
    "ASR",
    "AUDIO_ENCODER",
    "DECODE",
    "IMAGE_ENCODER",
    "INGRESS",
    "PREPROCESS",
    "STREAM_ASR",
    "TALKER",
    "THINKER",
    "TOKEN2WAV",
    "chat_terminal_stages",
    "create_ingress_stage",
    "merge_aggregate",
    "project_to_aggregate",
    "project_to_audio_encoder",
    "project_to_image_encoder",
    "route_ingress",
    "route_preprocess",
    "route_thinker",
    "terminal_stages",
    "wait_for_aggregate",
]
