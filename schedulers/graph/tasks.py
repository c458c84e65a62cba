"""The ingress's routing by task, shared by every served graph.

What the server hands a pipeline (``omnitrio.serve``) names its task: ``chat`` (a bare string is a chat
turn too), ``speech``, ``transcription``, or ``asr_session`` (a realtime session's streaming turn
detection, whose commands a session stage reads from ``request.metadata["session"]``).  A graph sends
``asr_session`` to :data:`STREAM_ASR` and ``transcription`` to :data:`ASR` (:data:`ASR_STAGES`), and the
rest to its own stages.
"""

from __future__ import annotations

from typing import Any

from omnitrio.contract import InvalidRequest, StagePayload
from schedulers.session import SESSION_METADATA_KEY

TASKS = ("chat", "speech", "transcription", "asr_session")
STREAM_ASR = "stream_asr"
ASR = "asr"
ASR_STAGES = {"asr_session": STREAM_ASR, "transcription": ASR}
"""The stage that serves each ASR task, and completes it (its terminal)."""


def task_of(inputs: Any, *, strict: bool = True) -> str:
    """The task a request's inputs name; a bare string is a chat turn.

    ``strict``: anything else is a ``ValueError`` naming the tasks.  Not strict: inputs that name no
    task of :data:`TASKS` are a chat (the model's own stages then say what is wrong with them)."""
    if isinstance(inputs, str):
        return "chat"
    task = inputs.get("task") if isinstance(inputs, dict) else None
    if task in TASKS:
        return str(task)
    if strict:
        raise ValueError(f"inputs need 'task' set to one of {list(TASKS)} (or a plain string), got {task!r}")
    return "chat"


def wants_audio(inputs: Any) -> bool:
    """Whether the answer is spoken: speech always, chat when ``modalities`` asks for audio."""
    match task_of(inputs, strict=False):
        case "speech":
            return True
        case "chat":
            return isinstance(inputs, dict) and "audio" in (inputs.get("modalities") or ())
        case _:
            return False


def admit_session_command(payload: StagePayload) -> StagePayload:
    """At the ingress: an ``asr_session`` request's ``command`` goes into ``request.metadata["session"]``
    (where the session stage reads it); a missing or malformed command is the caller's error."""
    inputs = payload.request.inputs
    if task_of(inputs, strict=False) == "asr_session":
        command = inputs.get("command")
        if not isinstance(command, dict):
            raise InvalidRequest(f"an asr_session request needs 'command' (a dict), got {command!r}", param="command")
        payload.request.metadata[SESSION_METADATA_KEY] = command
    return payload


__all__ = ["ASR", "ASR_STAGES", "STREAM_ASR", "TASKS", "admit_session_command", "task_of", "wants_audio"]
