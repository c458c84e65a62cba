"""What the speech stages read from a payload, validated with errors that name the field.

The HTTP layer puts the request in ``payload.data["raw_inputs"]`` at the entry stage::

    {"task": "speech", "input": str, "voice": str, "speed": float}
    {"task": "transcription", "audio": float32 mono 16 kHz, "language": str | None, "quick": bool,
     "timestamps": None | "segment" | "word"}
    {"task": "chat", "messages": [...], "modalities": [...]}   (parts may be input_audio: see below)

Downstream of another stage the text arrives as ``payload.data["text"]`` instead; it is spoken at
the request's ``speed`` (a chat request may carry one) unless the data names its own. A
chat whose messages carry ``input_audio`` parts goes through ASR first, which hands on the same chat
inputs with each clip replaced by a text part holding its transcript (:func:`transcribed_chat`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from omnitrio.contract import InvalidRequest, StagePayload
from schedulers.media import decode_audio
from schedulers.speech.audio import ASR_SAMPLE_RATE, FloatAudio, as_float_audio, resample
from schedulers.speech.tts import check_speed


@attrs.frozen
class SpeechRequest:
    text: str
    speed: float = 1.0
    voice: str | None = None


@attrs.frozen
class TranscriptionRequest:
    audio: FloatAudio  # mono float32 at 16 kHz
    language: str | None = None
    quick: bool = False  # a realtime turn: someone is waiting for the answer
    timestamps: str | None = None  # "segment" or "word": a timed transcript is asked for


def raw_inputs(payload: StagePayload) -> Any:
    """``payload.data["raw_inputs"]`` when present, else ``payload.data`` itself."""
    data = payload.data
    if isinstance(data, dict) and "raw_inputs" in data:
        return data["raw_inputs"]
    return data


def speech_request(payload: StagePayload) -> SpeechRequest:
    """Text to speak: raw ``speech`` inputs, an upstream ``{"text": ...}``, or a plain string."""
    inputs = raw_inputs(payload)
    text: Any
    speed: Any
    voice: Any
    match inputs:
        case str():
            text, speed, voice = inputs, 1.0, None
        case {"task": "speech", **fields}:
            text, speed, voice = fields.get("input"), fields.get("speed", 1.0), fields.get("voice")
        case {"text": text_value, **fields}:
            asked = payload.request.inputs if isinstance(payload.request.inputs, dict) else {}
            speed = fields.get("speed", asked.get("speed", 1.0))  # an upstream answer, spoken as the request asks
            text, voice = text_value, fields.get("voice")
        case _:
            raise ValueError(f"speech stage needs a 'speech' task or {{'text': ...}}, got {_describe(inputs)}")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"input: text to speak must be a non-empty string, got {text!r}")
    if voice is not None and not isinstance(voice, str):
        raise ValueError(f"voice must be a string, got {voice!r}")
    return SpeechRequest(text=text, speed=check_speed(speed), voice=voice)


def transcription_request(payload: StagePayload) -> TranscriptionRequest:
    """Audio to transcribe: ``audio`` (float32 16 kHz, or any rate with ``sample_rate``) and ``language``."""
    inputs = raw_inputs(payload)
    if not isinstance(inputs, dict) or "audio" not in inputs:
        raise ValueError(f"transcription needs {{'audio': float32 16 kHz samples}}, got {_describe(inputs)}")
    audio = as_float_audio(inputs["audio"], name="audio")
    rate = inputs.get("sample_rate", ASR_SAMPLE_RATE)
    if rate != ASR_SAMPLE_RATE:
        audio = resample(audio, rate, ASR_SAMPLE_RATE)
    language = inputs.get("language")
    if language is not None and not isinstance(language, str):
        raise ValueError(f"language must be a string or null, got {language!r}")
    quick = inputs.get("quick") is True  # someone waits on it (a realtime turn)
    timestamps = inputs.get("timestamps")
    if timestamps not in (None, "segment", "word"):
        raise InvalidRequest(f"timestamps must be 'segment', 'word' or null, got {timestamps!r}", param="timestamps")
    return TranscriptionRequest(audio=audio, language=language or None, quick=quick, timestamps=timestamps)


def has_input_audio(inputs: Any) -> bool:
    """Whether chat inputs carry an ``input_audio`` content part in any message."""
    if not isinstance(inputs, dict) or not isinstance(inputs.get("messages"), list):
        return False
    return any(
        isinstance(part, dict) and part.get("type") == "input_audio"
        for message in inputs["messages"]
        if isinstance(message, dict) and isinstance(message.get("content"), list)
        for part in message["content"]
    )


def transcribed_chat(inputs: dict[str, Any], transcribe: Callable[[FloatAudio], str]) -> dict[str, Any]:
    """``inputs`` with every ``input_audio`` part replaced by ``{"type": "text", "text": transcript}``.

    A part is a base64 ``wav`` or ``pcm16`` clip (OpenAI's shape, see :mod:`schedulers.media`),
    transcribed at 16 kHz; a clip that does not decode is a ``ValueError`` naming the part.
    """
    messages = []
    for i, message in enumerate(inputs["messages"]):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            parts = [_transcribed(part, f"messages[{i}].content[{j}]", transcribe) for j, part in enumerate(content)]
            message = {**message, "content": parts}
        messages.append(message)
    return {**inputs, "messages": messages}


def _transcribed(part: Any, where: str, transcribe: Callable[[FloatAudio], str]) -> Any:
    match part:
        case {"type": "input_audio", "input_audio": dict(spec)}:
            return {"type": "text", "text": transcribe(decode_audio(spec, f"{where}.input_audio")).strip()}
    return part


def user_text(payload: StagePayload) -> str:
    """The text a responder answers: an upstream transcript, a chat's last user message, or speech input."""
    inputs = raw_inputs(payload)
    match inputs:
        case str():
            return inputs
        case {"task": "chat", "messages": list(messages)}:
            return _last_user_message(messages)
        case {"task": "speech", "input": str(text)}:
            return text
        case {"text": str(text)}:
            return text
    raise ValueError(f"responder needs a transcript, chat messages or text, got {_describe(inputs)}")


def _last_user_message(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return content_text(message.get("content"))
    raise ValueError("messages: no message with role 'user'")


def content_text(content: Any) -> str:
    """OpenAI content: a string, or parts of which the text parts count."""
    match content:
        case str():
            return content
        case list():
            texts = [part.get("text", "") for part in content if isinstance(part, dict) and "text" in part]
            return " ".join(text for text in texts if text)
    raise ValueError(f"messages: user content must be a string or a list of parts, got {type(content).__name__}")


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(str, value))}"
    return type(value).__name__
