"""A realtime session's configuration: its defaults, ``session.update`` checked and applied, its readers.

The session is a plain dict in OpenAI's GA shape (``audio.input/output.format``, ``voice``,
``turn_detection``), with the beta spellings (top-level ``turn_detection``, ``voice``,
``input_audio_format``) accepted on update and mirrored, so clients of either API read back
what they set. Audio is PCM16 mono at 24 kHz (``{"type": "audio/pcm", "rate": 24000}``, the
default) or G.711 at 8 kHz for telephony (``{"type": "audio/pcmu"}`` µ-law, ``{"type": "audio/pcma"}``
A-law; beta ``g711_ulaw`` / ``g711_alaw``), chosen for input and output separately
(:func:`audio_format`); any other format is refused with an ``error`` event naming the field.

``turn_detection`` is ``{"type": "server_vad", "threshold", "prefix_padding_ms", "silence_duration_ms",
"create_response", "interrupt_response", "idle_timeout_ms"}`` (the default, with OpenAI's default
values), ``{"type": "semantic_vad", "eagerness": "low" | "medium" | "high" | "auto", "create_response",
"interrupt_response"}`` (the turn model judges each pause; see ``schedulers.speech.turn_end``) or
``null`` (the client commits turns and asks for responses itself); :func:`turn_detection` reads it
with every field filled in. Either VAD object may carry the omnitrio extension
``false_interruptions``: ``{"decide_ms", "backchannels", "max_words"}`` (each optional; see
:class:`~omnitrio.serve.realtime.backchannel.FalseInterruptions`): speech over a response pauses it and a
backchannel resumes it (:mod:`~omnitrio.serve.realtime.interruption`); without it, or ``null`` (the
default), user speech cancels a response at once, as OpenAI's does.

``idle_timeout_ms`` is null (the default) or 5000–30000, as OpenAI allows it.

``omnitrio_events`` (an extension, absent by default): true sends omnitrio's own ``omnitrio.*``
events too (:mod:`.protocol`).

A field sent as ``null`` in an update is not given (the session keeps its value), as clients that
serialise every optional field send it, except where null is a value of its own: ``turn_detection``
(manual turns), ``transcription`` and ``noise_reduction`` (off), ``tracing`` and ``prompt`` (none).

The rest of OpenAI's GA session is checked here too: ``output_modalities`` (``["audio"]`` or
``["text"]``), ``instructions``, ``max_output_tokens`` (1–4096 or ``"inf"``), ``audio.output.voice`` and
``.speed`` (0.25–1.5), ``audio.input.transcription`` (an object or null); a value that cannot be served
is an :class:`~.protocol.EventError` naming its ``param``. :mod:`.protocol` renders a session for a GA
or a beta client.

Voices come from the pipeline. A pipeline whose stages know their voices (``stage_voices`` of
:func:`updated_session`, from ``PipelineConfig.stage_voices``: a checkpoint's speakers) takes any
non-empty name as given and reads it back; the pipeline answers one it does not have with an error.
Any other pipeline has one voice: ``voice`` may be ``"default"`` or any of OpenAI's voice names (the
same list the HTTP endpoints take); each plays that one voice, so the session reads back
``"default"``: what plays, not the name asked for.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import attrs

from omnitrio.serve.audio import REALTIME_RATE
from omnitrio.serve.openai_types import VOICES
from omnitrio.serve.realtime.backchannel import FalseInterruptions
from omnitrio.serve.realtime.protocol import BETA_FORMATS, EventError

_PCM = {"type": "audio/pcm", "rate": REALTIME_RATE}
_FIXED = frozenset({"id", "object", "model"})
PLAYED_VOICE = "default"  # a pipeline of one voice: every voice name a client may send selects it
NULL_IS_A_VALUE = frozenset(
    {"turn_detection", "transcription", "noise_reduction", "tracing", "prompt"}
    | {"input_audio_transcription", "input_audio_noise_reduction"}  # the beta spellings
)
"""Session fields (at the top or in ``audio.input/output``) where null says "off"; elsewhere null is "not given"."""


SERVER_VAD: dict[str, Any] = {
    "type": "server_vad",
    "threshold": 0.5,
    "prefix_padding_ms": 300,
    "silence_duration_ms": 500,
    "create_response": True,
    "interrupt_response": True,
    "idle_timeout_ms": None,
}
EAGERNESS = ("low", "medium", "high", "auto")
MAX_OUTPUT_TOKENS = 4096
MIN_SPEED, MAX_SPEED = 0.25, 1.5
MIN_IDLE_TIMEOUT_MS, MAX_IDLE_TIMEOUT_MS = 5_000, 30_000


@attrs.frozen
class TurnDetection:
    """Server VAD settings with every field filled in (OpenAI's defaults for those not given)."""

    threshold: float
    prefix_padding_ms: int
    silence_duration_ms: int
    create_response: bool
    interrupt_response: bool
    type: str = "server_vad"
    eagerness: str = "auto"  # semantic_vad only
    false_interruptions: FalseInterruptions | None = None  # None: speech cancels a response at once
    idle_timeout_ms: int | None = None


def turn_detection(session: Mapping[str, Any]) -> TurnDetection | None:
    """The session's server VAD settings, or None when the client commits turns itself."""
    value = session.get("turn_detection")
    if value is None:
        return None
    fields = {**SERVER_VAD, **value}
    interruptions = fields.get("false_interruptions")
    return TurnDetection(
        threshold=fields["threshold"],
        prefix_padding_ms=fields["prefix_padding_ms"],
        silence_duration_ms=fields["silence_duration_ms"],
        create_response=fields["create_response"],
        interrupt_response=fields["interrupt_response"],
        type=fields["type"],
        eagerness=fields.get("eagerness", "auto"),
        false_interruptions=None if interruptions is None else FalseInterruptions.from_settings(interruptions),
        idle_timeout_ms=fields["idle_timeout_ms"],
    )


def default_session(session_id: str, model: str) -> dict[str, Any]:
    return {
        "id": session_id,
        "object": "realtime.session",
        "type": "realtime",
        "model": model,
        "output_modalities": ["audio"],
        "instructions": "",
        "voice": PLAYED_VOICE,
        "max_output_tokens": "inf",
        "tools": [],
        "tool_choice": "auto",
        "turn_detection": dict(SERVER_VAD),
        "audio": {
            "input": {
                "format": dict(_PCM),
                "transcription": None,
                "noise_reduction": None,
                "turn_detection": dict(SERVER_VAD),
            },
            "output": {"format": dict(_PCM), "voice": PLAYED_VOICE, "speed": 1.0},
        },
    }


def max_tokens(session: Mapping[str, Any]) -> int | None:
    """The session's ``max_output_tokens`` as the responder takes it (None: no limit)."""
    value = session.get("max_output_tokens")
    return value if isinstance(value, int) else None


def wants_audio(session: Mapping[str, Any]) -> bool:
    return "audio" in session.get("output_modalities", ["audio"])


def transcribes_input(session: Mapping[str, Any]) -> bool:
    """Whether the client asked for ``conversation.item.input_audio_transcription.*`` events."""
    return session["audio"]["input"].get("transcription") is not None


def updated_session(current: Mapping[str, Any], update: Any, *, stage_voices: bool = False) -> dict[str, Any]:
    """``current`` with a ``session.update``'s ``session`` applied; ``current`` is not changed.
    ``stage_voices``: the pipeline's stages know their voices (``PipelineConfig.stage_voices``): any
    voice name is kept as given, for the pipeline to choose its speaker by (or refuse)."""
    if not isinstance(update, Mapping):
        raise EventError("session.update needs a 'session' object", "session", code="missing_required_parameter")
    if update.get("type", "realtime") != "realtime":
        raise EventError(f"session type {update['type']!r} is not supported; use 'realtime'", "session.type")
    session = copy.deepcopy(dict(current))
    for key, value in update.items():
        match key:
            case _ if key in _FIXED or (value is None and key not in NULL_IS_A_VALUE):
                continue
            case "audio":
                _merge_audio(session, value, stage_voices)
            case "input_audio_format" | "output_audio_format":
                if not isinstance(value, str) or value not in BETA_FORMATS:
                    supported = ", ".join(repr(name) for name in BETA_FORMATS)
                    raise EventError(f"{key} {value!r} is not supported; use one of {supported}", f"session.{key}")
                direction = "input" if key == "input_audio_format" else "output"
                session["audio"][direction]["format"] = _checked_format({"type": BETA_FORMATS[value]}, key)
            case "turn_detection":
                _set_turn_detection(session, value, "session.turn_detection")
            case "voice":
                session["voice"] = session["audio"]["output"]["voice"] = _checked_voice(
                    value, "session.voice", stage_voices
                )
            case "speed":
                session["audio"]["output"]["speed"] = _checked_speed(value, "session.speed")
            case "input_audio_transcription":
                session["audio"]["input"]["transcription"] = _checked_transcription(value, f"session.{key}")
            case "modalities" | "output_modalities":
                session["output_modalities"] = _checked_modalities(value, f"session.{key}")
            case "max_output_tokens" | "max_response_output_tokens":
                session["max_output_tokens"] = _checked_max_tokens(value, f"session.{key}")
            case "instructions":
                if not isinstance(value, str):
                    raise EventError(f"session.instructions must be a string, got {type(value).__name__}", key)
                session["instructions"] = value
            case "omnitrio_events":
                if not isinstance(value, bool):
                    raise EventError(f"session.omnitrio_events must be true or false, got {value!r}", f"session.{key}")
                session[key] = value
            case "tools":
                if not isinstance(value, list):
                    raise EventError("session.tools must be a list", "session.tools")
                session["tools"] = copy.deepcopy(value)
            case _:
                session[key] = copy.deepcopy(value)
    return session


def _merge_audio(session: dict[str, Any], audio: Any, stage_voices: bool = False) -> None:
    if not isinstance(audio, Mapping):
        raise EventError("session.audio must be an object", "session.audio")
    for direction in ("input", "output"):
        part = audio.get(direction)
        if part is None:
            continue
        if not isinstance(part, Mapping):
            raise EventError(f"session.audio.{direction} must be an object", f"session.audio.{direction}")
        for key, value in part.items():
            param = f"session.audio.{direction}.{key}"
            match key:
                case _ if value is None and key not in NULL_IS_A_VALUE:
                    continue
                case "format":
                    session["audio"][direction]["format"] = _checked_format(value, param)
                case "turn_detection" if direction == "input":
                    _set_turn_detection(session, value, param)
                case "voice" if direction == "output":
                    session["voice"] = session["audio"]["output"]["voice"] = _checked_voice(value, param, stage_voices)
                case "speed" if direction == "output":
                    session["audio"]["output"]["speed"] = _checked_speed(value, param)
                case "transcription" if direction == "input":
                    session["audio"]["input"]["transcription"] = _checked_transcription(value, param)
                case _:
                    session["audio"][direction][key] = copy.deepcopy(value)


def audio_format(session: Mapping[str, Any], direction: str) -> str:
    """``"audio/pcm"`` (PCM16 24 kHz), ``"audio/pcmu"`` or ``"audio/pcma"`` (G.711 8 kHz) of
    ``direction`` (``"input"`` or ``"output"``)."""
    return str(session["audio"][direction]["format"]["type"])


def _checked_format(value: Any, param: str) -> dict[str, Any]:
    kind = value.get("type") if isinstance(value, Mapping) else None
    match kind:
        case "audio/pcm" if value.get("rate", REALTIME_RATE) == REALTIME_RATE:
            return dict(_PCM)
        case "audio/pcmu" | "audio/pcma" if value.get("rate", 8000) == 8000:
            return {"type": kind}
        case _:
            raise EventError(
                f"{param} {value!r} is not supported; use {_PCM} (PCM16 mono 24 kHz),"
                " {'type': 'audio/pcmu'} or {'type': 'audio/pcma'} (G.711 8 kHz)",
                param,
            )


def _set_turn_detection(session: dict[str, Any], value: Any, param: str) -> None:
    if value is not None:
        value = _checked_turn_detection(value, param)
    session["turn_detection"] = copy.deepcopy(value)
    session["audio"]["input"]["turn_detection"] = copy.deepcopy(value)


def _checked_turn_detection(value: Any, param: str) -> dict[str, Any]:
    """A ``server_vad`` object whose fields have the right types and ranges."""
    if not isinstance(value, Mapping):
        raise EventError(f"{param} must be an object or null", param)
    match value.get("type", "server_vad"):
        case "server_vad":
            checked = {"type": "server_vad", **{k: v for k, v in value.items() if k != "type"}}
        case "semantic_vad":
            kept = ("eagerness", "create_response", "interrupt_response", "false_interruptions")
            given = {k: v for k, v in value.items() if k in kept}
            checked = {"type": "semantic_vad", "eagerness": "auto", "create_response": True, "interrupt_response": True}
            checked.update(given)
        case other:
            raise EventError(
                f"{param}.type {other!r} is not supported; use 'server_vad', 'semantic_vad' or null (manual commit)",
                f"{param}.type",
            )
    for key, item in checked.items():
        match key:
            case "threshold":
                ok = isinstance(item, int | float) and not isinstance(item, bool) and 0.0 <= item <= 1.0
                expected = "a number between 0 and 1"
            case "prefix_padding_ms" | "silence_duration_ms":
                ok = isinstance(item, int) and not isinstance(item, bool) and 0 <= item <= 10_000
                expected = "an integer number of milliseconds between 0 and 10000"
            case "idle_timeout_ms":
                low, high = MIN_IDLE_TIMEOUT_MS, MAX_IDLE_TIMEOUT_MS
                ok = item is None or (isinstance(item, int) and not isinstance(item, bool) and low <= item <= high)
                expected = f"null or an integer number of milliseconds between {low} and {high}"
            case "create_response" | "interrupt_response":
                ok, expected = isinstance(item, bool), "true or false"
            case "eagerness":
                ok, expected = item in EAGERNESS, "one of " + ", ".join(repr(level) for level in EAGERNESS)
            case "false_interruptions" if item is not None:
                try:
                    FalseInterruptions.from_settings(item)
                except ValueError as exc:
                    raise EventError(f"{param}.{key}: {exc}", f"{param}.{key}") from None
                ok, expected = True, ""
            case _:
                ok, expected = True, ""
        if not ok:
            raise EventError(f"{param}.{key} must be {expected}, got {item!r}", f"{param}.{key}")
    return checked


def _checked_modalities(value: Any, param: str) -> list[str]:
    if value in (["audio"], ["text"]):
        return list(value)
    if isinstance(value, list) and sorted(value) == ["audio", "text"]:
        return ["audio"]  # the beta spelling: audio always comes with its transcript
    raise EventError(f"{param} must be ['audio'] or ['text'], got {value!r}", param)


def _checked_max_tokens(value: Any, param: str) -> int | str:
    if value == "inf" or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_OUTPUT_TOKENS):
        return value  # type: ignore[no-any-return]
    raise EventError(f"{param} must be an integer from 1 to {MAX_OUTPUT_TOKENS} or 'inf', got {value!r}", param)


def _checked_speed(value: Any, param: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and MIN_SPEED <= value <= MAX_SPEED:
        return float(value)
    raise EventError(f"{param} must be a number from {MIN_SPEED} to {MAX_SPEED}, got {value!r}", param)


def _checked_voice(value: Any, param: str, stage_voices: bool = False) -> str:
    """The voice that plays for ``value``: every accepted name plays the pipeline's one voice, ``default``;
    with ``stage_voices``, any non-empty name, as given."""
    if stage_voices and isinstance(value, str) and value:
        return value
    if isinstance(value, str) and value in VOICES:
        return PLAYED_VOICE
    raise EventError(
        f"{param} {value!r} is not a voice of this server; use one of {', '.join(VOICES)}"
        f" (each plays the pipeline's one voice, read back as {PLAYED_VOICE!r})",
        param,
        code="invalid_voice",
    )


def asked_voice(update: Any) -> Any:
    """The voice name a ``session.update``'s ``session`` asks for (``audio.output.voice`` or ``voice``), or None."""
    if not isinstance(update, Mapping):
        return None
    audio = update.get("audio")
    output = audio.get("output") if isinstance(audio, Mapping) else None
    if isinstance(output, Mapping) and output.get("voice") is not None:
        return output["voice"]
    return update.get("voice")


def _checked_transcription(value: Any, param: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise EventError(f"{param} must be an object or null", param)
    for key in ("model", "language", "prompt"):
        if value.get(key) is not None and not isinstance(value[key], str):
            raise EventError(f"{param}.{key} must be a string", f"{param}.{key}")
    return dict(value)
