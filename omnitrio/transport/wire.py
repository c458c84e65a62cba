"""How messages cross a process boundary: frames, codec, and the process-level messages.

A batch — one length-prefixed record on a Unix socket (the default transport), or one zmq
multipart message — carries the sending process's name, then one frame per message, each
a msgpack-encoded msgspec Struct (``bench/results/code_figures.md``: its cost).  User data — a payload, a chunk, a
result — is packed by the sender's :class:`~omnitrio.transport.relay.ShmPool`: pickled,
with every large tensor or array copied once into shared memory and referenced by a
lease.  The receiver unpacks zero-copy views and reports the leases it holds; the stage
that received them sends :class:`ReleaseLeases` back when its request scope ends.
Pickle is used only for user objects, never for the control messages themselves.
"""

from __future__ import annotations

from typing import Any

import msgspec

from omnitrio.envelopes import (
    Abort,
    Chunk,
    Complete,
    Credit,
    Cut,
    Done,
    Failed,
    Payload,
    Released,
    Skipped,
    StreamOut,
    ToCoordinator,
    ToStage,
)


class Ready(msgspec.Struct, tag="ready", array_like=True):
    """Child → parent: every stage of ``process`` (pid ``pid``) has started; it listens on
    ``address`` when the parent could not know where (a ``tcp://host:*`` port it chose)."""

    process: str
    pid: int
    address: str = ""


class StartupFailed(msgspec.Struct, tag="startfail", array_like=True):
    """Child → parent: a stage could not start; ``error`` carries the child's traceback, or, when
    ``config_error``, the one-line :class:`~omnitrio.errors.ConfigError` its factory check raised."""

    process: str
    error: str
    config_error: bool = False


class HealthQuery(msgspec.Struct, tag="hq", array_like=True):
    """Parent → child: report your stages' figures, answering with ``qid``."""

    qid: int


class HealthReply(msgspec.Struct, tag="hr", array_like=True):
    """Per stage: ``[active_requests, restarts of its scheduler, queue_depth]``; ``dead``: why
    each dead stage is (see :mod:`omnitrio.health`)."""

    qid: int
    process: str
    stages: dict[str, list[int]]
    dead: dict[str, str] = {}


class Shutdown(msgspec.Struct, tag="bye", array_like=True):
    """Parent → child: stop every stage and exit."""


class PeerDown(msgspec.Struct, tag="down", array_like=True):
    """Parent → everyone: ``process`` died; free what was lent to it, refuse sends to it."""

    process: str


class PeerUp(msgspec.Struct, tag="up", array_like=True):
    """Parent → everyone: ``process`` is back, listening on ``address``."""

    process: str
    address: str


class ReleaseLeases(msgspec.Struct, tag="rel", array_like=True):
    """Receiver → sender: these shared-memory leases may be reused."""

    leases: list[int]


Control = Ready | StartupFailed | HealthQuery | HealthReply | Shutdown | PeerDown | PeerUp | ReleaseLeases
WireMessage = ToStage | ToCoordinator | Control

_BODY_TYPES = (Payload, Complete, StreamOut)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(
    Payload
    | Chunk
    | Done
    | Cut
    | Abort
    | Credit
    | Complete
    | StreamOut
    | Failed
    | Released
    | Skipped
    | Ready
    | StartupFailed
    | HealthQuery
    | HealthReply
    | Shutdown
    | PeerDown
    | PeerUp
    | ReleaseLeases
)


def encode(message: WireMessage) -> bytes:
    """Encode a message whose user data (if any) is already packed into bytes."""
    return _encoder.encode(message)


def decode(data: bytes | memoryview) -> WireMessage:
    return _decoder.decode(data)  # type: ignore[no-any-return]


def carries_body(message: Any) -> bool:
    """Whether ``message`` holds user data that must be packed to cross a process."""
    return isinstance(message, (*_BODY_TYPES, Chunk))
