"""Flow control: per-request stream credits and the backlog pause of a scheduler's outbox.

**Credits.** A producer (a stage streaming to another stage, or a terminal stage
streaming to the caller) may have at most :data:`STREAM_WINDOW` chunks of one request in
flight to each consumer.  The producer side is :class:`Credits` (``await take(consumer)``
before each chunk); the consumer side is :class:`Consumed` (counts chunks taken in — by
its scheduler, or by the caller — and says when :data:`CREDIT_BATCH` credits are due,
which the consumer then sends back as one ``Credit`` message).  So a slow consumer holds
its producer back per request, never by blocking a queue that other requests share.

**Backlog pause.** A stage stops draining its scheduler's outbox (:func:`hold_back`)
when one request has :data:`BACKLOG_HIGH` outputs waiting for its task, and resumes
(:func:`let_through`) once that backlog is down to :data:`BACKLOG_LOW` or the request has
ended.  The outputs wait in the scheduler's own outbox meanwhile.  Only a bounded outbox
(``queue.Queue(maxsize=n)``; ``put`` and :func:`omnitrio.contract.put_messages` block when
it is full) then bounds the memory and slows a scheduler that outruns its consumer; the
shipped schedulers' outboxes are unbounded, so with them the pause moves the backlog into
the outbox rather than bounding it, and what bounds a stream is its consumer's credits.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Protocol

import trio

STREAM_WINDOW = 16
"""Chunks of one request in flight per consumer: enough to keep a consumer busy while credit returns."""
CREDIT_BATCH = STREAM_WINDOW // 2
"""A consumer gives credit back in batches of this many chunks, per request and producer."""
BACKLOG_HIGH = 1024
"""Outputs one request may have buffered at a stage before the scheduler's outbox stops draining."""
BACKLOG_LOW = 256
"""Buffered outputs of that request at which draining resumes."""


class Credits:
    """The producer side: chunks one request may still send each consumer."""

    __slots__ = ("_arrived", "_left")

    def __init__(self) -> None:
        self._left: dict[str, int] = {}  # absent: a full STREAM_WINDOW
        self._arrived: trio.Event | None = None  # made when a stream runs out of credit; most never do

    def grant(self, consumer: str, n: int) -> None:
        """``consumer`` took in ``n`` more chunks: that many may be sent."""
        self._left[consumer] = self._left.get(consumer, STREAM_WINDOW) + n
        if self._arrived is not None:
            self._arrived.set()

    async def take(self, consumer: str) -> None:
        """Wait until ``consumer`` has room for one more chunk, and count it sent.

        Not a checkpoint when credit is left.  Cancelled while waiting, it took nothing.
        """
        left = self._left
        while left.get(consumer, STREAM_WINDOW) <= 0:
            arrived = self._arrived = trio.Event()
            await arrived.wait()
        left[consumer] = left.get(consumer, STREAM_WINDOW) - 1


class Consumed:
    """The consumer side: chunks taken in from each producer since credit was last given back."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def count(self, producer: str) -> bool:
        """One more chunk from ``producer`` was taken in; True when :data:`CREDIT_BATCH` credits are due."""
        n = self._counts.get(producer, 0) + 1
        due = n >= CREDIT_BATCH
        self._counts[producer] = 0 if due else n
        return due


class Outbox(Protocol):
    """The part of :class:`omnitrio.outbox_drain.OutboxDrain` the backlog pause drives."""

    paused: bool

    def pause(self) -> None: ...

    def resume(self) -> None: ...


def hold_back(outbox: Outbox, backlog: int) -> None:
    """An output was queued for a request that now has ``backlog`` waiting: pause at the high mark."""
    if backlog >= BACKLOG_HIGH:
        outbox.pause()


def let_through(outbox: Outbox, backlog: Sized) -> None:
    """A request's outputs waiting went down to ``backlog`` (empty: it ended): resume at the low mark."""
    if outbox.paused and len(backlog) <= BACKLOG_LOW:
        outbox.resume()
