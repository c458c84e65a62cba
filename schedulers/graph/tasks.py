"""The ingress's routing by task, shared by every served graph.

What the server hands a pipeline (``omnitrio.serve``) names its task: ``chat`` (a bare string is a chat
turn too), ``speech``, ``transcription``, or ``asr_session`` (a realtime session's streaming turn
detection, whose commands a session stage reads from ``request.metadata["session"]``).  A graph sends
``asr_session`` to :data:`STREAM_ASR` and ``transcription`` to :data:`ASR` (:data:`ASR_STAGES`), and the
rest to its own stages.

An omni model's graph starts at an ingress stage (:func:`create_ingress_stage`) that sends each task where
it goes::

    ingress ─┬─ asr_session ──▶ stream_asr           (VAD events; terminal)
             ├─ transcription ─▶ asr                  (only when the config has one; terminal)
             └─ chat ──────────▶ preprocess ─▶ ...     (the model)

It puts an ``asr_session`` command into ``request.metadata["session"]``, where the session stage reads it;
other requests pass unchanged.  :class:`TaskRoutes` gives the ingress's route, the thinker's (``decode``,
and the talker when the answer is spoken, so a text-only request never runs the talker nor gets its end
of stream) and the pipeline's ``terminal_stages_fn``.
"""

from __future__ import annotations

from typing import Any

import attrs

from omnitrio.contract import InvalidRequest, StagePayload
from schedulers.engine.handoffs import ThinkerResult
from schedulers.graph.front import handoff_of
from schedulers.session import SESSION_METADATA_KEY
from schedulers.simple import SimpleScheduler

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


@attrs.frozen
class TaskRoutes:
    """Where an omni model's requests go by task: ``model`` is the model's first stage, ``text`` and
    ``audio`` the terminal stages of its answer's words and speech, ``talker`` the stage between the
    thinker and ``audio``.  A family's graph module holds one instance, ``TASKS``, and its config names the
    methods (``pkg.graph:TASKS.route_ingress``)."""

    model: str
    text: str
    talker: str
    audio: str

    def route_ingress(self, request_id: str, payload: StagePayload) -> str:
        """The first stage of the request's task: the ASR stage for its tasks, the model's for a chat."""
        return ASR_STAGES.get(task_of(payload.request.inputs, strict=False), self.model)

    def route_thinker(self, request_id: str, payload: StagePayload) -> list[str]:
        """Where the thinker's :class:`~schedulers.engine.handoffs.ThinkerResult` goes: ``text`` always,
        ``talker`` too when the answer is spoken."""
        spoken = handoff_of(payload, ThinkerResult, "route_thinker").want_audio
        return [self.text, self.talker] if spoken else [self.text]

    def chat_terminal_stages(self, request_id: str, inputs: Any) -> list[str]:
        """A chat's terminal stages: ``text`` always, ``audio`` too when the answer is spoken."""
        return [self.text, self.audio] if wants_audio(inputs) else [self.text]

    def terminal_stages(self, request_id: str, inputs: Any) -> list[str]:
        """The pipeline's ``terminal_stages_fn``: the ASR stage for its tasks, :meth:`chat_terminal_stages`
        for a chat."""
        task = task_of(inputs, strict=False)
        return [ASR_STAGES[task]] if task in ASR_STAGES else self.chat_terminal_stages(request_id, inputs)


def create_ingress_stage() -> SimpleScheduler:
    """The ingress: :func:`admit_session_command` on every request (no model, no weights)."""
    return SimpleScheduler(admit_session_command)


__all__ = [
    "ASR",
    "ASR_STAGES",
    "STREAM_ASR",
    "TASKS",
    "TaskRoutes",
    "admit_session_command",
    "create_ingress_stage",
    "task_of",
    "wants_audio",
]
