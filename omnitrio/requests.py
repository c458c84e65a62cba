"""Everything one request owns at one stage, and the table of live ones.

A :class:`RequestScope` is created when the first message of a request reaches a stage
and dropped when that request's task there exits, whatever the exit.  It holds the
request's cancel scope, its output queue (fed by the scheduler bridge), half-collected
fan-in inputs, stream chunk counters, flow-control credits and relay leases — so leaving
the scope is the clean-up, and no second bookkeeping path can leak.

:class:`Tombstones` is the one piece of per-request memory that outlives a scope: after an
abort or failure, a late payload or chunk from an upstream stage that had not yet heard
of it must be dropped rather than start a new request.  Entries expire after
:data:`TOMBSTONE_SECONDS` and are bounded in number.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Literal

import attrs
import trio

from omnitrio.contract import OutgoingMessage
from omnitrio.fanin import FanIn
from omnitrio.mailbox import Mailbox

STREAM_WINDOW = 16
CREDIT_BATCH = STREAM_WINDOW // 2
"""A consumer gives credit back in batches of this many chunks, per request and producer."""
BACKLOG_HIGH = 1024
"""Outputs one request may have buffered at a stage before the scheduler's outbox stops draining."""
BACKLOG_LOW = 256
TOMBSTONE_SECONDS = 10.0
TOMBSTONE_LIMIT = 20_000

Outcome = Literal["running", "done", "failed", "aborted"]


@attrs.define(eq=False)
class RequestScope:
    """One live request at one stage."""

    request_id: str
    inc: int
    cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    outputs: Mailbox[OutgoingMessage] = attrs.field(factory=Mailbox)
    fan_in: FanIn | None = None
    got_payload: bool = False
    in_scheduler: bool = False
    produced: bool = False
    """The scheduler's first output for this request has reached the stage."""
    outcome: Outcome = "running"
    aborted: bool = False
    """Set by :meth:`abort`; the stage owes the coordinator one ``Released`` for it."""
    chunk_ids: dict[str, int] = attrs.field(factory=dict)
    credits: dict[str, int] = attrs.field(factory=dict)
    """Chunks this request may still send each consumer (absent: a full :data:`STREAM_WINDOW`)."""
    credit_arrived: trio.Event | None = None  # made when a stream runs out of credit; most never do
    fed: dict[str, int] = attrs.field(factory=dict)
    """Chunks from each producer handed to this stage's scheduler since the last credit sent back."""
    leases: list[Any] = attrs.field(factory=list)

    def next_chunk_id(self, target: str) -> int:
        n = self.chunk_ids.get(target, 0)
        self.chunk_ids[target] = n + 1
        return n

    def push(self, message: OutgoingMessage) -> None:
        """Hand the request task an output (or a synthetic error); never blocks."""
        self.outputs.put(message)

    @property
    def backlog(self) -> int:
        """Outputs waiting for this request's task."""
        return len(self.outputs)

    def fail_with(self, error: BaseException | str) -> None:
        """Fail the request from outside its task (bad input routing, merge errors)."""
        self.push(OutgoingMessage(self.request_id, "error", data=error))

    def abort(self) -> None:
        self.aborted = True
        self.outcome = "aborted"
        self.cancel_scope.cancel()

    def grant(self, consumer: str, n: int) -> None:
        self.credits[consumer] = self.credits.get(consumer, STREAM_WINDOW) + n
        if self.credit_arrived is not None:
            self.credit_arrived.set()

    async def take_credit(self, consumer: str) -> None:
        """Wait until ``consumer`` has room for one more chunk of this request."""
        credits = self.credits
        while credits.get(consumer, STREAM_WINDOW) <= 0:
            arrived = self.credit_arrived = trio.Event()
            await arrived.wait()
        credits[consumer] = credits.get(consumer, STREAM_WINDOW) - 1

    def count_fed(self, producer: str) -> bool:
        """One more chunk from ``producer`` reached the scheduler; True when a credit is due."""
        return credit_due(self.fed, producer)


def credit_due(consumed: dict[str, int], producer: str) -> bool:
    """Count one chunk consumed from ``producer``; True when :data:`CREDIT_BATCH` credits are due."""
    n = consumed.get(producer, 0) + 1
    due = n >= CREDIT_BATCH
    consumed[producer] = 0 if due else n
    return due


class Tombstones:
    """Recently aborted or failed ``(request id, incarnation)``s; late messages for them are dropped."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def add(self, request_id: str, inc: int) -> None:
        now = trio.current_time()
        self._entries.pop(request_id, None)
        self._entries[request_id] = (inc, now + TOMBSTONE_SECONDS)
        while self._entries:
            _, (_, expiry) = next(iter(self._entries.items()))
            if expiry > now and len(self._entries) <= TOMBSTONE_LIMIT:
                break
            self._entries.popitem(last=False)

    def buries(self, request_id: str, inc: int) -> bool:
        entry = self._entries.get(request_id)
        return entry is not None and inc <= entry[0] and entry[1] > trio.current_time()
