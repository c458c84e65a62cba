"""The coordinator: submit, stream, abort; the table of live requests; fail-fast.

Each submission gets a :class:`RequestHandle` that lives in the coordinator's table until
the request is finished everywhere: completed by every expected terminal stage, or —
after a failure, abort or deadline — until every stage has answered the broadcast abort
with ``Released``.  Only then may its id be used again, so a reused id never meets a
stage or scheduler that still holds its previous life.

A request is bound to one replica of each replicated process group when it is opened
(:class:`~omnitrio.replicas.Bindings`: the least loaded); everything sent for it goes
there, and a replica that dies fails only the requests bound to it.

Cancelling the caller of :meth:`Coordinator.submit` or :meth:`Coordinator.stream`
(a cancel scope, a timeout, a client that went away) aborts the request at every stage;
nothing keeps running for a caller that left.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Literal

import attrs
import trio

from omnitrio.contract import OmniRequest, StagePayload
from omnitrio.envelopes import (
    COORDINATOR,
    Abort,
    Complete,
    Credit,
    Failed,
    Payload,
    Released,
    StreamOut,
    ToCoordinator,
    ToStage,
)
from omnitrio.errors import (
    BadRequest,
    DuplicateRequest,
    Overloaded,
    PipelineClosed,
    RequestAborted,
    RequestError,
    RequestFailed,
    RequestTimeout,
)
from omnitrio.events import (
    FIRST_STREAM_CHUNK,
    REQUEST_ABORTED,
    REQUEST_FAILED,
    REQUEST_INVALID,
    REQUEST_REJECTED,
    REQUEST_SUBMITTED,
    TERMINAL_RESPONSE,
)
from omnitrio.flow import CREDIT_BATCH, Consumed
from omnitrio.mailbox import Mailbox
from omnitrio.messages import CompleteMessage, StreamMessage
from omnitrio.replicas import Bindings, Replicas
from omnitrio.topology import MAIN, StageFunctionError, Topology

State = Literal["live", "releasing"]
Event = StreamMessage | CompleteMessage | RequestError


@attrs.define(eq=False)
class RequestHandle:
    """One submission, from ``submit``/``stream`` until it is gone from every stage."""

    request_id: str
    inc: int
    terminals: frozenset[str]
    events: Mailbox[Event] = attrs.field(factory=Mailbox)
    state: State = "live"
    finished: bool = False
    results: dict[str, Any] = attrs.field(factory=dict)
    unacked: set[str] = attrs.field(factory=set)
    released: trio.Event = attrs.field(factory=trio.Event)
    consumed: Consumed | None = None
    """Its stream chunks the caller took, per stage; made with the first chunk."""
    opened: float = attrs.field(factory=time.perf_counter)
    """When it was admitted (``time.perf_counter()``: the cheaper clock, for its age alone)."""
    deadline: float = math.inf
    """When the caller's deadline passes (``trio.current_time()`` clock); inf without one."""


@attrs.frozen
class RequestAges:
    """How old the coordinator's requests are: ``overdue`` is how many are still in the table
    past their deadline (a caller not waiting, or a stage not letting go), ``oldest_s`` the age
    of the oldest (None when there is none)."""

    live: int
    overdue: int
    oldest_s: float | None


class Coordinator:
    """Admits requests, sends them to the entry stage, and collects what comes back."""

    def __init__(
        self,
        topology: Topology,
        send: Callable[[ToStage], None],
        stage_names: Iterable[str],
        replicas: Replicas | None = None,
    ) -> None:
        """``replicas``: where each stage lives per request (every stage in one place when None)."""
        self.topology = topology
        self._send = send
        self._stages = tuple(stage_names)
        self._requests: dict[str, RequestHandle] = {}
        self._bindings = Bindings(replicas or Replicas(dict.fromkeys(self._stages, MAIN)))
        self._closed = False
        config = topology.config
        self.max_in_flight = config.max_in_flight
        self.default_timeout = config.default_timeout
        self.on_event: Callable[[str, str, dict[str, Any]], None] | None = None

    @property
    def live_requests(self) -> int:
        return len(self._requests)

    def request_ages(self) -> RequestAges:
        """Synchronous, from the trio thread; O(live requests)."""
        now = trio.current_time()
        handles = self._requests.values()
        overdue = sum(1 for handle in handles if handle.deadline < now)
        oldest = min((handle.opened for handle in handles), default=None)
        return RequestAges(len(self._requests), overdue, None if oldest is None else time.perf_counter() - oldest)

    def close(self) -> None:
        """Refuse new requests; fail the live ones (the pipeline is going away)."""
        self._closed = True
        for handle in list(self._requests.values()):
            if handle.state == "live" and not handle.finished:
                self._emit(handle.request_id, REQUEST_ABORTED, {"reason": "shutdown"})
            self._finish_with(handle, RequestAborted(handle.request_id, "aborted: the pipeline shut down"))
            self._forget(handle)

    # -- public API -----------------------------------------------------------------

    async def submit(
        self,
        request_id: str,
        inputs: Any,
        *,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Any:
        """Run one request to completion and return the terminal stage's ``payload.data``.

        With several terminal stages the result is ``{stage: data}``.  Raises
        :class:`RequestFailed`, :class:`BadRequest`, :class:`RequestAborted`, :class:`RequestTimeout`,
        :class:`Overloaded` or :class:`DuplicateRequest`.
        """
        async with RequestStream(self, request_id, inputs, params, timeout, metadata) as stream:
            async for _ in stream:
                pass
            return stream.result

    def stream(
        self,
        request_id: str,
        inputs: Any,
        *,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> RequestStream:
        """Stream one request: ``StreamMessage`` items, then ``CompleteMessage`` per terminal.

        Use ``async with pipeline.stream(...) as s: async for msg in s``; leaving the block
        early aborts the request everywhere.  A bare ``async for`` works too.
        """
        return RequestStream(self, request_id, inputs, params, timeout, metadata)

    async def abort(self, request_id: str, *, wait: bool = False) -> bool:
        """Abort a live request at every stage.

        Returns True when it aborted a live request, False when the id is unknown or the
        request already finished.  With ``wait=True`` it returns only once every stage
        has released the request.
        """
        handle = self._requests.get(request_id)
        if handle is None:
            return False
        aborted = handle.state == "live" and not handle.finished
        if aborted:
            self._emit(request_id, REQUEST_ABORTED, {"reason": "abort"})
            self._abort_everywhere(handle, RequestAborted(request_id))
        if wait:
            await handle.released.wait()
        return aborted

    # -- internals ------------------------------------------------------------------

    def _open(
        self, request_id: str, inputs: Any, params: dict[str, Any] | None, metadata: dict[str, Any] | None = None
    ) -> RequestHandle:
        if self._closed:
            raise PipelineClosed("the pipeline is closed")
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if request_id in self._requests:
            raise DuplicateRequest(request_id, f"request {request_id!r} is still live; use another id")
        if self.max_in_flight is not None and len(self._requests) >= self.max_in_flight:
            self._emit(request_id, REQUEST_REJECTED, {"reason": "max_in_flight"})
            raise Overloaded(
                request_id, f"{len(self._requests)} requests in flight (max_in_flight={self.max_in_flight})"
            )
        try:
            terminals = self.topology.expected_terminals(request_id, inputs)
        except StageFunctionError as exc:
            raise RequestFailed(request_id, COORDINATOR, exc.error_type, str(exc)) from exc
        handle = RequestHandle(request_id, self._bindings.open(), terminals)
        self._requests[request_id] = handle
        request = OmniRequest(inputs=inputs, params=dict(params or {}), metadata=dict(metadata or {}))
        payload = StagePayload(request_id, request, {"raw_inputs": inputs})
        self._emit(request_id, REQUEST_SUBMITTED, {})
        try:
            self._send(Payload(request_id, handle.inc, self.topology.entry, COORDINATOR, payload))
        except StageFunctionError as exc:
            self._forget(handle)
            raise RequestFailed(request_id, self.topology.entry, exc.error_type, str(exc)) from exc
        return handle

    def _consumed(self, handle: RequestHandle, stage: str) -> None:
        consumed = handle.consumed
        if consumed is None:
            consumed = handle.consumed = Consumed()
        if consumed.count(stage) and handle.state == "live" and not handle.finished:
            self._send(Credit(handle.request_id, handle.inc, stage, CREDIT_BATCH, COORDINATOR))

    def _abort_everywhere(self, handle: RequestHandle, error: RequestError) -> None:
        """Fail the caller with ``error`` and ask every stage to drop the request."""
        self._finish_with(handle, error)
        if handle.state == "releasing":
            return
        handle.state = "releasing"
        handle.unacked = {stage for stage in self._stages if self._bindings.reachable(stage, handle.inc)}
        for stage in handle.unacked.copy():
            self._send(Abort(handle.request_id, handle.inc, stage))
        self._maybe_released(handle)

    def _finish_with(self, handle: RequestHandle, event: Event) -> None:
        if not handle.finished:
            handle.finished = True
            handle.events.put(event)
            handle.events.close()

    def _leave(self, handle: RequestHandle, error: RequestError | None = None) -> None:
        """The caller stopped waiting; abort the request if it is still running."""
        if handle.state == "live" and not handle.finished:
            reason = "timeout" if isinstance(error, RequestTimeout) else "client"
            self._emit(handle.request_id, REQUEST_ABORTED, {"reason": reason})
            self._abort_everywhere(handle, error or RequestAborted(handle.request_id, "aborted: the caller left"))
        elif handle.state == "live":
            self._forget(handle)

    def _forget(self, handle: RequestHandle) -> None:
        """The request is finished everywhere: its id may be used again."""
        if self._requests.get(handle.request_id) is handle:
            del self._requests[handle.request_id]
            self._bindings.close(handle.inc)
        handle.released.set()

    def process_gone(self, process: str, error_for: Callable[[str], RequestError]) -> None:
        """A stage process died: fail every live request bound to it and stop waiting for its releases."""
        self._bindings.gone(process)
        group = self._bindings.replicas.group_of(process)[0]
        dead = set(self._bindings.replicas.stages_in(group, self._stages))
        for handle in list(self._requests.values()):
            if not self._bindings.holds(process, handle.inc):
                continue
            if handle.state == "live" and not handle.finished:
                error = error_for(handle.request_id)
                fields = {
                    "stage": getattr(error, "stage", ""),
                    "error_type": getattr(error, "error_type", ""),
                    "message": getattr(error, "error_message", str(error)),
                }
                self._emit(handle.request_id, REQUEST_FAILED, fields)
                self._abort_everywhere(handle, error)
            handle.unacked -= dead
            self._maybe_released(handle)

    def process_up(self, process: str) -> None:
        """A restarted stage process answers aborts again and takes new requests."""
        self._bindings.up(process)

    def _maybe_released(self, handle: RequestHandle) -> None:
        if handle.state == "releasing" and not handle.unacked:
            self._forget(handle)

    def deliver(self, envelope: ToCoordinator) -> None:
        """Accept one message from a stage (synchronous; never blocks)."""
        handle = self._requests.get(envelope.rid)
        if handle is None or handle.inc != envelope.inc:
            return
        match envelope:
            case StreamOut(src=src, chunk_id=chunk_id, body=body, modality=modality):
                if chunk_id == 0:
                    self._emit(envelope.rid, FIRST_STREAM_CHUNK, {"from_stage": src, "modality": modality})
                if not handle.finished:
                    handle.events.put(StreamMessage(envelope.rid, src, chunk_id, body, modality))
            case Complete(src=src, body=body):
                if handle.finished or src not in handle.terminals:
                    return
                handle.results[src] = body
                handle.events.put(CompleteMessage(envelope.rid, src, body))
                if handle.results.keys() == handle.terminals:
                    self._emit(envelope.rid, TERMINAL_RESPONSE, {"from_stage": src})
                    handle.finished = True
                    handle.events.close()
            case Failed(stage=stage, error_type=error_type, message=message, overloaded=overloaded, code=code):
                if handle.finished:
                    return
                error: RequestError
                fields = {"stage": stage, "error_type": error_type, "message": message}
                if code is not None:
                    error = BadRequest(envelope.rid, stage, message, code, envelope.param)
                    self._emit(envelope.rid, REQUEST_INVALID, {**fields, "code": code})
                elif overloaded:
                    error = Overloaded(envelope.rid, f"stage {stage!r}: {message}")
                    self._emit(envelope.rid, REQUEST_FAILED, fields)
                else:
                    error = RequestFailed(envelope.rid, stage, error_type, message)
                    self._emit(envelope.rid, REQUEST_FAILED, fields)
                self._abort_everywhere(handle, error)
            case Released(stage=stage):
                handle.unacked.discard(stage)
                self._maybe_released(handle)

    def _emit(self, request_id: str, name: str, fields: dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(request_id, name, fields)


class RequestStream:
    """The caller's side of one request: an async iterator and an async context manager.

    Leaving the context (or a bare ``async for``) before the end aborts the request;
    a deadline aborts it and raises :class:`RequestTimeout`.
    """

    def __init__(
        self,
        coordinator: Coordinator,
        request_id: str,
        inputs: Any,
        params: dict[str, Any] | None,
        timeout: float | None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self._coordinator = coordinator
        self._metadata = metadata
        self._request_id = request_id
        self._inputs = inputs
        self._params = params
        timeout = coordinator.default_timeout if timeout is None else timeout
        self._timeout = timeout
        self._deadline = math.inf
        self._handle: RequestHandle | None = None
        self._done = False
        self._finalizer: weakref.finalize[Any, Any] | None = None

    @property
    def request_id(self) -> str:
        return self._request_id

    @property
    def result(self) -> Any:
        """The terminal result: ``payload.data``, or ``{stage: data}`` with several terminals."""
        assert self._handle is not None and self._done
        results = self._handle.results
        if len(self._handle.terminals) == 1:
            return next(iter(results.values()))
        return dict(results)

    def _start(self) -> RequestHandle:
        if self._handle is None:
            if self._timeout is not None:
                if self._timeout <= 0:
                    raise ValueError(f"timeout must be > 0, got {self._timeout}")
                self._deadline = trio.current_time() + self._timeout
            coordinator = self._coordinator
            self._handle = coordinator._open(self._request_id, self._inputs, self._params, self._metadata)
            self._handle.deadline = self._deadline
            token = trio.lowlevel.current_trio_token()
            self._finalizer = weakref.finalize(self, _leave_later, token, coordinator, self._handle)
            self._finalizer.atexit = False
        return self._handle

    async def __aenter__(self) -> RequestStream:
        self._start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Abort the request unless it already finished; idempotent."""
        if self._handle is not None:
            self._coordinator._leave(self._handle)
        if self._finalizer is not None:
            self._finalizer.detach()
        self._done = True

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> StreamMessage | CompleteMessage:
        handle = self._start()
        if self._done and handle.finished and not handle.events:
            raise StopAsyncIteration
        try:
            if self._deadline == math.inf:
                event = await handle.events.receive()
            else:
                with trio.fail_after(max(self._deadline - trio.current_time(), 0)):
                    event = await handle.events.receive()
        except trio.EndOfChannel:
            self._done = True
            self.close()
            raise StopAsyncIteration from None
        except trio.TooSlowError:
            assert self._timeout is not None
            error = RequestTimeout(self._request_id, self._timeout)
            self._coordinator._leave(handle, error)
            self.close()
            raise error from None
        except BaseException:
            self.close()
            raise
        match event:
            case StreamMessage(from_stage=stage):
                self._coordinator._consumed(handle, stage)
                return event
            case CompleteMessage():
                return event
            case _:
                self._done = True
                self.close()
                raise event


def _leave_later(token: trio.lowlevel.TrioToken, coordinator: Coordinator, handle: RequestHandle) -> None:
    """A stream was dropped without closing: abort its request from the trio thread."""
    try:
        token.run_sync_soon(coordinator._leave, handle)
    except (trio.RunFinishedError, OSError):
        return
