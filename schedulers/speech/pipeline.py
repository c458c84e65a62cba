"""The glue of the default speech pipeline (``configs/speech.toml``): routing by task and two small stages.

One graph serves every route of the server (see ``omnitrio.serve`` for the input shapes)::

    ingress ─┬─ transcription ──▶ asr ──────────────▶ text_out
             ├─ asr_session ────▶ stream_asr                          (open / append / close / abort)
             ├─ chat ───────────▶ responder ─┬─ audio asked ─▶ tts
             │                               └─ text only ──▶ text_out
             ├─ chat with input_audio ─▶ asr ─▶ responder ─▶ (as chat)
             └─ speech ─────────▶ tts

``terminal_stages_fn`` (:func:`terminal_stages`) names, from the inputs alone, the one terminal
stage that completes each request, so the coordinator never waits for a branch that was not taken.
``ingress`` also moves an ``asr_session`` command into ``request.metadata["session"]`` (where the
:class:`~schedulers.session.SessionScheduler` reads it) and asks streaming stages to stream
(``params["stream"]``) for every task whose audio is played as it comes.

The responder is whatever ``factory_path`` the config names; it receives chat inputs
(``{"task": "chat", "messages": ...}``: the raw ones, or, for a chat whose
messages carry audio, the ones ASR made by putting each clip's transcript in its place), and must
return ``payload.data = {"text": answer}``. An empty answer is spoken as silence (no audio).  A
responder that writes its answer bit by bit may stream it ahead of that result, as ``{"text": ...}``
chunks targeted at ``tts`` (whole sentences) or ``text_out`` (deltas): both accept text before the
payload.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from omnitrio.contract import OutgoingMessage, StagePayload, StreamItem
from schedulers.graph.tasks import admit_session_command, task_of, wants_audio
from schedulers.simple import SimpleScheduler
from schedulers.speech.requests import SpeechRequest, has_input_audio, raw_inputs, speech_request
from schedulers.speech.tts import shared_synthesizer
from schedulers.speech.tts_scheduler import SentenceStreamingTTSScheduler
from schedulers.streaming import StreamingSimpleScheduler

_ENTRY = {
    "transcription": "asr",
    "asr_session": "stream_asr",
    "chat": "responder",
    "speech": "tts",
}
_STREAMED = frozenset({"chat", "speech"})
ANSWER_FIELDS = ("finish_reason", "usage", "tool_calls")  # what a responder's result says beside its text
TRANSCRIPT_FIELDS = ("language", "segments", "words")  # what a timed transcript says beside its text
log = logging.getLogger("schedulers.speech")


def terminal_stages(request_id: str, inputs: Any) -> list[str]:
    """The terminal stage whose result completes the request (``terminal_stages_fn``)."""
    match task_of(inputs):
        case "asr_session":
            return ["stream_asr"]
        case "transcription":
            return ["text_out"]
        case _:
            return ["tts"] if wants_audio(inputs) else ["text_out"]


def route_ingress(request_id: str, payload: StagePayload) -> str:
    """The task's first stage; a chat with ``input_audio`` parts is transcribed first."""
    inputs = payload.request.inputs
    return "asr" if has_input_audio(inputs) else _ENTRY[task_of(inputs)]


def route_asr(request_id: str, payload: StagePayload) -> str:
    """A transcription is the answer; a transcribed chat goes to the responder."""
    return "text_out" if task_of(payload.request.inputs) == "transcription" else "responder"


def route_responder(request_id: str, payload: StagePayload) -> str:
    return "tts" if wants_audio(payload.request.inputs) else "text_out"


def _admit(payload: StagePayload) -> StagePayload:
    if task_of(payload.request.inputs) in _STREAMED:
        payload.request.params.setdefault("stream", True)
    return admit_session_command(payload)


def create_ingress_stage() -> SimpleScheduler:
    """Checks the task and prepares the request for its branch (see the module docstring)."""
    return SimpleScheduler(_admit)


def _text_out(payload: StagePayload) -> StagePayload:
    data = raw_inputs(payload)
    text = data.get("text", "") if isinstance(data, dict) else str(data)
    kept = {key: data[key] for key in (*ANSWER_FIELDS, *TRANSCRIPT_FIELDS) if isinstance(data, dict) and key in data}
    payload.data = {"text": text, **kept}
    return payload


class _TextOut(StreamingSimpleScheduler):
    """Passes an upstream stage's streamed ``{"text": delta}`` chunks on to the caller as they come."""

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        text = item.data.get("text") if isinstance(item.data, dict) else None
        if not isinstance(text, str):
            raise ValueError("text_out stream chunks must be {'text': str}")
        return [OutgoingMessage(request_id, "stream", text, metadata={"modality": "text"})]


def create_text_output_stage() -> SimpleScheduler:
    """The terminal of text answers (transcripts, text-only chat): ``payload.data = {"text": ...}`` with the
    responder's ``finish_reason``, ``usage`` and ``tool_calls``, and a timed transcript's ``language``,
    ``segments`` and ``words``, when they were given; text streamed to it ahead of the payload goes on to
    the caller at once."""
    return _TextOut(_text_out)


def _lenient_speech_request(payload: StagePayload) -> SpeechRequest:
    """An empty answer (a spoken chat clip that was noise, a cough) is silence, not an error."""
    data = raw_inputs(payload)
    if (
        task_of(payload.request.inputs) == "chat"
        and isinstance(data, dict)
        and "task" not in data
        and not str(data.get("text", "")).strip()
    ):
        return SpeechRequest(text="")
    return speech_request(payload)


def create_speech_stage(
    *, backend: str = "auto", output_sample_rate: int = 24_000, threads: int = 2
) -> SentenceStreamingTTSScheduler:
    """Streaming TTS (sentence by sentence) for this pipeline; empty answers are silent."""
    options: dict[str, Any] = {"threads": threads} if backend in ("auto", "piper") else {}
    started = time.perf_counter()
    log.info("loading speech synthesis (%s) ...", backend)
    synthesizer = shared_synthesizer(backend, **options)  # type: ignore[arg-type]
    log.info("speech synthesis %s ready in %.1f s", synthesizer.name, time.perf_counter() - started)
    return SentenceStreamingTTSScheduler(
        synthesizer, output_sample_rate=output_sample_rate, parse=_lenient_speech_request
    )
