"""OpenAI request bodies: decode, type-check and value-check them, or say exactly what is wrong.

Decoding is two steps, both answered 400 as OpenAI answers them. msgspec checks the JSON and the
*types* (a wrong type or a missing field: ``param`` is the field path, e.g. ``messages[0].role``);
then each ``check_*`` function checks the *values* this server supports (``code`` ``invalid_value``,
``param`` naming the field). A top-level field the route does not know is a 400 naming it (a
parameter silently ignored is a wrong answer), except the fields OpenAI documents as optional hints
a server may disregard (:data:`CHAT_HINTS`, :data:`SPEECH_HINTS`): those are accepted and ignored.

Limits a client can rely on: a speech ``input`` is at most 4,096 characters and must hold something
to speak (a letter or a digit); a chat message's text is at most 65,536 characters; ``voice`` is
``"default"`` or one of OpenAI's voice names (:data:`OPENAI_VOICES`), which all select the
pipeline's one voice; anything else is a 400 that lists them. A chat request to a pipeline whose
stages know their voices (``stage_voices`` of :func:`check_chat`) may name any voice: the pipeline
checks it.
"""

from __future__ import annotations

import re
from typing import Any, Final, TypeVar

import msgspec

from omnitrio.serve.api_errors import bad_request, invalid_value

T = TypeVar("T")

_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<field>[^`]*)`")
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
CHAT_MODALITIES = frozenset({"text", "audio"})
CHAT_AUDIO_FORMATS = frozenset({"wav", "pcm16"})
SPEECH_FORMATS = frozenset({"mp3", "opus", "aac", "flac", "wav", "pcm"})
SPEECH_STREAM_FORMATS = frozenset({"audio", "sse"})
TRANSCRIPTION_FORMATS = frozenset({"json", "text", "verbose_json"})
MAX_SPEECH_INPUT = 4096
MAX_MESSAGE_CHARS = 65_536
OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse", "marin", "cedar"
)  # fmt: skip
VOICES = ("default", *OPENAI_VOICES)


CHAT_HINTS: Final = (
    "user",
    "metadata",
    "store",
    "service_tier",
    "parallel_tool_calls",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "reasoning_effort",
    "verbosity",
    "prediction",
    "web_search_options",
    "function_call",  # the deprecated forms of tool_choice / tools: read as absent
    "functions",
)
"""Chat fields accepted and ignored: hints about storage, billing, caching and routing, which change no
answer this server gives. ``logprobs`` (only ``false``) and ``top_logprobs`` (only 0) are checked."""
SPEECH_HINTS: Final = ("user",)


class ChatAudio(msgspec.Struct, forbid_unknown_fields=True):
    voice: str = "default"
    format: str = "wav"


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class ChatRequest(msgspec.Struct, forbid_unknown_fields=True):
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
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None  # the pipeline decides what it can do with them
    tool_choice: Any = None
    # CHAT_HINTS, accepted and ignored:
    user: Any = None
    metadata: Any = None
    store: Any = None
    service_tier: Any = None
    parallel_tool_calls: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    safety_identifier: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    prediction: Any = None
    web_search_options: Any = None
    function_call: Any = None
    functions: Any = None


class SpeechRequest(msgspec.Struct, forbid_unknown_fields=True):
    input: str
    model: str | None = None
    voice: str = "default"
    response_format: str = "mp3"
    stream_format: str = "audio"
    speed: float = 1.0
    instructions: str | None = None
    user: Any = None  # SPEECH_HINTS


def decode_json(body: bytes, kind: type[T]) -> T:
    """``body`` as ``kind``; a 400 :class:`ApiError` naming the field when it does not fit."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        message = str(exc)
        match = _PATH.search(message)
        param = match["path"].lstrip(".") if match else None
        unknown = _UNKNOWN.match(message)
        if unknown is not None:
            field = ".".join(part for part in (param, unknown["field"]) if part)
            raise bad_request(
                f"unrecognized request argument supplied: {field}", param=field, code="unknown_parameter"
            ) from None
        raise bad_request(f"invalid request body: {message}", param=param) from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply", code="invalid_json") from None


def check_chat(request: ChatRequest, *, stage_voices: bool = False) -> list[str]:
    """Value checks for a chat request; returns the output modalities (default ``["text"]``).

    ``stage_voices``: ``audio.voice`` is left for the pipeline's stages to check (any name passes here)."""
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
    if request.audio is not None and not stage_voices:
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
    if request.seed is not None and not -(2**63) <= request.seed < 2**64:
        raise invalid_value(f"seed must be a 64-bit integer, got {request.seed}", "seed")
    _check_range(request.frequency_penalty, "frequency_penalty", -2.0, 2.0)
    _check_range(request.presence_penalty, "presence_penalty", -2.0, 2.0)
    logit_bias(request)
    if request.logprobs:
        raise invalid_value("logprobs are not supported by this server; leave logprobs false", "logprobs")
    if request.top_logprobs:
        raise invalid_value("top_logprobs are not supported by this server; leave it 0", "top_logprobs")
    fmt = request.response_format
    if fmt is not None and fmt.get("type", "text") != "text":
        raise invalid_value(
            f"response_format {fmt.get('type')!r} is not supported; only {{'type': 'text'}} is", "response_format"
        )
    if isinstance(request.stop, list) and len(request.stop) > 4:
        raise invalid_value(f"stop may hold at most 4 sequences, got {len(request.stop)}", "stop")
    for name in ("max_tokens", "max_completion_tokens"):
        value = getattr(request, name)
        if value is not None and value < 1:
            raise invalid_value(f"{name} must be at least 1, got {value}", name)
    return modalities


def logit_bias(request: ChatRequest) -> dict[int, float] | None:
    """OpenAI's ``{"token id": bias}`` with its keys as ints; 400 for a key that is not a token id
    or a bias outside -100..100."""
    if request.logit_bias is None:
        return None
    biases: dict[int, float] = {}
    for key, bias in request.logit_bias.items():
        if not key.strip().isdigit():
            raise invalid_value(f"logit_bias key {key!r} is not a token id (a non-negative integer)", "logit_bias")
        _check_range(bias, f"logit_bias[{key!r}]", -100.0, 100.0, param="logit_bias")
        biases[int(key)] = float(bias)
    return biases


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


def _check_range(value: float | None, name: str, low: float, high: float, *, param: str | None = None) -> None:
    if value is not None and not low <= value <= high:
        raise invalid_value(f"{name} must be between {low:g} and {high:g}, got {value:g}", param or name)


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
