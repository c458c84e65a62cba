"""trio → scheduler thread: the stage's messages for its scheduler, fed to the inbox it reads.

:meth:`InboxFeed.put` never blocks and never wakes the scheduler by itself: messages wait
here (a :class:`~omnitrio.fairqueue.FairQueue`) until the feed task runs, which happens at
the end of the current pass of the trio loop at the earliest.  What holds, precisely:

* Messages put before the feed task runs are handed to the inbox together, in one atomic
  step (a ``queue.Queue`` inbox's lock is held while they are appended), so the scheduler
  never wakes between two of them.  Every message put by synchronous code that runs
  before the feed task's next turn — one ``deliver`` call, one received batch, one task's
  step, or several of them in one loop pass, as long as the feed task is not scheduled
  in between — is in that step.
* A put that happens after the feed task has run in this pass goes in the next step.
  So a burst is one step when it is put without a checkpoint and before the feed gets to
  run; trio gives no promise about where in a pass the feed task runs.

A ``queue.Queue`` inbox is kept at most :data:`INBOX_DEPTH` messages deep, or one batch (the
scheduler's ``max_batch_size``) if that is more, or its ``maxsize`` if that is less: the
rest wait here and go in one per request per round when the scheduler has taken the
inbox down to :data:`INBOX_LOW` (its ``not_full`` condition, which every ``get`` notifies,
is swapped for one that also wakes trio).  So one request's backlog never sits in a FIFO
in front of another request's input, and a burst of new requests still reaches a batching
scheduler whole.  Other inboxes get each message by itself (``enqueue`` or ``put``).

The feed outlives a scheduler: while a stage rebuilds a crashed one, messages wait here
and reach the new scheduler's inbox once it runs.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any, NoReturn

import trio

from omnitrio.contract import IncomingMessage
from omnitrio.fairqueue import FairQueue
from omnitrio.outbox_drain import WakingCondition

INBOX_DEPTH = 8
"""Deep enough that the scheduler rarely waits for trio to refill it; shallow enough that a
new request's input is not queued behind a long backlog of other requests' messages."""
INBOX_LOW = 2


def _positive_int(value: object) -> int:
    return value if isinstance(value, int) and value > 0 else 0


class InboxFeed:
    """Messages on their way to a scheduler's inbox; see the module docstring."""

    def __init__(self, handed_over: Callable[[list[IncomingMessage]], None] | None = None) -> None:
        """``handed_over`` gets each batch once it is in the scheduler's inbox."""
        self._waiting: FairQueue[IncomingMessage] = FairQueue()
        self._flush_wanted = trio.Event()
        self._handed_over = handed_over
        self._token = trio.lowlevel.current_trio_token()
        # Set while a scheduler is attached (:meth:`feed`):
        self._put_one: Callable[[IncomingMessage], None] | None = None
        self._shallow: queue.Queue[Any] | None = None
        self._inbox_depth = INBOX_DEPTH
        self._starving = False  # messages wait for room in the inbox (read under its mutex)
        self._dropping: dict[str, IncomingMessage] = {}  # the attached drain's: aborts to fence
        self._in_inbox: list[IncomingMessage] = []  # abort messages to fence; under the inbox mutex
        self._fence: Callable[[list[IncomingMessage]], None] | None = None

    def put(self, message: IncomingMessage) -> None:
        """Queue ``message`` for the scheduler (see the module docstring for when it goes in)."""
        self._waiting.put(message.request_id, message)
        self._flush_wanted.set()

    @property
    def waiting(self) -> int:
        """Messages held here until the scheduler's inbox has room (or a scheduler runs)."""
        return len(self._waiting)

    def drop(self, request_id: str) -> None:
        """Forget what of ``request_id`` still waits here."""
        self._waiting.drop(request_id)

    def clear(self) -> None:
        """Forget everything waiting (the stage can no longer serve)."""
        self._waiting = FairQueue()

    def can_fence(self, scheduler: Any) -> bool:
        """Whether this feed sees when ``scheduler`` takes a message (a ``queue.Queue`` inbox it
        does not fill itself), which fencing an aborted life's outputs needs."""
        return getattr(scheduler, "enqueue", None) is None and isinstance(scheduler.inbox, queue.Queue)

    async def feed(
        self,
        scheduler: Any,
        dropping: dict[str, IncomingMessage],
        fence: Callable[[list[IncomingMessage]], None],
    ) -> NoReturn:
        """Feed ``scheduler``'s inbox until cancelled.

        ``dropping`` (the outbox drain's, read here) maps a request to the abort message
        whose taking must be fenced; ``fence`` is called on the scheduler thread, inbox mutex
        held, with the abort messages the scheduler just took.
        """
        inbox = scheduler.inbox
        enqueue = getattr(scheduler, "enqueue", None)
        self._put_one = enqueue or inbox.put
        self._shallow = inbox if self.can_fence(scheduler) else None
        # At least one batch deep, so a batching scheduler still sees a burst whole.
        depth = max(INBOX_DEPTH, _positive_int(getattr(scheduler, "max_batch_size", None)))
        maxsize = _positive_int(getattr(inbox, "maxsize", None))
        self._inbox_depth = min(depth, maxsize) if maxsize else depth
        self._starving = False
        self._dropping = dropping
        self._in_inbox = []
        self._fence = fence
        if self._shallow is not None:
            self._shallow.not_full = WakingCondition(self._shallow.mutex, self._on_inbox_get)
        try:
            while True:
                if self._waiting:
                    self._flush_in()
                await self._flush_wanted.wait()
                self._flush_wanted = trio.Event()
        finally:
            self._put_one = self._shallow = self._fence = None

    def _flush_in(self) -> None:
        inbox = self._shallow
        if inbox is not None:
            with inbox.mutex:
                batch = self._waiting.take(max(self._inbox_depth - len(inbox.queue), 0))
                self._starving = len(self._waiting) > 0
                if self._dropping:
                    self._in_inbox += [m for m in batch if self._dropping.get(m.request_id) is m]
                inbox.queue.extend(batch)
                inbox.unfinished_tasks += len(batch)
                inbox.not_empty.notify(len(batch))
        else:
            put_one = self._put_one
            assert put_one is not None
            batch = self._waiting.take()
            for msg in batch:
                put_one(msg)
        if batch and self._handed_over is not None:
            self._handed_over(batch)

    def _on_inbox_get(self) -> None:
        """Called on the scheduler thread, inbox mutex held, after every ``get``."""
        inbox = self._shallow
        if inbox is None:
            return
        if self._in_inbox:
            queued = {id(m) for m in inbox.queue}
            taken = [m for m in self._in_inbox if id(m) not in queued]
            if taken and self._fence is not None:
                self._in_inbox = [m for m in self._in_inbox if id(m) in queued]
                self._fence(taken)
        if self._starving and len(inbox.queue) <= INBOX_LOW:
            self._starving = False
            try:
                self._token.run_sync_soon(self._want_flush)
            except trio.RunFinishedError:
                return

    def _want_flush(self) -> None:
        self._flush_wanted.set()
