"""The per-request graph of the omni pipeline: which branches a request takes and what each receives.

::

    preprocess ─┬─▶ audio_encoder ─┐                      (only when the request has audio)
                ├─▶ image_encoder ─┤                      (only when it has images)
                └──────────────────┴─▶ aggregate ─▶ thinker ─┬─▶ detokenize            (text, terminal)
                                                     tokens ┘└─▶ talker ─▶ code2wav   (audio, terminal)
                                                  (stream)              mel (stream)

The functions here are named by ``configs/omni-tiny.toml`` and use those stage names:

* :func:`route_preprocess` sends a request to the encoders its media need, and always to
  ``aggregate``; :func:`wait_for_aggregate` makes ``aggregate`` wait for exactly those (it is
  evaluated on whichever input arrives first, so every branch carries the list, ``encoders``);
* :func:`merge_aggregate` builds the thinker's prompt: audio codes, image codes, then the text;
* :func:`route_thinker` sends the thinker's result to ``detokenize`` and, when audio was asked
  for, to ``talker``; :func:`terminal_stages` tells the coordinator the same from the inputs alone,
  so a text-only request completes without the talker or the vocoder;
* the ``project_*`` functions give each branch only the fields it reads (fresh containers, so the
  runtime need not deep-copy a fan-out).
"""

from __future__ import annotations

from typing import Any

from omnitrio.contract import StagePayload
from schedulers.omni.inputs import wants_audio

AUDIO_ENCODER = "audio_encoder"
IMAGE_ENCODER = "image_encoder"
PREPROCESS = "preprocess"
AGGREGATE = "aggregate"
DETOKENIZE = "detokenize"
TALKER = "talker"
CODE2WAV = "code2wav"

_FORWARDED = ("modalities", "max_new_tokens", "temperature")


def _data(payload: Any, where: str) -> dict[str, Any]:
    data = getattr(payload, "data", None)
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a payload whose data is a dict, got {type(data).__name__}")
    return data


def _with(payload: StagePayload, data: dict[str, Any]) -> StagePayload:
    return StagePayload(payload.request_id, payload.request, data)


def route_preprocess(request_id: str, payload: StagePayload) -> list[str]:
    return [*_data(payload, "route_preprocess")["encoders"], AGGREGATE]


def project_to_audio_encoder(payload: StagePayload) -> StagePayload:
    data = _data(payload, "project_to_audio_encoder")
    return _with(payload, {"audio_features": list(data["audio_features"]), "encoders": list(data["encoders"])})


def project_to_image_encoder(payload: StagePayload) -> StagePayload:
    data = _data(payload, "project_to_image_encoder")
    return _with(payload, {"image_features": list(data["image_features"]), "encoders": list(data["encoders"])})


def project_to_aggregate(payload: StagePayload) -> StagePayload:
    data = _data(payload, "project_to_aggregate")
    keep = {k: data[k] for k in (*_FORWARDED, "prompt_token_ids", "encoders") if k in data}
    return _with(payload, {k: list(v) if isinstance(v, list) else v for k, v in keep.items()})


def wait_for_aggregate(request_id: str, from_stage: str, payload: StagePayload) -> list[str]:
    return [PREPROCESS, *_data(payload, "wait_for_aggregate")["encoders"]]


def merge_aggregate(inputs: dict[str, StagePayload]) -> StagePayload:
    """The thinker's input: ``prompt_token_ids`` = audio codes + image codes + text, plus the knobs."""
    base = inputs[PREPROCESS]
    text = _data(base, "merge_aggregate")
    media: list[int] = []
    counts: dict[str, int] = {}
    for source, key in ((AUDIO_ENCODER, "audio_token_ids"), (IMAGE_ENCODER, "image_token_ids")):
        if source in inputs:
            ids = _data(inputs[source], "merge_aggregate")[key]
            media.extend(ids)
            counts[key.replace("_token_ids", "_tokens")] = len(ids)
    data = {k: text[k] for k in _FORWARDED if k in text}
    data["prompt_token_ids"] = media + list(text["prompt_token_ids"])
    data.update(counts)
    return _with(base, data)


def route_thinker(request_id: str, payload: StagePayload) -> list[str]:
    return [DETOKENIZE, TALKER] if wants_audio(payload.request.inputs) else [DETOKENIZE]


def project_to_detokenize(payload: StagePayload) -> StagePayload:
    data = _data(payload, "project_to_detokenize")
    return _with(
        payload,
        {
            "output_token_ids": list(data["output_token_ids"]),
            "prompt_token_ids": list(data["prompt_token_ids"]),
            "finish_reason": data.get("finish_reason"),
        },
    )


def project_to_talker(payload: StagePayload) -> StagePayload:
    data = _data(payload, "project_to_talker")
    return _with(payload, {"output_token_ids": list(data["output_token_ids"]), "text": data.get("text", "")})


def terminal_stages(request_id: str, inputs: Any) -> list[str]:
    """``detokenize`` always; ``code2wav`` too when the request asks for audio."""
    return [DETOKENIZE, CODE2WAV] if wants_audio(inputs) else [DETOKENIZE]
