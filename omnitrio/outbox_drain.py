"""Scheduler thread → trio: a scheduler's outputs, drained from its outbox to the stage.

The outbox may be any queue-like object the scheduler made — including a plain
``queue.Queue`` it never told us about.  For a ``queue.Queue`` the drain swaps the queue's
``not_empty`` condition for one that also asks trio to drain, so ``put`` and
``put_messages`` both wake trio directly, with one coalesced ``run_sync_soon`` per batch
and no extra thread.  Any other queue gets a small pump thread that blocks in ``get()``.
Outputs reach ``deliver`` in the order the scheduler produced them, at most
:data:`DRAIN_BATCH` per pass of the trio loop, so a flooding scheduler cannot starve the
other stages of its process.

Hand-off (stage processes): when a request's first output is queued while the trio
loop is idle, the scheduler thread waits (at most :data:`HANDOFF_S`, with the GIL and the
outbox's lock released) until the loop has handled it and is idle again.  A scheduler that
drops the GIL briefly on every step (most torch calls do) would otherwise keep the loop
from taking it: a thread waiting for the GIL forces a switch only after a whole switch
interval without any release, so a first output could wait for a whole burst behind it.
Later outputs of the request do not wait: they leave in batches.

Lives of a reused id: outputs the scheduler queued for a request before it took that
request's in-order ``abort`` message from the inbox belong to the aborted life and are
dropped here (:attr:`OutboxDrain.dropping`), even when a new request with the same id is
already live at the stage.  The inbox feed sees the message taken, on the scheduler
thread, and :meth:`OutboxDrain.fence` queues a fence behind those outputs and wakes trio
to drain it: a fence takes a place in a bounded outbox like an output does.

Pausing (:meth:`OutboxDrain.pause`) leaves the outputs in the scheduler's outbox (see
:mod:`omnitrio.flow` for what that bounds).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import attrs
import trio

from omnitrio.contract import IncomingMessage, OutgoingMessage

DRAIN_BATCH = 256
HANDOFF_S = 0.001
"""Longest a scheduler thread waits for the IO loop to take a request's first output (see above)."""
_STOP = object()


@attrs.frozen(eq=False)
class _Fence:
    """Outbox marker: the scheduler took ``abort`` (an in-order abort message) from its inbox."""

    abort: IncomingMessage


class WakingCondition(threading.Condition):
    """A queue's condition that also calls ``on_notify`` (with the queue's lock held) on every notify.

    ``on_notify`` may return a function to call with the lock released: the drain's
    hand-off, which blocks the notifying thread until trio has taken the item.
    """

    def __init__(self, lock: Any, on_notify: Callable[[], Callable[[], object] | None]) -> None:
        super().__init__(lock)
        self._held = lock
        self._on_notify = on_notify

    def notify(self, n: int = 1) -> None:
        super().notify(n)
        handoff = self._on_notify()
        if handoff is not None:
            self._held.release()  # trio's drain takes this lock
            try:
                handoff()
            finally:
                self._held.acquire()


class LoopIdle(trio.abc.Instrument):
    """An event set while this trio loop waits for IO with no task to run.

    One per loop (``trio.lowlevel.add_instrument``): every hook runs on every pass.
    """

    def __init__(self) -> None:
        self.event = threading.Event()

    def before_io_wait(self, timeout: float) -> None:
        if timeout > 0:
            self.event.set()

    def after_io_wait(self, timeout: float) -> None:
        self.event.clear()


class OutboxDrain:
    """Moves one scheduler's outputs to ``deliver`` in the trio thread; see the module docstring."""

    def __init__(
        self,
        outbox: Any,
        name: str,
        deliver: Callable[[list[OutgoingMessage]], None],
        *,
        first_output: Callable[[str], bool] | None = None,
        idle: LoopIdle | None = None,
        handoff_s: float = HANDOFF_S,
    ) -> None:
        """Made in the trio thread.  ``first_output(request_id)`` says whether the stage has had
        no output of that request yet (called on the scheduler thread); such an output is
        handed off for up to ``handoff_s`` while ``idle`` says the loop is idle."""
        self.name = name
        self._outbox = outbox
        self._deliver = deliver
        self.dropping: dict[str, IncomingMessage] = {}
        """Request → its abort message: outputs of the request are dropped until that fence."""
        self.paused = False
        """Whether draining is held back (:meth:`pause`); read by :mod:`omnitrio.flow`."""
        self._token = trio.lowlevel.current_trio_token()
        self._trio_thread = threading.get_ident()
        self._first_output = first_output if handoff_s > 0 and idle is not None else None
        self._handoff_s = handoff_s
        self._idle = idle.event if idle is not None else threading.Event()  # never set: no hand-off
        self._wake_pending = False
        self._wake_lock = threading.Lock()
        self.delivered = False
        """Whether any output reached ``deliver`` (a scheduler that crashed after serving is no
        sign that the next will crash too)."""
        self._pump_thread: threading.Thread | None = None
        self._closed = False

    # -- waking trio (any thread) ---------------------------------------------------

    def _request_drain(self) -> Callable[[], object] | None:
        """Called from any thread after an output is queued; wakes trio once per batch.

        Returns the hand-off for the caller to run with the outbox's lock released, when
        the output just queued is a request's first and the loop is idle.
        """
        if not self._drain_wanted():
            return None
        idle = self._idle
        handoff = idle.is_set() and self._is_first_output() and threading.get_ident() != self._trio_thread
        if handoff:
            idle.clear()  # set again once the loop has run everything this wakes
        self._soon(self._drain)
        return partial(idle.wait, self._handoff_s) if handoff else None

    def _drain_wanted(self) -> bool:
        """Mark a drain pending (any thread); False when one already is, or the drain has closed."""
        with self._wake_lock:
            if self._wake_pending or self._closed:
                return False
            self._wake_pending = True
            return True

    def _is_first_output(self) -> bool:
        """Whether the output last queued (outbox lock held) is the first of its request."""
        if self._first_output is None or not self._outbox.queue:
            return False
        request_id = getattr(self._outbox.queue[-1], "request_id", None)
        return isinstance(request_id, str) and self._first_output(request_id)

    def _soon(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` in the trio thread (from any thread); dropped once trio has ended."""
        try:
            self._token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            return

    def fence(self, taken: list[IncomingMessage]) -> None:
        """The scheduler took these abort messages (its thread, inbox mutex held): queue a fence
        behind the outputs already in the outbox for each."""
        outbox = self._outbox
        with outbox.mutex:
            outbox.queue.extend(_Fence(m) for m in taken)
        # Fences fill a bounded outbox too: undrained, they would leave the scheduler's
        # next put waiting for room that only a drain makes.
        if self._drain_wanted():
            self._soon(self._drain)

    # -- the backlog pause (trio thread) ----------------------------------------------

    def pause(self) -> None:
        """Stop draining the outbox: a request's consumer has fallen far behind (module docstring)."""
        self.paused = True

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self._request_drain()

    # -- draining (trio thread) -----------------------------------------------------

    def _drain(self) -> None:
        """Hand queued outputs to the stage, a batch at a time."""
        with self._wake_lock:
            self._wake_pending = False
        if self.paused:
            return
        outbox = self._outbox
        batch: list[OutgoingMessage] = []
        try:
            while len(batch) < DRAIN_BATCH:
                item = outbox.get_nowait()
                if isinstance(item, _Fence):
                    self._fence_passed(item.abort)
                elif item is not _STOP and not (self.dropping and item.request_id in self.dropping):
                    batch.append(item)
        except queue.Empty:
            pass
        else:
            self._request_drain()  # more left: continue on a later pass of the loop
        if batch and not self._closed:
            self.delivered = True
            self._deliver(batch)

    def _fence_passed(self, abort: IncomingMessage) -> None:
        """Outputs that follow belong to the request's next life (unless it was aborted again)."""
        if self.dropping.get(abort.request_id) is abort:
            del self.dropping[abort.request_id]

    # -- lifetime -------------------------------------------------------------------

    def install(self) -> None:
        """Start waking trio for outputs: a waking condition, or a pump thread."""
        outbox = self._outbox
        if isinstance(outbox, queue.Queue):
            outbox.not_empty = WakingCondition(outbox.mutex, self._request_drain)
            if outbox.qsize():
                self._request_drain()
            return
        self._pump_thread = threading.Thread(target=self._pump_blocking, name=f"outbox-{self.name}", daemon=True)
        self._pump_thread.start()

    def close(self) -> None:
        """Deliver nothing more; stop the pump thread, if any."""
        self._closed = True
        if self._pump_thread is not None:
            self._outbox.put(_STOP)

    def _pump_blocking(self) -> None:
        """For outboxes that are not ``queue.Queue``: block in ``get``, wake trio per batch."""
        outbox = self._outbox
        while True:
            item = outbox.get()
            if item is _STOP:
                return
            self._put_back_front(item)
            self._request_drain()

    def _put_back_front(self, item: Any) -> None:
        # The pump took one item out to learn the queue is non-empty; trio's drain reads
        # the rest.  Keep order by handing that first item over directly.
        items = [item]
        try:
            while len(items) < DRAIN_BATCH:
                nxt = self._outbox.get_nowait()
                if nxt is _STOP:
                    self._outbox.put(_STOP)
                    break
                items.append(nxt)
        except queue.Empty:
            pass
        self._soon(self._deliver_items, items)

    def _deliver_items(self, items: list[OutgoingMessage]) -> None:
        if not self._closed:
            self.delivered = True
            self._deliver(items)
