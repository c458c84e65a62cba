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

* :func:`route_preprocess` sends a request to the encoders it needs and always to ``aggregate``;
  :func:`wait_for_aggregate` makes ``aggregate`` wait for exactly those (every branch carries the list,
  ``encoders``, since it is evaluated on whichever input arrives first);
* the ``project_*`` functions give each branch only the fields it reads (new dicts; tensors are shared,
  never written);
* :func:`merge_aggregate` builds the thinker's input: ``{"input_ids", "audio_embeds", "image_embeds",
  "deepstack_image_embeds", "image_grid_thw", "audio_feature_lengths", "max_new_tokens", "temperature",
  "speaker", "talker", "want_audio"}`` (absent media are ``None``);
* :func:`route_thinker` / :func:`chat_terminal_stages`: ``decode`` always, ``talker`` / ``code2wav`` too
  when the request asks for audio, so a text-only request never runs the talker or code2wav;
  :func:`route_thinker` is also the thinker's ``stream_done_to_fn``: its end of stream goes only where
  its stream and result go (an end of stream alone would start a request at the talker that nothing ends);
* :func:`terminal_stages` (the pipeline's ``terminal_stages_fn``): the ASR stage for its tasks, the
  model's terminals for a chat.
"""

from __future__ import annotations

from typing import Any

from omnitrio.contract import InvalidRequest, StagePayload

# The front of the graph is omni-tiny's (same stage names): reuse its routing.
from schedulers.omni.routing import (
    AGGREGATE,
    AUDIO_ENCODER,
    IMAGE_ENCODER,
    PREPROCESS,
    route_preprocess,
    wait_for_aggregate,
    wants_audio,
)
from schedulers.session import SESSION_METADATA_KEY
from schedulers.simple import SimpleScheduler

THINKER = "thinker"
DECODE = "decode"
TALKER = "talker"
CODE2WAV = "code2wav"
INGRESS = "ingress"
STREAM_ASR = "stream_asr"
ASR = "asr"
_ENTRY = {"asr_session": STREAM_ASR, "transcription": ASR}

KNOBS = ("max_new_tokens", "temperature", "speaker", "talker", "want_audio")


def _data(payload: Any, where: str) -> dict[str, Any]:
    data = getattr(payload, "data", None)
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a payload whose data is a dict, got {type(data).__name__}")
    return data


def _with(payload: StagePayload, data: dict[str, Any]) -> StagePayload:
    return StagePayload(payload.request_id, payload.request, data)


def project_to_audio_encoder(payload: StagePayload) -> StagePayload:
    data = _data(payload, "project_to_audio_encoder")
    keep = ("input_features", "feature_attention_mask")
    return _with(payload, {**{k: data[k] for k in keep}, "encoders": list(data["encoders"])})


def project_to_image_encoder(payload: StagePayload) -> StagePayload:
    data = _data(payload, "project_to_image_encoder")
    keep = ("pixel_values", "image_grid_thw")
    return _with(payload, {**{k: data[k] for k in keep}, "encoders": list(data["encoders"])})


def project_to_aggregate(payload: StagePayload) -> StagePayload:
    data = _data(payload, "project_to_aggregate")
    knobs = {k: data.get(k) for k in KNOBS}
    return _with(payload, {"input_ids": data["input_ids"], "encoders": list(data["encoders"]), **knobs})


def merge_aggregate(inputs: dict[str, StagePayload]) -> StagePayload:
    """The thinker's input (module docstring) from the preprocess payload and the encoders' outputs."""
    base = inputs[PREPROCESS]
    text = _data(base, "merge_aggregate")
    audio = _data(inputs[AUDIO_ENCODER], "merge_aggregate") if AUDIO_ENCODER in inputs else {}
    image = _data(inputs[IMAGE_ENCODER], "merge_aggregate") if IMAGE_ENCODER in inputs else {}
    data: dict[str, Any] = {
        "input_ids": text["input_ids"],
        "audio_embeds": audio.get("audio_embeds"),
        "audio_feature_lengths": audio.get("audio_feature_lengths"),
        "image_embeds": image.get("image_embeds"),
        "deepstack_image_embeds": image.get("deepstack_image_embeds"),
        "image_grid_thw": image.get("image_grid_thw"),
        **{k: text.get(k) for k in KNOBS},
    }
    return _with(base, data)


def route_thinker(request_id: str, payload: StagePayload) -> list[str]:
    return [DECODE, TALKER] if _data(payload, "route_thinker").get("want_audio") else [DECODE]


def chat_terminal_stages(request_id: str, inputs: Any) -> list[str]:
    """``decode`` always; ``code2wav`` too when the request asks for audio."""
    return [DECODE, CODE2WAV] if wants_audio(inputs) else [DECODE]


def task_of(inputs: Any) -> str:
    """``asr_session``, ``transcription``, or ``chat`` for anything else (the model's stages check it)."""
    task = inputs.get("task") if isinstance(inputs, dict) else None
    return task if task in _ENTRY else "chat"


def route_ingress(request_id: str, payload: StagePayload) -> str:
    """The first stage of the request's task (module docstring)."""
    return _ENTRY.get(task_of(payload.request.inputs), PREPROCESS)


def terminal_stages(request_id: str, inputs: Any) -> list[str]:
    """The ASR stage for its tasks; the model's terminal stages (:func:`chat_terminal_stages`) for a chat."""
    task = task_of(inputs)
    return [_ENTRY[task]] if task in _ENTRY else chat_terminal_stages(request_id, inputs)


def _admit(payload: StagePayload) -> StagePayload:
    inputs = payload.request.inputs
    if task_of(inputs) == "asr_session":
        command = inputs.get("command")
        if not isinstance(command, dict):
            raise InvalidRequest(f"an asr_session request needs 'command' (a dict), got {command!r}", param="command")
        payload.request.metadata[SESSION_METADATA_KEY] = command
    return payload


def create_ingress_stage() -> SimpleScheduler:
    """Routes by task (module docstring); no model, no weights."""
    return SimpleScheduler(_admit)


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
    "wants_audio",
]
