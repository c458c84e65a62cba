"""The scheduler contract, identical in names and fields to SGLang-Omni's.

A stage is an IO shell; all compute goes through a scheduler that runs in its own
thread and talks to the shell only through two queues:

* ``inbox`` receives :class:`IncomingMessage` (``new_request``, ``stream_chunk``,
  ``stream_done``, ``abort``), put by the stage from the IO side;
* ``outbox`` yields :class:`OutgoingMessage` (``result``, ``stream``, ``error``,
  ``admitted``, ``kv_transfer``), drained by the stage.

This module is pure data: it imports neither trio nor anything else of omnitrio, so
``schedulers/`` may depend on it and nothing more.  A scheduler written for
SGLang-Omni ports by changing its imports to this module.
"""

from __future__ import annotations

import queue
from collections.abc import Iterable
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

IncomingMessageType = Literal["new_request", "stream_chunk", "stream_done", "abort"]
OutgoingMessageType = Literal["result", "stream", "error", "kv_transfer", "admitted"]


@attrs.define(eq=False)
class OmniRequest:
    """What a caller submitted: ``inputs`` plus free-form ``params`` and ``metadata``.

    ``params`` carries per-request knobs (``params["stream"]`` asks streaming stages to
    stream); ``metadata`` is for the pipeline's own bookkeeping.
    """

    inputs: Any = None
    params: dict[str, Any] = attrs.field(factory=dict)
    metadata: dict[str, Any] = attrs.field(factory=dict)


@attrs.define(eq=False)
class StagePayload:
    """The unit of work that flows between stages.

    The entry stage receives ``data == {"raw_inputs": request.inputs}``.  A stage's
    compute may mutate ``data`` in place and return the same payload: once a payload has
    been handed to the next stage, the sender must not touch it again.
    """

    request_id: str
    request: OmniRequest
    data: Any = None


@attrs.define(eq=False)
class StreamItem:
    """One stream chunk as a receiving scheduler sees it (``stream_chunk`` data).

    ``chunk_id`` counts from 0 per (request, source, target) edge; ``metadata`` is the
    producer's ``OutgoingMessage.metadata``.
    """

    chunk_id: int
    data: Any
    from_stage: str
    metadata: dict[str, Any] | None = None


@attrs.define(eq=False)
class IncomingMessage:
    """Stage → scheduler.

    ``new_request`` carries a :class:`StagePayload`; ``stream_chunk`` a
    :class:`StreamItem`; ``stream_done`` and ``abort`` carry nothing (``stream_done``
    may carry the source stage name).
    """

    request_id: str
    type: IncomingMessageType
    data: Any = None


@attrs.define(eq=False)
class OutgoingMessage:
    """Scheduler → stage.

    * ``result``: ``data`` is the finished :class:`StagePayload` (or plain data);
    * ``stream``: ``data`` is a chunk for ``target`` (or every ``stream_to`` stage, or the
      caller at a terminal stage); ``metadata["modality"]`` names its kind;
    * ``error``: ``data`` is the exception (or a message string); it fails the request;
    * ``admitted``: the scheduler took up a request no stage input brought it (the decode
      side of prefill/decode disaggregation, handed the request by its prefill partner):
      the stage serves it from then on, and its outputs reach the caller or the next
      stages as any request's do;
    * ``kv_transfer``: the request leaves this stage through the scheduler's own channel
      (the prefill side): its life here ends, nothing is routed; ``data`` is not read.

    Outputs for a request that is no longer active at the stage are dropped.
    """

    request_id: str
    type: OutgoingMessageType
    data: Any = None
    target: str | None = None
    metadata: dict[str, Any] | None = None


class StageOverloaded(Exception):
    """A scheduler's bounded queue is full.

    Send it as an ``error`` output: the caller gets ``omnitrio.Overloaded`` (HTTP 503)
    instead of a generic failure.
    """


class InvalidRequest(ValueError):
    """A request this scheduler cannot serve as asked: the caller's mistake, not the stage's.

    Send it (or raise it where the scheduler turns exceptions into ``error`` outputs): the caller
    gets a client error naming ``param`` with OpenAI's ``code`` (HTTP 400, or a realtime ``error``
    event) instead of a stage failure.  ``code`` is OpenAI's, e.g. ``"context_length_exceeded"``.
    """

    def __init__(self, message: str, *, code: str = "invalid_value", param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param

    def __reduce__(self) -> tuple[Any, ...]:
        return (_invalid_request, (str(self), self.code, self.param))


def _invalid_request(message: str, code: str, param: str | None) -> InvalidRequest:
    return InvalidRequest(message, code=code, param=param)


@runtime_checkable
class StageScheduler(Protocol):
    """What a stage needs from a scheduler.

    ``start()`` is a blocking loop, run in the stage's scheduler thread after
    ``warm_up_serving_thread()``.  The stage reports ready only once that warm-up has
    returned (within its ``warm_up_timeout``): it is where a scheduler pays what a first
    request would otherwise pay — lazy loads, the first call of each kernel and of each
    input path — so that the first request after ready costs what later ones do.  A
    scheduler may name what it warmed in ``warmed`` (a sequence of strings, read once the
    warm-up has returned; the stage's start-up event carries it).  ``stop()`` is called
    from another thread and must make ``start()`` return soon.  ``abort(request_id)`` may
    be called from the IO side at any time and must not block.  A scheduler may also
    define ``enqueue(msg)`` (called from the IO side instead of ``inbox.put``; it must not
    block).
    """

    @property
    def inbox(self) -> Any: ...

    @property
    def outbox(self) -> Any: ...

    def warm_up_serving_thread(self) -> None: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def abort(self, request_id: str) -> None: ...


def put_messages(outbox: queue.Queue[OutgoingMessage] | Any, messages: Iterable[OutgoingMessage]) -> None:
    """Put several outputs on an outbox; a ``queue.Queue`` is extended under one lock.

    The consumer then wakes once for the whole group rather than once per message.  A
    bounded ``queue.Queue`` (``maxsize > 0``) is never filled past ``maxsize``: the group
    goes in as the room allows, blocking like ``put`` while the queue is full.
    """
    items = list(messages)
    if isinstance(outbox, queue.Queue):
        maxsize = outbox.maxsize
        with outbox.not_full:
            while items:
                if maxsize > 0:
                    while len(outbox.queue) >= maxsize:
                        outbox.not_full.wait()
                    room = maxsize - len(outbox.queue)
                    batch, items = items[:room], items[room:]
                else:
                    batch, items = items, []
                outbox.queue.extend(batch)
                outbox.unfinished_tasks += len(batch)
                outbox.not_empty.notify()
        return
    for item in items:
        outbox.put(item)


__all__ = [
    "IncomingMessage",
    "IncomingMessageType",
    "InvalidRequest",
    "OmniRequest",
    "OutgoingMessage",
    "OutgoingMessageType",
    "StageOverloaded",
    "StagePayload",
    "StageScheduler",
    "StreamItem",
    "put_messages",
]
