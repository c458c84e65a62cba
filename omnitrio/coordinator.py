"""The coordinator: submit, stream, abort; the table of live requests; fail-fast.

Each submission (a :class:`~omnitrio.caller.Submission`) gets a
:class:`~omnitrio.caller.CallerRequest` that lives in the coordinator's table until the
request is finished everywhere: completed by every expected terminal stage, or failed,
aborted or past its deadline — and every stage asked to let go of it (all of them after
a failure; after a completion those that may still hold it, :mod:`omnitrio.lingering`)
has answered with ``Released``.  Only then may its id be used again, so a reused id never
meets a stage or scheduler that still holds its previous life; a new request with that id
waits for it (:meth:`Coordinator.admit`).  :mod:`omnitrio.caller` holds the request's
life; this module admits requests, keeps the table and routes what stages send back.

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
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import trio

from omnitrio.caller import CallerRequest, Phase, RequestStream, Submission
from omnitrio.envelopes import (
    COORDINATOR,
    UNBOUND,
    Complete,
    Failed,
    Payload,
    Released,
    Skipped,
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
)
from omnitrio.lingering import Lingering
from omnitrio.messages import StreamMessage
from omnitrio.replicas import Bindings, Replicas
from omnitrio.topology import MAIN, StageFunctionError, Topology

__all__ = ["Coordinator", "RequestAges", "RequestStream", "Submission"]


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
        self.send = send
        """How envelopes reach the stages (the switchboard's ``send``)."""
        self._stages = tuple(stage_names)
        self._requests: dict[str, CallerRequest] = {}
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
        requests = self._requests.values()
        overdue = sum(1 for request in requests if request.deadline < now)
        oldest = min((request.opened for request in requests), default=None)
        return RequestAges(len(self._requests), overdue, None if oldest is None else time.perf_counter() - oldest)

    def close(self) -> None:
        """Refuse new requests; fail the live ones (the pipeline is going away)."""
        self._closed = True
        for request in list(self._requests.values()):
            if request.phase is Phase.RUNNING:
                self.emit(request.request_id, REQUEST_ABORTED, {"reason": "shutdown"})
            request.close(RequestAborted(request.request_id, "aborted: the pipeline shut down"))

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

        With several terminal stages the result is ``{stage: data}``: one entry per terminal
        that answered.  A terminal that routes cut off (every stage that could send to it
        routed the request elsewhere, :mod:`omnitrio.reach`) is not waited for: the request
        completes as soon as the others answered, and fails with :class:`RequestFailed`
        naming the stage whose route left out the last one when none answered.  ``params`` and
        ``metadata`` become the fields of the ``OmniRequest`` every stage sees.  Raises
        :class:`RequestFailed`, :class:`BadRequest`, :class:`RequestAborted`, :class:`RequestTimeout`,
        :class:`Overloaded` or :class:`DuplicateRequest`.
        """
        async with self.stream(request_id, inputs, params=params, timeout=timeout, metadata=metadata) as stream:
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
        """Stream one request: ``StreamMessage`` items, then ``CompleteMessage`` per terminal
        that answered (routes may cut one off, as for :meth:`submit`).

        Use ``async with pipeline.stream(...) as s: async for msg in s``; leaving the block
        early aborts the request everywhere.  A bare ``async for`` works too.
        """
        timeout = self.default_timeout if timeout is None else timeout
        return RequestStream(self.admit, Submission(request_id, inputs, params, timeout, metadata))

    async def abort(self, request_id: str, *, wait: bool = False) -> bool:
        """Abort a live request at every stage.

        Returns True when it aborted a live request, False when the id is unknown or the
        request already finished.  With ``wait=True`` it returns only once every stage
        has released the request.
        """
        request = self._requests.get(request_id)
        if request is None:
            return False
        aborted = request.fail(RequestAborted(request_id), REQUEST_ABORTED, {"reason": "abort"})
        if wait:
            await request.gone.wait()
        return aborted

    async def admit(self, submission: Submission, deadline: float = math.inf) -> CallerRequest:
        """:meth:`open`, once an earlier request with the same id whose caller has its answer is
        gone (every stage it asked to let go has): what :class:`RequestStream` calls.

        Raises what :meth:`open` raises, and :class:`RequestTimeout` when ``deadline`` passes first.
        """
        request_id = submission.request_id
        earlier = self._requests.get(request_id) if isinstance(request_id, str) else None
        while earlier is not None and earlier.phase is Phase.RELEASING:
            with trio.move_on_at(deadline):
                await earlier.gone.wait()
            if not earlier.gone.is_set():
                raise RequestTimeout(request_id, submission.timeout or 0)
            earlier = self._requests.get(request_id)
        return self.open(submission, deadline)

    def open(self, submission: Submission, deadline: float = math.inf) -> CallerRequest:
        """Admit ``submission`` and send it to the entry stage (what :class:`RequestStream` calls).

        Raises :class:`PipelineClosed`, :class:`DuplicateRequest`, :class:`Overloaded`,
        ``ValueError`` for an id that is not a non-empty string, or :class:`RequestFailed`
        when routing code raises.
        """
        request_id = submission.request_id
        if self._closed:
            raise PipelineClosed("the pipeline is closed")
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if request_id in self._requests:
            raise DuplicateRequest(request_id, f"request {request_id!r} is still live; use another id")
        if self.max_in_flight is not None and len(self._requests) >= self.max_in_flight:
            self.emit(request_id, REQUEST_REJECTED, {"reason": "max_in_flight"})
            raise Overloaded(
                request_id, f"{len(self._requests)} requests in flight (max_in_flight={self.max_in_flight})"
            )
        try:
            terminals = self.topology.expected_terminals(request_id, submission.inputs)
        except StageFunctionError as exc:
            raise RequestFailed(request_id, COORDINATOR, exc.error_type, str(exc)) from exc
        request = CallerRequest(self, request_id, self._bindings.open(), terminals, deadline)
        self._requests[request_id] = request
        self.emit(request_id, REQUEST_SUBMITTED, {})
        try:
            self.send(Payload(request_id, request.inc, self.topology.entry, COORDINATOR, submission.payload()))
        except StageFunctionError as exc:
            self.forget(request)
            raise RequestFailed(request_id, self.topology.entry, exc.error_type, str(exc)) from exc
        return request

    # -- what a request asks of its table (omnitrio.caller.Table) ------------------------

    def holders(self, inc: int) -> set[str]:
        return {stage for stage in self._stages if self._bindings.reachable(stage, inc)}

    @property
    def lingering(self) -> Lingering:
        return self.topology.lingering

    def forget(self, request: CallerRequest) -> None:
        """The request is finished everywhere: its id may be used again."""
        if self._requests.get(request.request_id) is request:
            del self._requests[request.request_id]
            self._bindings.close(request.inc)

    def emit(self, request_id: str, name: str, fields: dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(request_id, name, fields)

    # -- stage processes (omnitrio.children.ProcessEvents) -----------------------------

    def process_gone(self, process: str, error_for: Callable[[str], RequestError]) -> None:
        """A stage process died: fail every live request bound to it and stop waiting for its releases."""
        self._bindings.gone(process)
        group = self._bindings.replicas.group_of(process)[0]
        dead = set(self._bindings.replicas.stages_in(group, self._stages))
        for request in list(self._requests.values()):
            if not self._bindings.holds(process, request.inc):
                continue
            error = error_for(request.request_id)
            fields = {
                "stage": getattr(error, "stage", ""),
                "error_type": getattr(error, "error_type", ""),
                "message": getattr(error, "error_message", str(error)),
            }
            request.fail(error, REQUEST_FAILED, fields)
            request.released(dead)

    def process_up(self, process: str) -> None:
        """A restarted stage process answers aborts again and takes new requests."""
        self._bindings.up(process)

    # -- from the stages -------------------------------------------------------------

    def deliver(self, envelope: ToCoordinator) -> None:
        """Accept one message from a stage (synchronous; never blocks)."""
        request = self._requests.get(envelope.rid)
        if request is None or (request.inc != envelope.inc and envelope.inc != UNBOUND):
            return
        match envelope:
            case StreamOut(src=src, chunk_id=chunk_id, body=body, modality=modality):
                if chunk_id == 0:
                    self.emit(envelope.rid, FIRST_STREAM_CHUNK, {"from_stage": src, "modality": modality})
                if request.phase is Phase.RUNNING:  # a chunk after the end is dropped (the hot path: no call)
                    request.events.put(StreamMessage(envelope.rid, src, chunk_id, body, modality))
            case Complete(src=src, body=body):
                request.complete(src, body)
            case Failed(stage=stage, error_type=error_type, message=message, overloaded=overloaded, code=code):
                error: RequestError
                fields = {"stage": stage, "error_type": error_type, "message": message}
                if code is not None:
                    error = BadRequest(envelope.rid, stage, message, code, envelope.param)
                    request.fail(error, REQUEST_INVALID, {**fields, "code": code})
                elif overloaded:
                    error = Overloaded(envelope.rid, f"stage {stage!r}: {message}")
                    request.fail(error, REQUEST_FAILED, fields)
                else:
                    error = RequestFailed(envelope.rid, stage, error_type, message)
                    request.fail(error, REQUEST_FAILED, fields)
            case Released(stage=stage):
                request.released((stage,))
            case Skipped(stage=stage, targets=targets, streamed=streamed):
                request.skipped(stage, targets, streamed, self.topology.reach)
