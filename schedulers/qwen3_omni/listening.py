"""The front of a Qwen3-Omni pipeline that serves realtime sessions: server VAD beside the model.

A realtime session detects turns through the pipeline (``omnitrio.serve.realtime.listen``: requests
of task ``asr_session`` to a streaming ASR stage, ``schedulers.speech``'s ``stream_asr``), and may ask
for input transcription (task ``transcription``, an ASR stage). The model itself hears the turn's
audio (a ``chat`` request). ``ingress`` sends each task where it goes::

    ingress ─┬─ asr_session ──▶ stream_asr           (VAD events; terminal)
             ├─ transcription ─▶ asr                  (only when the config has one; terminal)
             └─ chat ──────────▶ preprocess ─▶ ...     (the model: :mod:`.routing`)

``ingress`` puts an ``asr_session`` command into ``request.metadata["session"]``, where the session
stage reads it; other requests pass unchanged (``payload.data`` is what ``preprocess`` reads).
"""

from __future__ import annotations

from typing import Any

from omnitrio.contract import InvalidRequest, StagePayload
from schedulers.qwen3_omni import routing
from schedulers.session import SESSION_METADATA_KEY
from schedulers.simple import SimpleScheduler

INGRESS = "ingress"
STREAM_ASR = "stream_asr"
ASR = "asr"
_ENTRY = {"asr_session": STREAM_ASR, "transcription": ASR}


def task_of(inputs: Any) -> str:
    """``asr_session``, ``transcription``, or ``chat`` for anything else (the model's stages check it)."""
    task = inputs.get("task") if isinstance(inputs, dict) else None
    return task if task in _ENTRY else "chat"


def route_ingress(request_id: str, payload: StagePayload) -> str:
    """The first stage of the request's task (module docstring)."""
    return _ENTRY.get(task_of(payload.request.inputs), routing.PREPROCESS)


def terminal_stages(request_id: str, inputs: Any) -> list[str]:
    """The ASR stage for its tasks; the model's terminal stages (:func:`.routing.terminal_stages`) for a chat."""
    task = task_of(inputs)
    return [_ENTRY[task]] if task in _ENTRY else routing.terminal_stages(request_id, inputs)


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
