"""The server's limits, in one place: what a client may ask of it at once and in one request.

Every limit is a field of :class:`ServeLimits`; ``serve --limit NAME=VALUE`` sets one and
``python -m omnitrio check FILE`` prints them all with the values that pipeline would get.

============================  ==========================================================================
``max_realtime_sessions``     realtime WebSockets open at once; one more is refused at connect time
                              (an ``error`` event, then close code 1013). Default: the smallest
                              ``max_sessions`` the pipeline's config gives a stage's factory
                              (``factory.max_sessions``), else 64.
``max_concurrent_requests``   HTTP ``/v1/*`` requests in flight at once (a streamed response counts
                              until its last byte); one more gets 429 with ``Retry-After``.
``max_body_bytes``            request bodies and uploads (413 beyond; OpenAI's 25 MiB by default).
``max_audio_seconds``         decoded length of an uploaded transcription file (413 beyond), and of the
                              uncommitted audio a realtime session buffers (an ``error`` event beyond).
``max_event_bytes``           one realtime WebSocket message (the connection is closed with 1009 beyond).
============================  ==========================================================================

The pipeline has its own bounds besides these (``max_in_flight``, a stage's ``max_queue``); a
request refused by them is answered 429 with ``Retry-After`` too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from omnitrio.config import PipelineConfig

DEFAULT_MAX_BODY_BYTES = 25 * 1024 * 1024  # OpenAI's upload limit for audio files
DEFAULT_SESSIONS = 64
SESSION_LIMIT_ARG = "max_sessions"
"""The factory argument by which a pipeline's config declares a stage's session limit."""


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be positive, got {value!r}")


@attrs.frozen
class ServeLimits:
    """How much the server takes at once and in one request (see the module docstring)."""

    max_realtime_sessions: int = attrs.field(default=DEFAULT_SESSIONS, validator=_positive)
    max_concurrent_requests: int = attrs.field(default=256, validator=_positive)
    max_body_bytes: int = attrs.field(default=DEFAULT_MAX_BODY_BYTES, validator=_positive)
    max_audio_seconds: float = attrs.field(default=600.0, validator=_positive)
    max_event_bytes: int = attrs.field(default=16 * 1024 * 1024, validator=_positive)

    def describe(self) -> str:
        """One ``name = value`` line per limit, for ``check``."""
        return "\n".join(f"  {field.name} = {getattr(self, field.name)}" for field in attrs.fields(ServeLimits))


def session_stages(config: PipelineConfig) -> dict[str, int]:
    """Each stage whose config declares ``factory.max_sessions``, and that limit.

    The config says it (the shipped pipelines set it on their session stages): the server
    reads no factory's signature.
    """
    limits = {}
    for stage in config.stages:
        declared = stage.factory.to_kwargs().get(SESSION_LIMIT_ARG)
        if isinstance(declared, int) and not isinstance(declared, bool):
            limits[stage.name] = declared
    return limits


def session_limit(config: PipelineConfig) -> int | None:
    """The smallest ``max_sessions`` among ``config``'s session stages; None when it has none."""
    return min(session_stages(config).values(), default=None)


def limits_for(config: PipelineConfig | None, settings: Iterable[str] = ()) -> ServeLimits:
    """The limits for serving ``config``: the defaults, the pipeline's session limit, then ``NAME=VALUE`` settings.

    Raises ``ValueError`` naming the setting when one is unknown, not a number, or not positive.
    """
    values: dict[str, Any] = {}
    sessions = session_limit(config) if config is not None else None
    if sessions is not None:
        values["max_realtime_sessions"] = sessions
    fields = {field.name: field for field in attrs.fields(ServeLimits)}
    for setting in settings:
        name, sep, text = setting.partition("=")
        name = name.strip()
        if not sep or name not in fields:
            raise ValueError(f"--limit {setting!r}: expected NAME=VALUE with NAME one of {', '.join(fields)}")
        kind = float if fields[name].type in (float, "float") else int
        try:
            values[name] = kind(text)
        except ValueError:
            expected = "a number" if kind is float else "an integer"
            raise ValueError(f"--limit {setting!r}: {name} must be {expected}") from None
    try:
        return ServeLimits(**values)
    except ValueError as exc:
        raise ValueError(f"--limit: {exc}") from None
