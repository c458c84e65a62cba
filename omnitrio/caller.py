"""One request as its caller sees it, start to finish: submitted → answered → let go → gone.

A :class:`CallerRequest` is the coordinator's entry for one submission (a
:class:`Submission`); it lives in the coordinator's table from the moment it is admitted
until every stage has let go of it, and only then may its id be used again.  Its
:class:`Phase` says where it is:

* ``RUNNING``: sent to the entry stage; results (and stream chunks) are arriving.
* ``COMPLETED``: every expected terminal stage answered, or was cut off by routes that
  left it out (:mod:`omnitrio.reach`) while another answered; every stage that may still
  hold it (:mod:`omnitrio.lingering`: a side stage still working, a stage a stream reached
  that the route then left out) was asked to let go (``Abort``).  The id stays taken
  until the caller lets go (its stream closes).
* ``RELEASING``: it failed, was aborted, or its deadline passed (the caller has its error),
  or it completed and the caller let go; it waits for the ``Released`` of every stage it
  asked to let go.  A new request with its id waits for it to be gone
  (:meth:`omnitrio.coordinator.Coordinator.admit`).
* ``GONE``: out of the table; :attr:`CallerRequest.gone` is set.

Routes the request took (``Skipped``) also tell the fan-in stages which of their sources
can no longer arrive (``Cut``).

:class:`RequestStream` is what the caller holds: an async iterator and async context
manager over the request's events.  Leaving it (or dropping it unclosed) before the end
aborts the request at every stage; a deadline aborts it and raises ``RequestTimeout``.
"""

from __future__ import annotations

import enum
import math
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any, Protocol

import attrs
import trio

from omnitrio.contract import OmniRequest, StagePayload
from omnitrio.envelopes import COORDINATOR, Abort, Credit, Cut, ToStage
from omnitrio.errors import RequestAborted, RequestError, RequestFailed, RequestTimeout
from omnitrio.events import REQUEST_ABORTED, REQUEST_FAILED, TERMINAL_RESPONSE
from omnitrio.flow import CREDIT_BATCH, Consumed
from omnitrio.lingering import Lingering
from omnitrio.mailbox import Mailbox
from omnitrio.messages import CompleteMessage, StreamMessage
from omnitrio.reach import Reach, Skips

Event = StreamMessage | CompleteMessage | RequestError


@attrs.frozen
class Submission:
    """What a caller submits: the fields of the ``OmniRequest`` every stage sees, and a deadline.

    ``timeout`` (seconds; None: the pipeline's ``default_timeout``) bounds the whole request.
    """

    request_id: str
    inputs: Any
    params: dict[str, Any] | None = None
    timeout: float | None = None
    metadata: dict[str, Any] | None = None

    def payload(self) -> StagePayload:
        """The entry stage's input."""
        request = OmniRequest(inputs=self.inputs, params=dict(self.params or {}), metadata=dict(self.metadata or {}))
        return StagePayload(self.request_id, request, {"raw_inputs": self.inputs})


class Phase(enum.Enum):
    """Where a request is, from its caller's side; it only moves forward."""

    RUNNING = "running"
    COMPLETED = "completed"
    RELEASING = "releasing"
    GONE = "gone"


class Table(Protocol):
    """What a request needs of the coordinator whose table holds it."""

    def send(self, envelope: ToStage) -> None: ...

    def holders(self, inc: int) -> set[str]:
        """The stages that may hold the request of incarnation ``inc`` (their process is up)."""
        ...

    @property
    def lingering(self) -> Lingering: ...

    def forget(self, request: CallerRequest) -> None: ...

    def emit(self, request_id: str, name: str, fields: dict[str, Any]) -> None: ...


class CallerRequest:
    """One submission in the coordinator's table; see the module docstring."""

    __slots__ = (
        "_consumed",
        "_cut",
        "_skips",
        "_streamed",
        "_table",
        "awaited",
        "deadline",
        "events",
        "gone",
        "inc",
        "opened",
        "phase",
        "request_id",
        "results",
        "terminals",
        "unacked",
    )

    def __init__(self, table: Table, request_id: str, inc: int, terminals: frozenset[str], deadline: float) -> None:
        self._table = table
        self.request_id = request_id
        self.inc = inc
        self.terminals = terminals
        """The terminal stages it waited for when admitted."""
        self.awaited = terminals
        """Those of ``terminals`` that answered or still can (routes may cut one off)."""
        self.deadline = deadline
        """When the caller's deadline passes (``trio.current_time()`` clock); inf without one."""
        self.opened = time.perf_counter()
        """When it was admitted (``time.perf_counter()``: the cheaper clock, for its age alone)."""
        self.phase = Phase.RUNNING
        self.events: Mailbox[Event] = Mailbox()
        self.results: dict[str, Any] = {}
        self.unacked: set[str] = set()
        self.gone = trio.Event()
        self._consumed: Consumed | None = None
        self._skips: Skips = ()
        self._streamed: frozenset[str] = frozenset()
        """Stages routes left out after streaming to them, which another stage could still reach."""
        self._cut: dict[str, frozenset[str]] | None = None
        """Per fan-in stage, the cut-off sources it was told of."""

    # -- 1. answered (by the stages, through the coordinator) -------------------------
    # A terminal stage's stream chunk goes straight into ``events`` while the request runs.

    def complete(self, stage: str, body: Any) -> None:
        """A terminal stage's result; the last expected one completes the request."""
        if self.phase is not Phase.RUNNING or stage not in self.awaited:
            return
        self.results[stage] = body
        self.events.put(CompleteMessage(self.request_id, stage, body))
        if self.results.keys() == self.awaited:
            self._completed(stage)

    def skipped(self, stage: str, left_out: tuple[str, ...], streamed: tuple[str, ...], reach: Reach) -> None:
        """``stage``'s route left ``left_out`` out: tell the fan-in stages which of their sources can
        no longer arrive, and stop waiting for the terminals no stage can still send to
        (:mod:`omnitrio.reach`).  ``streamed``: stages it streamed to before leaving them out,
        which must let go of the request when it completes (at once, when it already has).

        Once every awaited terminal answered or was cut off, the request completes with those
        that answered; when none did, it fails naming ``stage``.
        """
        if streamed:
            self._streamed |= frozenset(streamed)
            if self.phase is not Phase.RUNNING:
                self._let_go(frozenset(streamed))
        if self.phase is not Phase.RUNNING:
            return
        self._skips = skips = (*self._skips, (stage, left_out))
        self._tell_fan_ins(stage, reach.fan_in_cuts(skips))
        cut_off = reach.cut_off(skips)
        if self.awaited.isdisjoint(cut_off):
            return
        lost = {t for t in self.awaited if t in cut_off and t not in self.results}
        if not lost:
            return
        self.awaited = self.awaited - lost
        if self.results.keys() != self.awaited:
            return
        if self.results:
            self._completed(stage)
            return
        message = (
            f"its route_fn left out {list(left_out)}, so no terminal stage this request waits for "
            f"({sorted(self.terminals)}) can be reached"
        )
        error = RequestFailed(self.request_id, stage, "Unreachable", message)
        self.fail(error, REQUEST_FAILED, {"stage": stage, "error_type": "Unreachable", "message": message})

    def _tell_fan_ins(self, stage: str, cuts: Iterable[tuple[str, frozenset[str]]]) -> None:
        for fan_in, sources in cuts:
            if self._cut is None:
                self._cut = {}
            told = self._cut.get(fan_in, frozenset())
            if not sources <= told:
                self._table.send(Cut(self.request_id, self.inc, fan_in, tuple(sorted(sources - told)), stage))
                self._cut[fan_in] = sources | told

    def _completed(self, stage: str) -> None:
        self._table.emit(self.request_id, TERMINAL_RESPONSE, {"from_stage": stage})
        self.phase = Phase.COMPLETED
        self.events.close()
        self._let_go(self._table.lingering.after(frozenset(self.results), self._skips, self._streamed))

    def _let_go(self, stages: frozenset[str]) -> None:
        """Ask ``stages`` (those whose process is up) to let go of the completed request."""
        if not stages:
            return
        asked = stages & self._table.holders(self.inc)
        self.unacked |= asked
        for stage in asked:
            self._table.send(Abort(self.request_id, self.inc, stage))

    def consumed(self, stage: str) -> None:
        """The caller took one of ``stage``'s chunks: give it credit back, in batches."""
        consumed = self._consumed
        if consumed is None:
            consumed = self._consumed = Consumed()
        if consumed.count(stage) and self.phase is Phase.RUNNING:
            self._table.send(Credit(self.request_id, self.inc, stage, CREDIT_BATCH, COORDINATOR))

    # -- 2. ended early: fail, abort, leave ------------------------------------------

    def fail(self, error: RequestError, event: str | None = None, fields: dict[str, Any] | None = None) -> bool:
        """While it runs: give the caller ``error`` (emitting ``event``) and ask every stage to let go.

        Returns False (and does nothing) when it was no longer running.
        """
        if self.phase is not Phase.RUNNING:
            return False
        if event is not None:
            self._table.emit(self.request_id, event, fields or {})
        self.events.put(error)
        self.events.close()
        self.phase = Phase.RELEASING
        self.unacked = self._table.holders(self.inc)
        for stage in list(self.unacked):
            self._table.send(Abort(self.request_id, self.inc, stage))
        self._maybe_gone()
        return True

    def leave(self, error: RequestError | None = None) -> None:
        """The caller stopped waiting: abort the request if it still runs; once it completed, forget
        it as soon as every stage asked to let go has."""
        if self.phase is Phase.RUNNING:
            reason = "timeout" if isinstance(error, RequestTimeout) else "client"
            aborted = error or RequestAborted(self.request_id, "aborted: the caller left")
            self.fail(aborted, REQUEST_ABORTED, {"reason": reason})
        elif self.phase is Phase.COMPLETED:
            self.phase = Phase.RELEASING
            self._maybe_gone()

    # -- 3. let go (by the stages) ---------------------------------------------------

    def released(self, stages: Iterable[str]) -> None:
        """These stages let go of the request (or their process died)."""
        self.unacked.difference_update(stages)
        self._maybe_gone()

    def close(self, error: RequestError) -> None:
        """The pipeline is going away: answer the caller with ``error`` and forget the request."""
        if self.phase is Phase.RUNNING:
            self.events.put(error)
            self.events.close()
        self._forget()

    def _maybe_gone(self) -> None:
        if self.phase is Phase.RELEASING and not self.unacked:
            self._forget()

    def _forget(self) -> None:
        if self.phase is not Phase.GONE:
            self.phase = Phase.GONE
            self._table.forget(self)
        self.gone.set()


class RequestStream:
    """The caller's side of one request: an async iterator and an async context manager.

    The request is submitted on entering the block (or at the first ``__anext__``).
    Leaving the block — or a bare ``async for`` — before the end aborts the request;
    a deadline aborts it and raises :class:`RequestTimeout`.
    """

    def __init__(
        self, open_request: Callable[[Submission, float], Awaitable[CallerRequest]], submission: Submission
    ) -> None:
        """``open_request(submission, deadline)`` admits the request (the coordinator's ``admit``)."""
        self._open = open_request
        self.submission = submission
        self._deadline = math.inf
        self._request: CallerRequest | None = None
        self._done = False
        self._finalizer: weakref.finalize[Any, Any] | None = None

    @property
    def request_id(self) -> str:
        return self.submission.request_id

    @property
    def result(self) -> Any:
        """The terminal result: ``payload.data``, or ``{stage: data}`` when the request waited for
        several terminals — holding those that answered, without the ones routes cut off."""
        assert self._request is not None and self._done
        results = self._request.results
        if len(self._request.terminals) == 1:
            return next(iter(results.values()))
        return dict(results)

    async def _start(self) -> CallerRequest:
        timeout = self.submission.timeout
        if timeout is not None:
            if timeout <= 0:
                raise ValueError(f"timeout must be > 0, got {timeout}")
            self._deadline = trio.current_time() + timeout
        request = self._request = await self._open(self.submission, self._deadline)
        token = trio.lowlevel.current_trio_token()
        self._finalizer = weakref.finalize(self, _leave_later, token, request)
        self._finalizer.atexit = False
        return request

    async def __aenter__(self) -> RequestStream:
        if self._request is None:
            await self._start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Abort the request unless it already finished; idempotent."""
        if self._request is not None:
            self._request.leave()
        if self._finalizer is not None:
            self._finalizer.detach()
        self._done = True

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> StreamMessage | CompleteMessage:
        request = self._request
        if request is None:
            request = await self._start()
        elif self._done and not request.events:
            raise StopAsyncIteration
        try:
            if self._deadline == math.inf:
                event = await request.events.receive()
            else:
                with trio.fail_after(max(self._deadline - trio.current_time(), 0)):
                    event = await request.events.receive()
        except trio.EndOfChannel:
            self.close()
            raise StopAsyncIteration from None
        except trio.TooSlowError:
            timeout = self.submission.timeout
            assert timeout is not None
            error = RequestTimeout(self.request_id, timeout)
            request.leave(error)
            self.close()
            raise error from None
        except BaseException:
            self.close()
            raise
        match event:
            case StreamMessage(from_stage=stage):
                request.consumed(stage)
                return event
            case CompleteMessage():
                return event
            case _:
                self.close()
                raise event


def _leave_later(token: trio.lowlevel.TrioToken, request: CallerRequest) -> None:
    """A stream was dropped without closing: abort its request from the trio thread."""
    try:
        token.run_sync_soon(request.leave)
    except (trio.RunFinishedError, OSError):
        return
