"""Server-side turn detection for one realtime session, done by the pipeline's streaming ASR stage.

A :class:`TurnListener` owns one ASR session of the pipeline (a ``SessionScheduler`` stage). It is
driven with ordinary pipeline requests whose inputs are ``{"task": "asr_session", "command": {"op":
"open" | "append" | "abort", "session_id", ...}}``: ``open`` asks for server VAD with the client's
settings, each ``append`` carries the PCM16 24 kHz bytes the client sent since the last one, and
the VAD events the stage streams back (``modality == "vad"``) go, typed (:data:`~.turn.VadEvent`,
:func:`vad_event`), to the listener's channel in stream order; the channel is closed when ``run`` ends.

Why through the pipeline and not a VAD in the server: the server never imports model code, and a
pipeline may run its stages in other processes. The cost is one small request per append; while
one is in flight, further audio is coalesced into the next, so the listener never falls behind.

Besides OpenAI's ``speech_started`` / ``speech_stopped`` the listener asks for ``speech_paused``
(the turn *may* be ending: ``PAUSE_LEAD_MS`` before server VAD's ``speech_stopped`` could confirm it,
or, with ``semantic_vad``, once the turn was transcribed, at 100 ms of silence, before the stage
judges it at its pause: ``turn_judged`` follows) and ``speech_resumed`` (it did not): the
connection uses them to prepare its answer speculatively.
Each judged pause is logged (``omnitrio.serve.realtime.listen``, DEBUG): what was heard, the
model's probability, the words' objection and the decision.

What a caller may rely on: :meth:`TurnListener.run` raises if the session cannot be opened (the
stage's error, e.g. its ``max_sessions``, names the limit) and before it reports ``started``
nothing is delivered; :attr:`TurnListener.heard` counts the fed samples the VAD has judged (their
events delivered already), so audio past it may still turn out to be speech, and each time it
grows a :class:`~.turn.Heard` event follows those events on the channel; whatever way ``run``
ends, the ASR session is aborted (shielded, bounded by ``CLOSE_TIMEOUT`` seconds), so a closed
socket never leaves session state in the pipeline.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import trio

from omnitrio.messages import StreamMessage
from omnitrio.serve.audio import REALTIME_RATE
from omnitrio.serve.context import ServedPipeline
from omnitrio.serve.realtime.session_config import TurnDetection
from omnitrio.serve.realtime.turn import (
    MS,
    Heard,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TurnJudged,
    VadEvent,
)

PAUSE_LEAD_MS = 400  # start preparing the answer when this much silence is still needed to end the turn
CLOSE_TIMEOUT = 2.0
logger = logging.getLogger(__name__)


def vad_event(chunk: dict[str, Any]) -> VadEvent | None:
    """The typed event of one ``vad`` stream chunk of the ASR stage (None: a kind this server ignores)."""
    match chunk:
        case {"type": "speech_started", "audio_start_ms": int(ms)}:
            return SpeechStarted(ms)
        case {"type": "speech_stopped", "audio_end_ms": int(ms)}:
            return SpeechStopped(ms)
        case {"type": "speech_paused", "audio_ms": int(ms)}:
            return SpeechPaused(ms, chunk.get("transcript"), chunk.get("unfinished"))
        case {"type": "speech_resumed", "audio_ms": int(ms)}:
            return SpeechResumed(ms)
        case {"type": "turn_judged", "audio_ms": int(ms), "turn_complete": bool(complete)}:
            return TurnJudged(ms, complete, dict(chunk.get("decision_ms") or {}))
    return None


def session_config(detection: TurnDetection) -> dict[str, Any]:
    """The ``open`` command's config: 24 kHz PCM16 in, VAD with a speculation point, no partials.

    ``semantic_vad`` is judged at the pause the stage tunes its turn model for; the ``speech_paused``
    event before it carries the transcript of the turn so far, which the connection reuses for the
    answer it prepares.
    """
    if detection.type == "semantic_vad":
        semantic = {"type": "semantic_vad", "eagerness": detection.eagerness}
        return {"sample_rate": REALTIME_RATE, "turn_detection": semantic, "partial_every_ms": None}
    vad = {
        "type": "server_vad",
        "threshold": detection.threshold,
        "prefix_padding_ms": detection.prefix_padding_ms,
        "silence_duration_ms": detection.silence_duration_ms,
        "pause_ms": max(0, detection.silence_duration_ms - PAUSE_LEAD_MS),
    }
    return {"sample_rate": REALTIME_RATE, "turn_detection": vad, "partial_every_ms": None}


class TurnListener:
    """Streams a session's input audio to the pipeline's ASR session and reports its VAD events."""

    def __init__(
        self,
        pipeline: ServedPipeline,
        session_id: str,
        detection: TurnDetection,
        events: trio.MemorySendChannel[VadEvent],
        *,
        timeout: float | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.session_id = session_id
        self.detection = detection
        self.events = events
        self.timeout = timeout
        self._audio_in, self._audio = trio.open_memory_channel[bytes](math.inf)
        self._commands = 0
        self.heard = 0  # samples (24 kHz) whose append the stage has answered, events included

    def feed(self, pcm16: bytes) -> None:
        """Queue appended audio (never blocks; the caller bounds the session's total input)."""
        self._audio_in.send_nowait(pcm16)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open the ASR session, then forward audio until cancelled; the session is aborted on any exit."""
        with self.events:
            await self._run(task_status)

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        try:
            await self._command("open", config=session_config(self.detection))
            task_status.started()
            async for first in self._audio:
                chunk = first + self._drain()
                await self._command("append", chunk=chunk)
                self.heard += len(chunk) // 2
                await self.events.send(Heard(self.heard // MS))
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
                await self._quietly("abort")

    def _drain(self) -> bytes:
        parts = []
        while True:
            try:
                parts.append(self._audio.receive_nowait())
            except trio.WouldBlock:
                return b"".join(parts)

    async def _command(self, op: str, **fields: Any) -> None:
        self._commands += 1
        request_id = f"{self.session_id}-{op}-{self._commands}"
        inputs = {"task": "asr_session", "command": {"op": op, "session_id": self.session_id, **fields}}
        async with self.pipeline.stream(request_id, inputs, timeout=self.timeout) as messages:
            async for message in messages:
                if isinstance(message, StreamMessage) and message.modality == "vad":
                    self._log_judgement(message.chunk)
                    event = vad_event(message.chunk)
                    if event is not None:
                        await self.events.send(event)

    def _log_judgement(self, event: dict[str, Any]) -> None:
        if event.get("type") == "turn_judged":
            logger.debug(
                "%s: pause at %s ms judged %s: heard %r, probability %s, unfinished %s, decision_ms %s",
                self.session_id,
                event.get("audio_ms"),
                "complete" if event["turn_complete"] else "incomplete",
                event.get("transcript"),
                event.get("probability"),
                event.get("unfinished"),
                event.get("decision_ms"),
            )

    async def _quietly(self, op: str) -> None:
        try:
            await self._command(op)
        except Exception:
            return  # the session is gone already (never opened, or the pipeline is closing)
