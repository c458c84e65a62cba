"""The stage: an IO shell on trio around one scheduler.

::

    stage nursery
    ├── scheduler supervisor   the scheduler thread (via SchedulerBridge); a fresh
    │                          scheduler if start() raises, failing the requests it held
    └── request tasks          one per live request: serve_request()

Messages for the stage arrive through :meth:`Stage.deliver`, a synchronous call made by
whoever routes them (another stage in this process, the coordinator, or the socket
reader of this process).  It keeps per-edge order: a payload, chunk or end-of-stream is
handed to the scheduler in the order it arrived, and everything delivered in one pass of
the trio loop reaches the scheduler's inbox in one atomic step.

Abort is ``scope.cancel()``: the request task's ``finally`` tells the scheduler, releases
relay leases and answers the coordinator, whatever the exit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import trio

from omnitrio.bridge import LoopIdle, SchedulerBridge
from omnitrio.contract import IncomingMessage, OutgoingMessage, StageOverloaded, StagePayload, StreamItem
from omnitrio.envelopes import (
    COORDINATOR,
    Abort,
    Chunk,
    Complete,
    Credit,
    Done,
    Failed,
    Payload,
    Released,
    StreamOut,
    ToStage,
)
from omnitrio.events import EventRecorder
from omnitrio.fanin import FanIn, FanInError
from omnitrio.requests import BACKLOG_HIGH, BACKLOG_LOW, CREDIT_BATCH, RequestScope, Tombstones
from omnitrio.switchboard import Switchboard
from omnitrio.topology import StageFunctionError, StagePlan

OUTPUT_SLICE = 32
"""Most outputs one request handles per turn: a burst leaves in batches, other requests wait one slice."""

log = logging.getLogger(__name__)


class Stage:
    """One stage of the pipeline, running inside some process's trio loop."""

    def __init__(
        self,
        plan: StagePlan,
        build_scheduler: Callable[[], Any],
        switchboard: Switchboard,
        recorder: EventRecorder | None = None,
        *,
        scheduler_nice: int = 0,
        loop_idle: LoopIdle | None = None,
    ) -> None:
        """``scheduler_nice``: how much nicer the scheduler thread runs; with ``loop_idle`` (this
        loop's instrument) the bridge hands a request's first output to the idle loop.  Both
        for stage processes only: where the caller and every stage share one loop, that loop is
        idle only when the whole pipeline is, and waiting for it cost 5-12 % throughput (bench
        A/B, inline)."""
        self.plan = plan
        self._scheduler_nice = scheduler_nice
        self._loop_idle = loop_idle
        self._rec = recorder
        self.name = plan.name
        self._build_scheduler = build_scheduler
        self._board = switchboard
        self._requests: dict[str, RequestScope] = {}
        self._tombstones = Tombstones()
        self._nursery: trio.Nursery | None = None
        self._bridge: SchedulerBridge | None = None
        self.restarts = 0
        self.scheduler: Any = None

    # -- health ---------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Messages waiting for the scheduler: in its inbox (when it can say) and in the bridge."""
        qsize = getattr(getattr(self.scheduler, "inbox", None), "qsize", None)
        waiting = self._bridge.waiting if self._bridge is not None else 0
        return (int(qsize()) if callable(qsize) else 0) + waiting

    def holds(self, request_id: str, inc: int) -> bool:
        """True while this stage has a scope for that incarnation of the request."""
        req = self._requests.get(request_id)
        return req is not None and req.inc == inc

    @property
    def active_requests(self) -> int:
        """Requests this stage holds any state for (fan-in inputs, streams, scheduler work)."""
        return len(self._requests)

    # -- lifetime -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``started`` once the scheduler has warmed up."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self._supervise_scheduler)
            task_status.started()

    async def _supervise_scheduler(self, *, task_status: trio.TaskStatus[None]) -> None:
        started = False
        while True:
            if started:
                # Synchronously: requests keep arriving and must find the new bridge.
                self.scheduler = self._build_scheduler()
            else:
                # Loading models can take seconds: build in a worker thread so the IO loop
                # (and the other stages of this process, loading in parallel) stay responsive.
                self.scheduler = await trio.to_thread.run_sync(self._build_scheduler)
            bridge = SchedulerBridge(
                self.scheduler,
                self.name,
                self._on_outputs,
                self._on_handed_over,
                nice=self._scheduler_nice,
                first_output=self._no_output_yet,
                idle=self._loop_idle,
            )
            self._bridge = bridge
            if started:
                failure = await bridge.run()
            else:
                failure = await self._first_run(bridge, task_status)
                started = True
            if failure is None:
                return
            log.error("stage %r: scheduler crashed, restarting it: %r", self.name, failure)
            self.restarts += 1
            for req in list(self._requests.values()):
                if req.in_scheduler:
                    req.in_scheduler = False
                    req.fail_with(RuntimeError(f"scheduler crashed: {type(failure).__name__}: {failure}"))

    async def _first_run(self, bridge: SchedulerBridge, task_status: trio.TaskStatus[None]) -> BaseException | None:
        result: list[BaseException | None] = []

        async def run_bridge(*, task_status: trio.TaskStatus[None]) -> None:
            result.append(await bridge.run(task_status=task_status))

        async with trio.open_nursery() as nursery:
            await nursery.start(run_bridge)
            task_status.started()
        return result[0]

    # -- inbound --------------------------------------------------------------------

    def deliver(self, envelope: ToStage, leases: Sequence[Any] = ()) -> None:
        """Accept one message for this stage (synchronous; never blocks)."""
        match envelope:
            case Abort(rid=rid, inc=inc):
                self._on_abort(rid, inc)
            case Credit(rid=rid, inc=inc, n=n, src=src):
                req = self._requests.get(rid)
                if req is not None and req.inc == inc:
                    req.grant(src, n)
            case Payload() | Chunk() | Done():
                req = self._scope_for(envelope)
                if req is None:
                    self._board.release(leases)
                    return
                req.leases.extend(leases)
                self._accept(req, envelope)

    def _scope_for(self, envelope: Payload | Chunk | Done) -> RequestScope | None:
        rid, inc = envelope.rid, envelope.inc
        req = self._requests.get(rid)
        if req is not None:
            return req if req.inc == inc else None
        if self._tombstones.buries(rid, inc) or self._nursery is None:
            return None
        limit = self.plan.config.max_queue
        if limit is not None and len(self._requests) >= limit:
            self._board.send(
                Failed(rid, inc, self.name, "StageOverloaded", f"stage queue is full ({limit} requests)", True)
            )
            self._tombstones.add(rid, inc)
            return None
        req = RequestScope(rid, inc)
        if self.plan.wait_for:
            req.fan_in = FanIn(self.plan, rid)
        self._requests[rid] = req
        self._nursery.start_soon(self.serve_request, req)
        return req

    def _accept(self, req: RequestScope, envelope: Payload | Chunk | Done) -> None:
        bridge = self._bridge
        assert bridge is not None
        match envelope:
            case Payload(src=src, body=body):
                if self._rec is not None:
                    kind = "submit" if src == COORDINATOR else "payload"
                    self._rec.emit(req.request_id, self.name, "stage_input_received", from_stage=src, kind=kind)
                try:
                    payload = self._gather(req, src, body)
                except (FanInError, StageFunctionError) as exc:
                    req.fail_with(exc)
                    return
                if payload is not None:
                    req.got_payload = req.in_scheduler = True
                    bridge.put(IncomingMessage(req.request_id, "new_request", payload))
                    if self._rec is not None:
                        self._rec.emit(req.request_id, self.name, "stage_dispatch")
            case Chunk(src=src, chunk_id=chunk_id, body=body, metadata=metadata):
                if self._refuse_early_stream(req, f"stream chunk #{chunk_id} from {src!r}"):
                    return
                req.in_scheduler = True
                if self._rec is not None and chunk_id == 0:
                    self._rec.emit(
                        req.request_id, self.name, "stage_input_received", from_stage=src, kind="chunk", chunk_id=0
                    )
                item = StreamItem(chunk_id, body, src, metadata)
                bridge.put(IncomingMessage(req.request_id, "stream_chunk", item))
            case Done(src=src):
                if self._refuse_early_stream(req, f"end of stream from {src!r}"):
                    return
                req.in_scheduler = True
                bridge.put(IncomingMessage(req.request_id, "stream_done", src))

    def _gather(self, req: RequestScope, src: str, body: Any) -> Any:
        """The payload to hand the scheduler, or None while fan-in inputs are missing."""
        if req.fan_in is not None and src != COORDINATOR:
            complete, merged = req.fan_in.add(src, body)
            return merged if complete else None
        if req.got_payload:
            raise FanInError(f"stage {self.name!r} got a second payload (from {src!r}) for one request")
        return body

    def _refuse_early_stream(self, req: RequestScope, what: str) -> bool:
        if req.got_payload or self.plan.config.can_accept_stream_before_payload:
            return False
        req.fail_with(
            FanInError(
                f"stage {self.name!r} got {what} before its payload and is not configured to accept "
                "stream data before the payload (can_accept_stream_before_payload=false)"
            )
        )
        return True

    def _on_abort(self, rid: str, inc: int) -> None:
        self._tombstones.add(rid, inc)
        req = self._requests.get(rid)
        if req is not None and req.inc <= inc:
            req.abort()  # its task answers with Released when it has let go
            return
        self._board.send(Released(rid, inc, self.name))

    def _on_handed_over(self, messages: list[IncomingMessage]) -> None:
        """Chunks reached the scheduler: give their producers credit to send more."""
        requests = self._requests
        for msg in messages:
            if msg.type == "stream_chunk" and (req := requests.get(msg.request_id)) is not None:
                producer = msg.data.from_stage
                if req.count_fed(producer):
                    self._board.send(Credit(req.request_id, req.inc, producer, CREDIT_BATCH, self.name))

    def _no_output_yet(self, request_id: str) -> bool:
        """Whether the scheduler's output for ``request_id`` would be its first here; the
        bridge asks on the scheduler thread (a read of the live table, never a change)."""
        req = self._requests.get(request_id)
        return req is not None and not req.produced

    def _on_outputs(self, outputs: list[OutgoingMessage]) -> None:
        """Called by the bridge in the trio thread; outputs of inactive requests are dropped."""
        requests = self._requests
        for out in outputs:
            req = requests.get(out.request_id)
            if req is not None:
                req.produced = True
                req.push(out)
                if req.backlog >= BACKLOG_HIGH and self._bridge is not None:
                    self._bridge.pause()
            elif out.type == "admitted" and self._nursery is not None:
                admitted = RequestScope(out.request_id, 0)
                admitted.got_payload = admitted.in_scheduler = True
                requests[out.request_id] = admitted
                self._nursery.start_soon(self.serve_request, admitted)

    # -- the life of a request --------------------------------------------------------

    async def serve_request(self, req: RequestScope) -> None:
        """Everything one request does at this stage, start to finish."""
        try:
            with req.cancel_scope:
                async for outputs in req.outputs.slices(OUTPUT_SLICE):
                    for out in outputs:
                        if req.aborted:  # the output raced the abort out of the channel
                            return
                        if self._bridge is not None and self._bridge.paused and req.backlog <= BACKLOG_LOW:
                            self._bridge.resume()
                        match out.type:
                            case "stream":
                                await self._send_stream(req, out)
                            case "result":
                                self._route_result(req, out.data)
                                req.outcome = "done"
                                return
                            case "error":
                                req.outcome = "failed"
                                self._report_failure(req, out.data)
                                return
        except (StageFunctionError, FanInError) as exc:
            req.outcome = "failed"
            self._report_failure(req, exc)
        finally:
            self._let_go(req)

    async def _send_stream(self, req: RequestScope, out: OutgoingMessage) -> None:
        plan, rid = self.plan, req.request_id
        if out.target is not None:
            targets: Sequence[str] = (out.target,)
        elif plan.stream_to:
            targets = plan.stream_to
        elif plan.terminal:
            await req.take_credit(COORDINATOR)
            modality = _modality(out)
            self._board.send(StreamOut(rid, req.inc, self.name, req.next_chunk_id(COORDINATOR), out.data, modality))
            return
        else:
            raise StageFunctionError(
                f"stream output of stage {self.name!r}", "RuntimeError", "no target, no stream_to, and not terminal"
            )
        for target in targets:
            if target not in plan.stream_to and target not in plan.next:
                raise StageFunctionError(
                    f"stream output of stage {self.name!r}", "ValueError", f"target {target!r} is not in stream_to"
                )
            await req.take_credit(target)  # the target stage's scheduler has room for it
            chunk_id = req.next_chunk_id(target)
            if self._rec is not None and chunk_id == 0:
                self._rec.emit(rid, self.name, "stage_first_stream_chunk_sent", to=target)
            self._board.send(Chunk(rid, req.inc, target, self.name, chunk_id, out.data, out.metadata))

    def _route_result(self, req: RequestScope, result: Any) -> None:
        """End-of-stream signals first, then the result to each next stage (or the caller)."""
        plan, rid, inc = self.plan, req.request_id, req.inc
        if plan.stream_to:
            for target in plan.stream_done_targets(rid, result):
                self._board.send(Done(rid, inc, target, self.name))
        rec = self._rec
        if plan.terminal:
            data = result.data if isinstance(result, StagePayload) else result
            if rec is not None:
                rec.emit(rid, self.name, "stage_complete", terminal=True, next=[])
            self._board.send(Complete(rid, inc, self.name, data))
            return
        targets = plan.targets(rid, result)
        fan_out = len(targets) > 1
        bodies = [plan.project(t, result, fan_out=fan_out) for t in targets]
        if rec is not None:
            rec.emit(rid, self.name, "stage_complete", terminal=False, next=targets)
        for target, body in zip(targets, bodies, strict=True):
            if rec is not None:  # before the send: a local send delivers at once
                rec.emit(rid, self.name, "stage_hop_sent", to_stage=target, transport=self._board.transport_to(target))
            self._board.send(Payload(rid, inc, target, self.name, body))

    def _report_failure(self, req: RequestScope, error: Any) -> None:
        if isinstance(error, BaseException):
            error_type = getattr(error, "error_type", None) or type(error).__name__
            message = str(error)
        else:
            error_type, message = "Error", str(error)
        self._tombstones.add(req.request_id, req.inc)
        if self._rec is not None:
            self._rec.emit(req.request_id, self.name, "stage_failed", error_type=error_type)
        overloaded = isinstance(error, StageOverloaded)
        self._board.send(Failed(req.request_id, req.inc, self.name, error_type, message, overloaded))

    def _let_go(self, req: RequestScope) -> None:
        if self._requests.get(req.request_id) is req:
            del self._requests[req.request_id]
        if self._bridge is not None and self._bridge.paused:
            self._bridge.resume()  # the backlog that paused it may have been this request's
        req.outputs.close()
        if req.in_scheduler and req.outcome != "done" and self._bridge is not None:
            self._bridge.abort(req.request_id)
        self._board.let_go(req.request_id, req.inc, self.name, req.leases)
        req.leases.clear()
        if req.aborted:
            if self._rec is not None:
                self._rec.emit(req.request_id, self.name, "stage_aborted")
            self._board.send(Released(req.request_id, req.inc, self.name))


def _modality(out: OutgoingMessage) -> str | None:
    if out.metadata and "modality" in out.metadata:
        return str(out.metadata["modality"])
    if isinstance(out.data, dict) and isinstance(out.data.get("modality"), str):
        return str(out.data["modality"])
    return None
