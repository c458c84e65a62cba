"""SimpleScheduler: run one function per request, optionally in batches or in parallel.

The scheduler thread (the one that calls :meth:`SimpleScheduler.start`) takes messages
from ``inbox`` in arrival order and puts one ``result`` or ``error`` per request on
``outbox`` (both are ``queue.Queue``; the runtime may hook the outbox's condition to get
woken).  What a caller may rely on:

* **Outputs**: ``OutgoingMessage(rid, "result", data=<what compute returned>)`` or
  ``OutgoingMessage(rid, "error", data=<the exception object>)``.  Results of one batch
  are put together, so the consumer wakes once for them.
* **Batching** (only with ``batch_compute_fn`` and ``max_batch_size > 1``): the messages
  already waiting in the inbox when the first is taken always join its batch (up to
  ``max_batch_size``), so a burst the runtime hands over atomically is one batch.  Then
  the batch keeps filling until ``max_batch_wait_ms`` after the first request
  (``batch_wait_when_idle=True``) or after the *second* request joined (``False``: a
  lone request on an idle stage is dispatched at once).  With ``max_batch_cost``, a
  request that would push the batch over the cap starts the next batch; the first
  request of a batch always fits.  A lone request runs through ``compute_fn`` when there
  is one.
* **Concurrency**: ``max_concurrency > 1`` runs ``compute_fn`` in that many worker
  threads (it must be re-entrant); outputs then come in completion order.  Without it,
  the class's ``default_max_concurrency`` (1 here).
* **Sync or async**: a compute function may return an awaitable; it runs to completion
  on an asyncio loop private to the thread that called it.
* **Abort** (:meth:`abort`, from any thread, never blocks): see :mod:`schedulers._idsets`
  for the exact rules.  An aborted request produces no output, even if its compute was
  already running (the result is dropped); ``abort_callback(rid)`` runs once for every
  abort that took effect, on the thread that aborted (keep it short).  An ``abort``
  message in the inbox is applied in order and ends the id's life here: what follows it
  belongs to a new life of the id.
* **Shutdown**: :meth:`stop` (any thread) puts a sentinel in the inbox; :meth:`start`
  finishes the batch in hand, waits for running workers, calls ``shutdown_callback``
  and returns.  Requests still queued get no output.

Messages other than ``new_request`` and ``abort`` are ignored here; the streaming
subclass handles them.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import inspect
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

import attrs

from omnitrio.contract import IncomingMessage, OutgoingMessage, StagePayload, put_messages
from schedulers._idsets import Admission, Life, RequestLedger
from schedulers.warm_up import WarmUp

logger = logging.getLogger(__name__)

ComputeFn = Callable[[StagePayload], Any]
BatchComputeFn = Callable[[list[StagePayload]], Sequence[Any] | Awaitable[Sequence[Any]]]


class Control(enum.Enum):
    """Private inbox messages (``IncomingMessage(rid, "abort", data=Control.X)``).

    They ride the inbox so the scheduler thread handles them in order with everything
    else; the runtime never sends them.
    """

    STOP = "stop"


@attrs.frozen(eq=False)
class Cleanup:
    """Private inbox message data: clear the thread-owned state of ``life``, which was
    aborted (``completed=False``) or completed (``True``) on another thread."""

    life: Life
    completed: bool


class AsyncCaller:
    """Calls a compute function; awaits what it returns on a loop private to this thread."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def call(self, fn: Callable[[Any], Any], arg: Any) -> Any:
        out = fn(arg)
        if inspect.isawaitable(out):
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            out = self._loop.run_until_complete(out)
        return out

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None


class _WorkerPool:
    """``size`` threads that each run ``work`` on submitted lives, in submission order."""

    def __init__(self, size: int, work: Callable[[list[Life], AsyncCaller], None], name: str) -> None:
        self._jobs: queue.SimpleQueue[Life | None] = queue.SimpleQueue()
        self._work = work
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-worker-{i}", daemon=True) for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, life: Life) -> None:
        self._jobs.put(life)

    def close(self) -> None:
        """Stop taking work; returns once the running computes have finished."""
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()

    def _run(self) -> None:
        caller = AsyncCaller()
        try:
            while (life := self._jobs.get()) is not None:
                self._work([life], caller)
        finally:
            caller.close()


def _check_positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


class SimpleScheduler:
    """One compute function behind the stage inbox/outbox contract (see the module docstring)."""

    default_max_concurrency = 1
    """``max_concurrency`` when none is given; a subclass changes its default here, not in ``__init__``."""

    def __init__(
        self,
        compute_fn: ComputeFn | None = None,
        *,
        batch_compute_fn: BatchComputeFn | None = None,
        max_batch_size: int = 1,
        max_batch_wait_ms: float = 0,
        batch_wait_when_idle: bool = True,
        request_cost_fn: Callable[[StagePayload], int] | None = None,
        max_batch_cost: int | None = None,
        max_concurrency: int | None = None,
        abort_callback: Callable[[str], None] | None = None,
        shutdown_callback: Callable[[], None] | None = None,
        warm_up: WarmUp | None = None,
    ) -> None:
        if compute_fn is None and batch_compute_fn is None and self._needs_compute():
            raise ValueError(f"{type(self).__name__} needs compute_fn or batch_compute_fn")
        self.max_batch_size = _check_positive_int("max_batch_size", max_batch_size)
        if max_concurrency is None:
            max_concurrency = self.default_max_concurrency
        self.max_concurrency = _check_positive_int("max_concurrency", max_concurrency)
        if isinstance(max_batch_wait_ms, bool) or not isinstance(max_batch_wait_ms, int | float):
            raise ValueError(f"max_batch_wait_ms must be a number of milliseconds, got {max_batch_wait_ms!r}")
        if max_batch_wait_ms < 0:
            raise ValueError(f"max_batch_wait_ms must be >= 0, got {max_batch_wait_ms!r}")
        if self.max_concurrency > 1 and batch_compute_fn is not None:
            raise ValueError(
                f"max_concurrency={max_concurrency} cannot be combined with batch_compute_fn: "
                "choose batching or parallel workers"
            )
        if max_batch_cost is not None:
            if request_cost_fn is None:
                raise ValueError("max_batch_cost needs request_cost_fn (the cost of each request)")
            if isinstance(max_batch_cost, bool) or not isinstance(max_batch_cost, int) or max_batch_cost < 0:
                raise ValueError(f"max_batch_cost must be an integer >= 0, got {max_batch_cost!r}")
        self.compute_fn = compute_fn
        self.batch_compute_fn = batch_compute_fn
        self.max_batch_wait_s = float(max_batch_wait_ms) / 1000.0
        self.batch_wait_when_idle = bool(batch_wait_when_idle)
        self.request_cost_fn = request_cost_fn
        self.max_batch_cost = max_batch_cost
        self.abort_callback = abort_callback
        self.shutdown_callback = shutdown_callback
        self.warm_up = warm_up or WarmUp()

        self.inbox: queue.Queue[IncomingMessage] = queue.Queue()
        self.outbox: queue.Queue[OutgoingMessage] = queue.Queue()
        self._ledger = RequestLedger(self._new_request_queued, retire_on_abort=self._retires_aborted_ids())
        # Scheduler thread only: lives set aside by the cost cap, or a stop taken while batching.
        self._held: collections.deque[Life | IncomingMessage] = collections.deque()
        self._thread_id: int | None = None

    # -- subclass knobs -------------------------------------------------------------

    def _needs_compute(self) -> bool:
        return True

    def _retires_aborted_ids(self) -> bool:
        return False

    @property
    def batching(self) -> bool:
        """True when requests are grouped for ``batch_compute_fn``."""
        return self.batch_compute_fn is not None and self.max_batch_size > 1

    # -- the StageScheduler protocol ------------------------------------------------

    def warm_up_serving_thread(self) -> None:
        """Runs the factory's :class:`~schedulers.warm_up.WarmUp` on the scheduler thread before :meth:`start`."""
        self.warm_up.run()

    @property
    def warmed(self) -> list[str]:
        """What the warm-up ran (see :mod:`schedulers.warm_up`)."""
        return self.warm_up.warmed

    def start(self) -> None:
        """Serve the inbox until :meth:`stop`; blocking, on the scheduler thread."""
        self._thread_id = threading.get_ident()
        caller = AsyncCaller()
        pool = (
            _WorkerPool(self.max_concurrency, self._compute, type(self).__name__) if self.max_concurrency > 1 else None
        )
        try:
            self._serve(caller, pool)
        finally:
            if pool is not None:
                pool.close()
            caller.close()
            if self.shutdown_callback is not None:
                self.shutdown_callback()

    def stop(self) -> None:
        """Make :meth:`start` return soon; safe from any thread, also before ``start``."""
        self.inbox.put(IncomingMessage("", "abort", data=Control.STOP))

    def abort(self, request_id: str) -> None:
        """Abort ``request_id`` from any thread; never blocks on a running compute."""
        outcome = self._ledger.abort(request_id)
        if outcome is False:
            return
        if isinstance(outcome, Life):
            self._on_life_aborted(outcome)
        self._notify_abort(request_id)

    # -- the scheduler thread -------------------------------------------------------

    def _serve(self, caller: AsyncCaller, pool: _WorkerPool | None) -> None:
        while True:
            item = self._held.popleft() if self._held else self.inbox.get()
            match item:
                case IncomingMessage(data=Control.STOP):
                    return
                case Life():
                    first: Life | None = item
                case IncomingMessage():
                    first = self._take(item)
            if first is None:
                continue
            batch = self._collect_batch(first)
            if pool is not None:
                for life in batch:
                    pool.submit(life)
            elif batch:
                self._compute(batch, caller)

    def _take(self, msg: IncomingMessage) -> Life | None:
        """Handle one inbox message; returns the life when it is compute work."""
        match msg:
            case IncomingMessage(type="new_request"):
                return self._admit(msg)
            case IncomingMessage(type="abort", data=Cleanup() as cleanup):
                self._on_cleanup(cleanup)
            case IncomingMessage(type="abort"):
                self._close_in_order(msg.request_id)
            case _:
                self._on_stream_message(msg)
        return None

    def _admit(self, msg: IncomingMessage) -> Life | None:
        match self._ledger.admit_payload(msg.request_id, msg.data):
            case Admission.DROPPED:
                return None
            case Admission.DUPLICATE:
                self.outbox.put(OutgoingMessage(msg.request_id, "error", data=_duplicate_error(msg.request_id)))
                return None
            case Life() as life:
                return self._accept(life)
        return None

    def _accept(self, life: Life) -> Life | None:
        """A consumed ``new_request``: the life to compute, or None when handled here."""
        return life

    def _on_cleanup(self, cleanup: Cleanup) -> None:
        """A :class:`Cleanup` message (put by the streaming subclass)."""

    def _on_stream_message(self, msg: IncomingMessage) -> None:
        """``stream_chunk`` / ``stream_done``: a plain SimpleScheduler has no use for them."""

    def _collect_batch(self, first: Life) -> list[Life]:
        if not self.batching:
            return [first]
        cost = self._cost(first)
        if cost is None:
            return []
        batch = [first]
        deadline = time.monotonic() + self.max_batch_wait_s if self.batch_wait_when_idle else None
        while len(batch) < self.max_batch_size:
            item = self._next_nowait()
            if item is None:
                if deadline is None:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = self.inbox.get(timeout=remaining)
                except queue.Empty:
                    break
            match item:
                case IncomingMessage(data=Control.STOP):
                    self._held.appendleft(item)
                    break
                case Life():
                    life: Life | None = item
                case IncomingMessage():
                    life = self._take(item)
            if life is None:
                continue
            if self.max_batch_cost is not None:
                extra = self._cost(life)
                if extra is None:
                    continue
                if cost + extra > self.max_batch_cost:
                    self._held.appendleft(life)
                    break
                cost += extra
            batch.append(life)
            if deadline is None:
                deadline = time.monotonic() + self.max_batch_wait_s
        return batch

    def _next_nowait(self) -> Life | IncomingMessage | None:
        if self._held:
            return self._held.popleft()
        try:
            return self.inbox.get_nowait()
        except queue.Empty:
            return None

    def _cost(self, life: Life) -> int | None:
        """The request's cost (0 without a cap), or None after failing it."""
        if self.max_batch_cost is None or self.request_cost_fn is None:
            return 0
        try:
            return max(int(self.request_cost_fn(life.payload)), 0)
        except Exception as exc:
            self._emit([self._final(life, "error", exc)])
            return None

    # -- compute (scheduler thread, or a worker thread) -----------------------------

    def _compute(self, batch: list[Life], caller: AsyncCaller) -> None:
        lives = [life for life in batch if not self._drop_if_aborted(life)]
        if not lives:
            return
        if len(lives) == 1 and (self.compute_fn is not None or self.batch_compute_fn is None):
            self._compute_one(lives[0], caller)
        else:
            self._compute_batch(lives, caller)

    def _drop_if_aborted(self, life: Life) -> bool:
        if not self._ledger.is_aborted(life):
            return False
        self._ledger.end(life)
        return True

    def _compute_one(self, life: Life, caller: AsyncCaller) -> None:
        try:
            if self.compute_fn is None:
                raise RuntimeError(f"{type(self).__name__} has no compute_fn for request {life.request_id!r}")
            out = caller.call(self.compute_fn, life.payload)
        except Exception as exc:
            self._emit([self._final(life, "error", exc)])
            return
        self._emit([self._final(life, "result", out)])

    def _compute_batch(self, lives: list[Life], caller: AsyncCaller) -> None:
        assert self.batch_compute_fn is not None
        try:
            results = list(caller.call(self.batch_compute_fn, [life.payload for life in lives]))
        except Exception as exc:
            self._emit([self._final(life, "error", exc) for life in lives])
            return
        if len(results) != len(lives):
            error = ValueError(
                f"batch_compute_fn returned {len(results)} results for a batch of {len(lives)} requests "
                f"({', '.join(repr(life.request_id) for life in lives)}); it must return one per request, in order"
            )
            self._emit([self._final(life, "error", error) for life in lives])
            return
        self._emit(
            [
                self._final(life, "error", out) if isinstance(out, BaseException) else self._final(life, "result", out)
                for life, out in zip(lives, results, strict=True)
            ]
        )

    def _final(self, life: Life, kind: Literal["result", "error"], data: Any) -> OutgoingMessage | None:
        """End ``life``; its output, or None when it was aborted meanwhile."""
        if not self._ledger.end(life):
            return None
        return OutgoingMessage(life.request_id, kind, data=data)

    def _emit(self, messages: list[OutgoingMessage | None]) -> None:
        outputs = [msg for msg in messages if msg is not None]
        if outputs:
            put_messages(self.outbox, outputs)

    # -- abort ----------------------------------------------------------------------

    def _close_in_order(self, request_id: str) -> None:
        """An ``abort`` message from the inbox: the boundary between two lives of the id."""
        boundary = self._ledger.close_in_order(request_id)
        if boundary.life is not None:
            self._on_life_closed(boundary.life)
        if boundary.newly_aborted:
            self._notify_abort(request_id)

    def _notify_abort(self, request_id: str) -> None:
        if self.abort_callback is not None:
            try:
                self.abort_callback(request_id)
            except Exception:
                logger.exception("%s: abort_callback failed for %r", type(self).__name__, request_id)

    def _on_life_aborted(self, life: Life) -> None:
        """A live life was just aborted (any thread).  Its compute, queued or running, ends it."""

    def _on_life_closed(self, life: Life) -> None:
        """An in-order abort ended ``life`` (scheduler thread); a compute still holding it drops its output."""

    def _on_scheduler_thread(self) -> bool:
        return self._thread_id == threading.get_ident()

    def _new_request_queued(self, request_id: str) -> bool:
        """Whether a ``new_request`` for ``request_id`` still waits in the inbox (any thread)."""
        with self.inbox.mutex:
            return any(msg.type == "new_request" and msg.request_id == request_id for msg in self.inbox.queue)


__all__ = ["AsyncCaller", "Cleanup", "SimpleScheduler"]


def _duplicate_error(request_id: str) -> ValueError:
    return ValueError(
        f"request id {request_id!r} is already active in this scheduler; an id may be reused only after its "
        "previous request finished or was aborted"
    )
