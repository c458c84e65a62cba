"""OpenAI request bodies: decode, type-check and value-check them, or say exactly what is wrong.

Decoding is two steps with two statuses. msgspec checks the JSON and the *types* (a wrong type or
a missing field is a 400 whose ``param`` is the field path, e.g. ``messages[0].role``); then each
``check_*`` function checks the *values* this server supports (a 422 naming the field). Unknown
fields are ignored, as OpenAI-compatible servers do, so newer clients keep working.

Limits a client can rely on: a speech ``input`` is at most 4,096 characters and must hold something
to speak (a letter or a digit); a chat message's text is at most 65,536 characters; ``voice`` is
``"default"`` or one of OpenAI's voice names (:data:`OPENAI_VOICES`), which all select the
pipeline's one voice; anything else is a 400 that lists them.
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
MAX_MESSAGE_CHARS = 65_536
OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse", "marin", "cedar"
)  # fmt: skip
VOICES = ("default", *OPENAI_VOICES)


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
    tools: list[Any] | None = None
    tool_choice: Any = None


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
    except RecursionError:
        raise bad_request("the request body is nested too deeply", code="invalid_json") from None


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
    _check_contents(request.messages)
    if request.audio is not None:
        check_voice(request.audio.voice, "audio.voice")
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


def _check_contents(messages: list[dict[str, Any]]) -> None:
    """Each message's text within :data:`MAX_MESSAGE_CHARS`; the last user message has something to answer."""
    last_user: int | None = None
    for i, message in enumerate(messages):
        text = "".join(_texts(message.get("content")))
        if len(text) > MAX_MESSAGE_CHARS:
            raise bad_request(
                f"messages[{i}].content is {len(text)} characters of text; the limit is {MAX_MESSAGE_CHARS}",
                f"messages[{i}].content",
                code="string_above_max_length",
            )
        if message.get("role") == "user":
            last_user = i
    if last_user is None:
        raise bad_request("'messages' has no message with role 'user': there is nothing to answer", "messages")
    content = messages[last_user].get("content")
    if not "".join(_texts(content)).strip() and not _media_parts(content):
        raise bad_request(
            f"messages[{last_user}].content is empty: the last user message has no text or audio to answer",
            f"messages[{last_user}].content",
        )


def _texts(content: Any) -> list[str]:
    match content:
        case str():
            return [content]
        case list():
            return [str(part.get("text") or "") for part in content if isinstance(part, dict)]
    return []


def _media_parts(content: Any) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        return []
    return [part for part in content if isinstance(part, dict) and part.get("type") != "text"]


def check_voice(voice: str, param: str) -> None:
    """400 unless ``voice`` is one this server accepts (:data:`VOICES`)."""
    if voice not in VOICES:
        raise bad_request(
            f"{param} {voice!r} is not a voice of this server; use one of {', '.join(VOICES)} "
            "(each selects the pipeline's voice)",
            param,
            code="invalid_voice",
        )


def check_speech(request: SpeechRequest) -> None:
    """Value checks for a speech request; an input with nothing to speak ("...", "?!") is a 400."""
    if not request.input.strip():
        raise invalid_value("'input' must not be empty", "input")
    if len(request.input) > MAX_SPEECH_INPUT:
        raise invalid_value(f"'input' is {len(request.input)} characters; the limit is {MAX_SPEECH_INPUT}", "input")
    if not any(char.isalnum() for char in request.input):
        raise bad_request(
            f"'input' {request.input[:40]!r} has nothing to speak: it needs at least one letter or digit",
            "input",
            code="nothing_to_speak",
        )
    check_voice(request.voice, "voice")
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
