"""The thread boundary between a stage (trio) and its scheduler (a blocking loop).

:class:`SchedulerBridge` runs ``scheduler.start()`` in one long-lived
``trio.to_thread`` worker with its own ``CapacityLimiter`` and moves messages across:

* **trio → thread**: :meth:`SchedulerBridge.put` never blocks.  Messages put during one
  pass of the trio loop are handed to the inbox together, in one atomic step (the
  queue's lock is held while they are appended), so a burst that reached the stage
  together is never split by the scheduler thread waking up half-way through it.
  A ``queue.Queue`` inbox is kept at most :data:`INBOX_DEPTH` messages deep, or one
  batch (the scheduler's ``max_batch_size``) if that is more, or its ``maxsize`` if that
  is less: the rest wait in a :class:`~omnitrio.fairqueue.FairQueue` and go in one per
  request per round when the scheduler has taken the inbox down to :data:`INBOX_LOW`
  (its ``not_full`` condition, which every ``get`` notifies, is swapped for one that also
  wakes trio).  So one request's backlog never sits in a FIFO in front of another
  request's input, and a burst of new requests still reaches a batching scheduler whole.
* **thread → trio**: the outbox may be any queue-like object the scheduler made —
  including a plain ``queue.Queue`` it never told us about.  For a ``queue.Queue`` the
  bridge swaps the queue's ``not_empty`` condition for one that also asks trio to drain,
  so ``put`` and ``put_messages`` both wake trio directly, with one coalesced
  ``run_sync_soon`` per batch and no extra thread.  Any other queue gets a small pump
  thread that blocks in ``get()``.  Outputs reach ``deliver`` in the order the scheduler
  produced them, at most :data:`DRAIN_BATCH` per pass of the trio loop, so a flooding
  scheduler cannot starve the other stages of its process.

Hand-off (stage processes): when a request's first output is queued while the trio
loop is idle, the scheduler thread waits (at most :data:`HANDOFF_S`, with the GIL and the
outbox's lock released) until the loop has handled it and is idle again.  A scheduler that
drops the GIL briefly on every step (most torch calls do) would otherwise keep the loop
from taking it: a thread waiting for the GIL forces a switch only after a whole switch
interval without any release, so a first output could wait for a whole burst behind it.
Later outputs of the request do not wait: they leave in batches.

Lives of a reused id: outputs the scheduler queued for a request before it took that
request's in-order ``abort`` message from the inbox belong to the aborted life and are
dropped here, even when a new request with the same id is already live at the stage (a
producer blocked on a full outbox finishes its put after the abort).  Taking the message
is the boundary, as it is for the scheduler's own bookkeeping (:mod:`schedulers._idsets`);
it is seen on the scheduler thread, which then queues a fence behind those outputs and
wakes trio to drain it: a fence takes a place in a bounded outbox like an output does.  This
needs a ``queue.Queue`` inbox and outbox; with other queues outputs are not fenced.

Priority: with ``nice > 0`` (stage processes, from ``PipelineConfig.scheduler_nice``) the
scheduler thread runs that much nicer than the IO loop (Linux sets niceness per thread),
so on oversubscribed cores the loop that carries every request's messages runs first.

Cancellation: when the bridge's task is cancelled it calls ``scheduler.stop()`` and
waits for ``start()`` to return (never abandoning the thread, which could still touch
what we free).  If ``start()`` raises, :meth:`run` returns the exception so the stage
can fail the scheduler's requests and start a fresh one.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import attrs
import trio

from omnitrio.contract import IncomingMessage, OutgoingMessage
from omnitrio.errors import StartupError
from omnitrio.fairqueue import FairQueue

DRAIN_BATCH = 256
INBOX_DEPTH = 8
"""Deep enough that the scheduler rarely waits for trio to refill it; shallow enough that a
new request's input is not queued behind a long backlog of other requests' messages."""
INBOX_LOW = 2
HANDOFF_S = 0.001
"""Longest a scheduler thread waits for the IO loop to take a request's first output (see above)."""
_STOP = object()


@attrs.frozen(eq=False)
class _Fence:
    """Outbox marker: the scheduler took ``abort`` (an in-order abort message) from its inbox."""

    abort: IncomingMessage


def _positive_int(value: object) -> int:
    return value if isinstance(value, int) and value > 0 else 0


def _lower_thread_priority(by: int) -> Callable[[], None]:
    """Make the calling thread ``by`` nicer (Linux only); returns the undo.

    Raising niceness needs no privilege, lowering it back may (``RLIMIT_NICE``), so the
    undo is best effort: a worker thread that stays nicer is one trio keeps for this
    process's later ``to_thread`` calls, which in a stage process run its schedulers.
    """
    if by <= 0 or sys.platform != "linux":
        return lambda: None
    tid = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, tid)
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(before + by, 19))
    except OSError:
        return lambda: None

    def undo() -> None:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, before)

    return undo


class WakingCondition(threading.Condition):
    """A queue's ``not_empty`` condition that also wakes trio on every notify.

    ``on_notify`` may return a function to call with the queue's lock released: the
    bridge's hand-off, which blocks the notifying thread until trio has taken the item.
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


class SchedulerBridge:
    """Owns one scheduler's thread and both directions of its message flow."""

    def __init__(
        self,
        scheduler: Any,
        name: str,
        deliver: Callable[[list[OutgoingMessage]], None],
        handed_over: Callable[[list[IncomingMessage]], None] | None = None,
        *,
        nice: int = 0,
        first_output: Callable[[str], bool] | None = None,
        idle: LoopIdle | None = None,
        handoff_s: float = HANDOFF_S,
    ) -> None:
        """``deliver`` gets the scheduler's outputs; ``handed_over`` each batch put in its inbox;
        ``nice`` lowers the scheduler thread's priority; ``first_output(request_id)`` says
        whether the stage has had no output of that request yet (called on the scheduler
        thread), and such an output is handed off for up to ``handoff_s`` while ``idle`` (this
        loop's instrument, installed by the caller, shared by its stages) says the loop is
        idle (module docstring)."""
        self.scheduler = scheduler
        self._nice = nice
        self.name = name
        self._deliver = deliver
        self._handed_over = handed_over
        self._waiting: FairQueue[IncomingMessage] = FairQueue()
        inbox, enqueue = scheduler.inbox, getattr(scheduler, "enqueue", None)
        # Each message goes in by itself, unless the inbox is a queue.Queue we can keep shallow.
        self._put_one: Callable[[IncomingMessage], None] = enqueue or inbox.put
        self._shallow: queue.Queue[Any] | None = inbox if enqueue is None and isinstance(inbox, queue.Queue) else None
        # At least one batch deep, so a batching scheduler still sees a burst whole.
        depth = max(INBOX_DEPTH, _positive_int(getattr(scheduler, "max_batch_size", None)))
        maxsize = _positive_int(getattr(inbox, "maxsize", None))
        self._inbox_depth = min(depth, maxsize) if maxsize else depth
        self._starving = False  # messages wait for room in the inbox (read under its mutex)
        # Outputs of an aborted life are dropped until the fence of its abort message (trio thread).
        self._dropping: dict[str, IncomingMessage] = {}
        self._fences = self._shallow is not None and isinstance(scheduler.outbox, queue.Queue)
        self._in_inbox: list[IncomingMessage] = []  # abort messages to fence; under the inbox mutex
        self._flush_wanted = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        self._trio_thread = threading.get_ident()
        self._first_output = first_output if handoff_s > 0 and idle is not None else None
        self._handoff_s = handoff_s
        self._idle = idle.event if idle is not None else threading.Event()  # never set: no hand-off
        self._wake_pending = False
        self._wake_lock = threading.Lock()
        self._outbox = scheduler.outbox
        self._pump_thread: threading.Thread | None = None
        self._closed = False
        self._stopping = False
        self._paused = False

    # -- trio -> thread -------------------------------------------------------------

    def put(self, message: IncomingMessage) -> None:
        """Queue ``message`` for the scheduler; it is handed over at the end of this pass
        (or, when the inbox is full, as soon as the scheduler has taken the inbox down)."""
        self._waiting.put(message.request_id, message)
        self._flush_wanted.set()

    @property
    def waiting(self) -> int:
        """Messages held here until the scheduler's inbox has room."""
        return len(self._waiting)

    def abort(self, request_id: str) -> None:
        """Tell the scheduler now (``abort()``) and in order (an ``abort`` inbox message).

        What of the request still waits here is dropped: the scheduler never needs it.
        """
        self._waiting.drop(request_id)
        message = IncomingMessage(request_id, "abort")
        if self._fences:
            self._dropping[request_id] = message
        self.put(message)
        self.scheduler.abort(request_id)

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
            batch = self._waiting.take()
            for msg in batch:
                self._put_one(msg)
        if batch and self._handed_over is not None:
            self._handed_over(batch)

    def _on_inbox_get(self) -> None:
        """Called on the scheduler thread, inbox mutex held, after every ``get``."""
        if self._in_inbox:
            self._fence_taken_aborts()
        if self._starving and self._shallow is not None and len(self._shallow.queue) <= INBOX_LOW:
            self._starving = False
            self._soon(self._want_flush)

    def _fence_taken_aborts(self) -> None:
        """Queue a fence behind the outputs for each abort message just taken (inbox mutex held)."""
        assert self._shallow is not None
        queued = {id(m) for m in self._shallow.queue}
        taken = [m for m in self._in_inbox if id(m) not in queued]
        if taken:
            self._in_inbox = [m for m in self._in_inbox if id(m) in queued]
            outbox = self._outbox
            with outbox.mutex:
                outbox.queue.extend(_Fence(m) for m in taken)
            # Fences fill a bounded outbox too: undrained, they would leave the scheduler's
            # next put waiting for room that only a drain makes.
            if self._drain_wanted():
                self._soon(self._drain)

    def _want_flush(self) -> None:
        self._flush_wanted.set()

    async def _feed_inbox(self) -> None:
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted = trio.Event()
            self._flush_in()

    # -- thread -> trio -------------------------------------------------------------

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
        """Mark a drain pending (any thread); False when one already is, or the bridge has closed."""
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

    def pause(self) -> None:
        """Stop draining the outbox: a request's consumer has fallen far behind.

        The scheduler's outputs wait in its own outbox; a bounded outbox then blocks the
        scheduler, so memory stays bounded instead of growing in this process.
        """
        self._paused = True

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            self._request_drain()

    @property
    def paused(self) -> bool:
        return self._paused

    def _drain(self) -> None:
        """Runs in the trio thread: hand queued outputs to the stage, a batch at a time."""
        with self._wake_lock:
            self._wake_pending = False
        if self._paused:
            return
        outbox = self._outbox
        batch: list[OutgoingMessage] = []
        try:
            while len(batch) < DRAIN_BATCH:
                item = outbox.get_nowait()
                if isinstance(item, _Fence):
                    self._fence_passed(item.abort)
                elif item is not _STOP and not (self._dropping and item.request_id in self._dropping):
                    batch.append(item)
        except queue.Empty:
            pass
        else:
            self._request_drain()  # more left: continue on a later pass of the loop
        if batch and not self._closed:
            self._deliver(batch)

    def _fence_passed(self, abort: IncomingMessage) -> None:
        """Outputs that follow belong to the request's next life (unless it was aborted again)."""
        if self._dropping.get(abort.request_id) is abort:
            del self._dropping[abort.request_id]

    def _install_waker(self) -> None:
        if self._shallow is not None:
            self._shallow.not_full = WakingCondition(self._shallow.mutex, self._on_inbox_get)
        outbox = self._outbox
        if isinstance(outbox, queue.Queue):
            outbox.not_empty = WakingCondition(outbox.mutex, self._request_drain)
            if outbox.qsize():
                self._request_drain()
            return
        self._pump_thread = threading.Thread(target=self._pump_blocking, name=f"outbox-{self.name}", daemon=True)
        self._pump_thread.start()

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
            self._deliver(items)

    # -- lifetime -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> BaseException | None:
        """Run the scheduler until cancelled (returns None) or until ``start()`` fails.

        ``task_status.started()`` fires after ``warm_up_serving_thread()`` has run in the
        scheduler thread, so a stage reports ready only when its scheduler is.
        """
        ready = trio.Event()
        token = self._token
        failure: list[BaseException] = []

        def thread_main() -> None:
            restore_priority = _lower_thread_priority(self._nice)
            try:
                try:
                    self.scheduler.warm_up_serving_thread()
                except Exception as exc:
                    # Recorded before ``ready`` is set, so the stage never reports ready.
                    failure.append(StartupError(f"stage {self.name!r}: scheduler failed to start: {exc}"))
                    failure[0].__cause__ = exc
                    return
                finally:
                    token.run_sync_soon(ready.set)
                self.scheduler.start()
            finally:
                restore_priority()

        async def run_thread() -> None:
            try:
                await trio.to_thread.run_sync(
                    thread_main, thread_name=f"scheduler-{self.name}", limiter=trio.CapacityLimiter(1)
                )
            except Exception as exc:
                failure.append(exc)
            else:
                if not self._stopping and not failure:
                    failure.append(RuntimeError(f"scheduler of stage {self.name!r}: start() returned before stop()"))
            nursery.cancel_scope.cancel()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._feed_inbox)
                self._install_waker()
                nursery.start_soon(run_thread)
                try:
                    await ready.wait()
                    if failure:
                        raise failure[0]
                    task_status.started()
                    await trio.sleep_forever()
                finally:
                    if not failure:
                        self._stop_scheduler()
        finally:
            self._closed = True
            if self._pump_thread is not None:
                self._outbox.put(_STOP)
        return failure[0] if failure else None

    def _stop_scheduler(self) -> None:
        self._stopping = True
        try:
            self.scheduler.stop()
        except Exception:  # a broken stop() must not hide the shutdown in progress
            return
