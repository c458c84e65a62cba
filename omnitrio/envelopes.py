"""The messages stages, processes and the coordinator exchange (not the scheduler's).

They are msgspec Structs: cheap to build in one process, and encoded on the wire with a
pre-built msgpack codec when they cross one.  ``body`` holds
user data — the object itself in one process, packed bytes (pickle plus shared-memory
tensor refs) across processes.  Every request-level message carries the request id and
its incarnation ``inc``: a number the coordinator gives each submission, so a late
message from an earlier life of a reused id is recognised and dropped.
"""

from __future__ import annotations

from typing import Any

import msgspec

COORDINATOR = "@coordinator"
UNBOUND = 0
"""The incarnation of a request a scheduler admitted by itself (an ``admitted`` output: no
stage input told the stage which life it is).  No submission has it (they count from 1);
the coordinator and stages match it to the live request of that id."""


class Payload(msgspec.Struct, tag="p", array_like=True):
    """A stage's input: from the coordinator (``src == COORDINATOR``) or an upstream stage."""

    rid: str
    inc: int
    to: str
    src: str
    body: Any


class Chunk(msgspec.Struct, tag="c", array_like=True):
    """One stream chunk on the edge ``src`` → ``to``; ``chunk_id`` counts from 0 per edge."""

    rid: str
    inc: int
    to: str
    src: str
    chunk_id: int
    body: Any
    metadata: dict[str, Any] | None = None


class Done(msgspec.Struct, tag="d", array_like=True):
    """End of the stream on the edge ``src`` → ``to``."""

    rid: str
    inc: int
    to: str
    src: str


class Abort(msgspec.Struct, tag="a", array_like=True):
    """Drop the request at stage ``to``; the stage answers with exactly one :class:`Released`."""

    rid: str
    inc: int
    to: str


class Cut(msgspec.Struct, tag="x", array_like=True):
    """Fan-in stage ``to`` gets no payload from ``sources`` for this request: stage ``by``'s route
    left out every way to them (the coordinator sends it, :mod:`omnitrio.reach`)."""

    rid: str
    inc: int
    to: str
    sources: tuple[str, ...]
    by: str


class Credit(msgspec.Struct, tag="g", array_like=True):
    """``src`` (the caller, or a stage) consumed ``n`` of this request's chunks from stage ``to``,
    which may send it ``n`` more."""

    rid: str
    inc: int
    to: str
    n: int
    src: str = COORDINATOR


class Complete(msgspec.Struct, tag="C", array_like=True):
    """A terminal stage's result."""

    rid: str
    inc: int
    src: str
    body: Any


class StreamOut(msgspec.Struct, tag="S", array_like=True):
    """A terminal stage's stream chunk for the caller."""

    rid: str
    inc: int
    src: str
    chunk_id: int
    body: Any
    modality: str | None = None


class Failed(msgspec.Struct, tag="F", array_like=True):
    """Stage ``stage`` failed the request; ``overloaded`` marks a full queue (HTTP 503).

    ``code`` set (with ``param``) marks the caller's mistake, a scheduler's ``InvalidRequest``."""

    rid: str
    inc: int
    stage: str
    error_type: str
    message: str
    overloaded: bool = False
    code: str | None = None
    param: str | None = None


class Released(msgspec.Struct, tag="R", array_like=True):
    """Stage ``stage`` holds nothing more of this request (the answer to :class:`Abort`)."""

    rid: str
    inc: int
    stage: str


class Skipped(msgspec.Struct, tag="K", array_like=True):
    """Stage ``stage``'s route left ``targets`` out, so terminals the request waits for or fan-in
    sources may be unreachable now (:mod:`omnitrio.reach` says when a stage sends one).

    ``streamed``: stages it streamed to and then left out that another stage may still send a
    payload; they are let go of when the request completes (:mod:`omnitrio.lingering`)."""

    rid: str
    inc: int
    stage: str
    targets: tuple[str, ...]
    streamed: tuple[str, ...] = ()


ToStage = Payload | Chunk | Done | Cut | Abort | Credit
ToCoordinator = Complete | StreamOut | Failed | Released | Skipped
