"""OpenAI request bodies: decode, type-check and value-check them, or say exactly what is wrong.

Decoding is two steps with two statuses. msgspec checks the JSON and the *types* (a wrong type or
a missing field is a 400 whose ``param`` is the field path, e.g. ``messages[0].role``); then each
``check_*`` function checks the *values* this server supports (a 422 naming the field). Unknown
fields are ignored, as OpenAI-compatible servers do, so newer clients keep working.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from omnitrio.serve.api_errors import ApiError, bad_request, invalid_value

T = TypeVar("T")

_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
CHAT_MODALITIES = frozenset({"text", "audio"})
CHAT_AUDIO_FORMATS = frozenset({"wav", "pcm16"})
SPEECH_FORMATS = frozenset({"wav", "pcm"})
SPEECH_STREAM_FORMATS = frozenset({"audio", "sse"})
TRANSCRIPTION_FORMATS = frozenset({"json", "text", "verbose_json"})
MAX_SPEECH_INPUT = 4096


class ChatAudio(msgspec.Struct):
    voice: str = "default"
    format: str = "wav"


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class ChatRequest(msgspec.Struct):
    messages: list[dict[str, Any]]
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    modalities: list[str] | None = None
    audio: ChatAudio | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None


class SpeechRequest(msgspec.Struct):
    input: str
    model: str | None = None
    voice: str = "default"
    response_format: str = "wav"
    stream_format: str = "audio"
    speed: float = 1.0
    instructions: str | None = None


def decode_json(body: bytes, kind: type[T]) -> T:
    """``body`` as ``kind``; a 400 :class:`ApiError` naming the field when it does not fit."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        message = str(exc)
        match = _PATH.search(message)
        param = match["path"].lstrip(".") if match else None
        raise bad_request(f"invalid request body: {message}", param=param) from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}", code="invalid_json") from None


def check_chat(request: ChatRequest) -> list[str]:
    """Value checks for a chat request; returns the output modalities (default ``["text"]``)."""
    if not request.messages:
        raise invalid_value("'messages' must contain at least one message", "messages")
    for i, message in enumerate(request.messages):
        role = message.get("role")
        if not isinstance(role, str):
            raise bad_request(f"messages[{i}] needs a string 'role'", f"messages[{i}].role")
        if role not in _ROLES:
            raise invalid_value(f"messages[{i}].role {role!r} is not one of {sorted(_ROLES)}", f"messages[{i}].role")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise bad_request(f"messages[{i}].content must be a string or a list of parts", f"messages[{i}].content")
    modalities = request.modalities or ["text"]
    for modality in modalities:
        if modality not in CHAT_MODALITIES:
            raise invalid_value(f"modality {modality!r} is not supported; use 'text' and/or 'audio'", "modalities")
    if request.audio is not None and request.audio.format not in CHAT_AUDIO_FORMATS:
        raise invalid_value(
            f"audio.format {request.audio.format!r} is not supported; use one of {sorted(CHAT_AUDIO_FORMATS)}",
            "audio.format",
        )
    if request.n not in (None, 1):
        raise invalid_value("only n=1 is supported", "n")
    _check_range(request.temperature, "temperature", 0.0, 2.0)
    _check_range(request.top_p, "top_p", 0.0, 1.0)
    if isinstance(request.stop, list) and len(request.stop) > 4:
        raise invalid_value(f"stop may hold at most 4 sequences, got {len(request.stop)}", "stop")
    for name in ("max_tokens", "max_completion_tokens"):
        value = getattr(request, name)
        if value is not None and value < 1:
            raise invalid_value(f"{name} must be at least 1, got {value}", name)
    return modalities


def check_speech(request: SpeechRequest) -> None:
    """Value checks for a speech request."""
    if not request.input.strip():
        raise invalid_value("'input' must not be empty", "input")
    if len(request.input) > MAX_SPEECH_INPUT:
        raise invalid_value(f"'input' is {len(request.input)} characters; the limit is {MAX_SPEECH_INPUT}", "input")
    if request.response_format not in SPEECH_FORMATS:
        raise invalid_value(
            f"response_format {request.response_format!r} is not supported; use one of {sorted(SPEECH_FORMATS)}",
            "response_format",
        )
    if request.stream_format not in SPEECH_STREAM_FORMATS:
        raise invalid_value(
            f"stream_format {request.stream_format!r} is not supported; use 'audio' or 'sse'", "stream_format"
        )
    _check_range(request.speed, "speed", 0.25, 4.0)


def check_model(model: str | None, served: str) -> None:
    """404 unless ``model`` is absent or names the served model."""
    if model is not None and model != served:
        raise ApiError(
            404, f"model {model!r} not found; this server serves {served!r}", param="model", code="model_not_found"
        )


def _check_range(value: float | None, name: str, low: float, high: float) -> None:
    if value is not None and not low <= value <= high:
        raise invalid_value(f"{name} must be between {low:g} and {high:g}, got {value:g}", name)


def form_bool(value: str | None, name: str) -> bool:
    """A multipart form boolean ('true'/'false', any case); 400 for anything else."""
    match (value or "false").strip().lower():
        case "true" | "1":
            return True
        case "false" | "0" | "":
            return False
        case other:
            raise bad_request(f"{name} must be 'true' or 'false', got {other!r}", name)


def form_float(value: str | None, name: str) -> float | None:
    """A multipart form number, or None when absent; 400 when it is not a number."""
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        raise bad_request(f"{name} must be a number, got {value!r}", name) from None
