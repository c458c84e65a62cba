"""The thread boundary between a stage (trio) and its scheduler (a blocking loop): its lifetime.

:class:`SchedulerBridge` runs ``scheduler.start()`` in one long-lived ``trio.to_thread``
worker with its own ``CapacityLimiter``, and joins the two directions of message flow for
that one scheduler: an :class:`~omnitrio.inbox_feed.InboxFeed` (trio → thread; it may
outlive the scheduler) and an :class:`~omnitrio.outbox_drain.OutboxDrain` (thread → trio).

:meth:`SchedulerBridge.run` says how the scheduler's run went, as an :class:`Outcome`
whose :class:`Run` is one of:

* ``FAILED_TO_START``: ``warm_up_serving_thread()`` raised; ``error`` is a
  :class:`StartupError` naming the stage, and the scheduler never served;
* ``CRASHED``: after warming up, ``start()`` raised (at once or later), or returned
  before ``stop()`` was called;
* ``STOPPED``: the bridge's task was cancelled; it called ``scheduler.stop()`` and
  waited for ``start()`` to return — at most ``stop_timeout`` seconds (the stage's
  ``scheduler_stop_timeout``).  A scheduler still in ``start()`` then is abandoned: a
  warning names the stage, :attr:`SchedulerBridge.abandoned` is set, and its thread (a
  daemon thread) is left to itself, so a process may exit while it still runs.  A
  cancelled ``run`` raises ``Cancelled``, so a caller sees this one as
  :attr:`SchedulerBridge.state` only.

``task_status.started(run)`` fires once warm-up has finished, with ``STARTED`` (``CRASHED``
when ``start()`` raised before the stage saw it start) — or ``FAILED_TO_START``, and then
``run`` returns at once.  Who restarts a scheduler is
:mod:`omnitrio.supervision`, not the bridge.

Priority: with ``nice > 0`` (stage processes, from ``PipelineConfig.scheduler_nice``) the
scheduler thread runs that much nicer than the IO loop (Linux sets niceness per thread),
so on oversubscribed cores the loop that carries every request's messages runs first.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import attrs
import trio

from omnitrio.contract import IncomingMessage, OutgoingMessage
from omnitrio.errors import StartupError
from omnitrio.inbox_feed import INBOX_DEPTH, INBOX_LOW, InboxFeed
from omnitrio.outbox_drain import DRAIN_BATCH, HANDOFF_S, LoopIdle, OutboxDrain, WakingCondition

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 3.0
"""How long ``start()`` has to return after ``stop()`` unless the stage says otherwise."""

__all__ = [
    "DRAIN_BATCH",
    "HANDOFF_S",
    "INBOX_DEPTH",
    "INBOX_LOW",
    "STOP_TIMEOUT_S",
    "LoopIdle",
    "Outcome",
    "Run",
    "SchedulerBridge",
    "WakingCondition",
]


class Run(enum.Enum):
    """Where one scheduler's run is; it only moves forward."""

    STARTING = "starting"
    STARTED = "started"
    FAILED_TO_START = "failed to start"
    CRASHED = "crashed"
    STOPPED = "stopped"


@attrs.frozen
class Outcome:
    """How a scheduler's run ended: ``run`` with the error that ended it (None when stopped)."""

    run: Run
    error: BaseException | None = None


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


class SchedulerBridge:
    """Owns one scheduler's thread and joins its inbox feed and outbox drain."""

    def __init__(
        self,
        scheduler: Any,
        name: str,
        deliver: Callable[[list[OutgoingMessage]], None],
        handed_over: Callable[[list[IncomingMessage]], None] | None = None,
        *,
        feed: InboxFeed | None = None,
        nice: int = 0,
        first_output: Callable[[str], bool] | None = None,
        idle: LoopIdle | None = None,
        handoff_s: float = HANDOFF_S,
        stop_timeout: float = STOP_TIMEOUT_S,
    ) -> None:
        """``deliver`` gets the scheduler's outputs; ``feed`` (a fresh one, calling
        ``handed_over``, when None) holds what goes to its inbox; ``nice`` lowers the
        scheduler thread's priority; ``first_output``, ``idle`` and ``handoff_s`` are the
        drain's hand-off (:mod:`omnitrio.outbox_drain`); ``stop_timeout`` bounds the wait
        for ``start()`` to return after ``stop()`` (module docstring)."""
        self.scheduler = scheduler
        self.name = name
        self._nice = nice
        self.feed = feed if feed is not None else InboxFeed(handed_over)
        self.outbox = OutboxDrain(
            scheduler.outbox, name, deliver, first_output=first_output, idle=idle, handoff_s=handoff_s
        )
        self.put = self.feed.put
        """Queue a message for the scheduler (:meth:`InboxFeed.put`)."""
        self._fences = self.feed.can_fence(scheduler) and hasattr(scheduler.outbox, "mutex")
        self.state = Run.STARTING
        self._stopping = False
        self._stop_timeout = stop_timeout
        self._thread_scope = trio.CancelScope(shield=True)
        """Keeps the wait for the thread out of the shutdown's cancellation until ``stop_timeout``."""
        self.abandoned = False
        """Whether ``start()`` outlived ``stop_timeout`` and its thread was left running."""

    @property
    def waiting(self) -> int:
        """Messages held back until the scheduler's inbox has room."""
        return self.feed.waiting

    def abort(self, request_id: str) -> None:
        """Tell the scheduler now (``abort()``) and in order (an ``abort`` inbox message).

        What of the request still waits in the feed is dropped: the scheduler never needs it.
        Outputs it queued for the request before taking the message are dropped (module
        docstring of :mod:`omnitrio.outbox_drain`).
        """
        self.feed.drop(request_id)
        message = IncomingMessage(request_id, "abort")
        if self._fences:
            self.outbox.dropping[request_id] = message
        self.feed.put(message)
        self.scheduler.abort(request_id)

    async def run(self, *, task_status: trio.TaskStatus[Run] = trio.TASK_STATUS_IGNORED) -> Outcome:
        """Run the scheduler until cancelled, or until it fails to start or crashes (module docstring)."""
        ready = trio.Event()
        token = trio.lowlevel.current_trio_token()
        errors: list[BaseException] = []
        warm_up_failed: list[StartupError] = []
        scheduler = self.scheduler

        def thread_main() -> None:
            restore_priority = _lower_thread_priority(self._nice)
            try:
                try:
                    scheduler.warm_up_serving_thread()
                except Exception as exc:
                    # Recorded before ``ready`` is set, so the stage never reports ready.
                    error = StartupError(f"stage {self.name!r}: scheduler failed to start: {exc}")
                    error.__cause__ = exc
                    warm_up_failed.append(error)
                    return
                finally:
                    token.run_sync_soon(ready.set)
                scheduler.start()
            finally:
                restore_priority()

        async def run_thread() -> None:
            try:
                with self._thread_scope:
                    await trio.to_thread.run_sync(
                        thread_main,
                        thread_name=f"scheduler-{self.name}",
                        limiter=trio.CapacityLimiter(1),
                        abandon_on_cancel=True,
                    )
            except Exception as exc:
                errors.append(exc)
            else:
                if self._thread_scope.cancelled_caught:
                    self.abandoned = True
                    log.warning(
                        "stage %r: its scheduler's start() did not return within %g s of stop() "
                        "(scheduler_stop_timeout); shutdown left its thread running",
                        self.name,
                        self._stop_timeout,
                    )
                elif not self._stopping and not warm_up_failed:
                    errors.append(RuntimeError(f"scheduler of stage {self.name!r}: start() returned before stop()"))
            if self._stopping:
                self.state = Run.STOPPED
            elif not warm_up_failed:
                self.state = Run.CRASHED
            nursery.cancel_scope.cancel()

        drain = self.outbox
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.feed.feed, scheduler, drain.dropping, drain.fence)
                drain.install()
                nursery.start_soon(run_thread)
                try:
                    await ready.wait()  # blocked here before the thread can end: the set always wakes it
                    if warm_up_failed:
                        self.state = Run.FAILED_TO_START
                        task_status.started(self.state)
                        return Outcome(self.state, warm_up_failed[0])
                    if self.state is Run.STARTING:
                        self.state = Run.STARTED
                    task_status.started(self.state)
                    await trio.sleep_forever()
                finally:
                    if self.state in (Run.STARTING, Run.STARTED):
                        self._stop_scheduler()
        finally:
            drain.close()
        return Outcome(self.state, errors[0] if errors else None)

    def _stop_scheduler(self) -> None:
        self._stopping = True
        self._thread_scope.deadline = trio.current_time() + self._stop_timeout
        try:
            self.scheduler.stop()
        except Exception:  # a broken stop() must not hide the shutdown in progress
            return
