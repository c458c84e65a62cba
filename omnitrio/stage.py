"""The stage: an IO shell on trio around one scheduler.

::

    stage nursery
    ├── scheduler supervisor   the scheduler thread (via SchedulerBridge); a fresh
    │                          scheduler if start() raises, failing the requests it held
    └── request tasks          one per live request: StageRequest.serve()

Messages for the stage arrive through :meth:`Stage.deliver`, a synchronous call made by
whoever routes them (another stage in this process, the coordinator, or the socket
reader of this process).  It keeps per-edge order: a payload, chunk or end-of-stream is
handed to the scheduler in the order it arrived, and everything delivered in one pass of
the trio loop reaches the scheduler's inbox in one atomic step.

Each live request is a :class:`~omnitrio.stage_request.StageRequest`, served by its own
task; abort is its ``cancel_scope.cancel()``, and its finish tells the scheduler, releases
relay leases and answers the coordinator, whatever the exit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import trio

from omnitrio.bridge import LoopIdle, SchedulerBridge
from omnitrio.contract import IncomingMessage, OutgoingMessage
from omnitrio.envelopes import Abort, Chunk, Credit, Done, Failed, Payload, Released, ToStage
from omnitrio.events import EventRecorder
from omnitrio.flow import hold_back
from omnitrio.stage_request import Phase, StageRequest
from omnitrio.switchboard import Switchboard
from omnitrio.tombstones import Tombstones
from omnitrio.topology import StagePlan

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
        are for stage processes: where the caller and every stage share one loop, that loop is
        idle only when the whole pipeline is, so waiting for it would only slow the pipeline."""
        self.plan = plan
        self._scheduler_nice = scheduler_nice
        self._loop_idle = loop_idle
        self.recorder = recorder
        self.name = plan.name
        self._build_scheduler = build_scheduler
        self.board = switchboard
        self.requests: dict[str, StageRequest] = {}
        self.tombstones = Tombstones()
        self._nursery: trio.Nursery | None = None
        self.bridge: SchedulerBridge | None = None
        self.restarts = 0
        self.scheduler: Any = None

    # -- health ---------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Messages waiting for the scheduler: in its inbox (when it can say) and in the bridge."""
        qsize = getattr(getattr(self.scheduler, "inbox", None), "qsize", None)
        waiting = self.bridge.waiting if self.bridge is not None else 0
        return (int(qsize()) if callable(qsize) else 0) + waiting

    def holds(self, request_id: str, inc: int) -> bool:
        """True while this stage holds that incarnation of the request."""
        req = self.requests.get(request_id)
        return req is not None and req.inc == inc

    @property
    def active_requests(self) -> int:
        """Requests this stage holds any state for (fan-in inputs, streams, scheduler work)."""
        return len(self.requests)

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
            self.bridge = bridge
            if started:
                failure = await bridge.run()
            else:
                failure = await self._first_run(bridge, task_status)
                started = True
            if failure is None:
                return
            log.error("stage %r: scheduler crashed, restarting it: %r", self.name, failure)
            self.restarts += 1
            for req in list(self.requests.values()):
                req.lost(failure)

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
                self.tombstones.add(rid, inc)
                req = self.requests.get(rid)
                if req is not None and req.inc <= inc:
                    req.abort()  # its task answers with Released when it has let go
                else:
                    self.board.send(Released(rid, inc, self.name))
            case Credit(rid=rid, inc=inc, n=n, src=src):
                req = self.requests.get(rid)
                if req is not None and req.inc == inc:
                    req.grant(src, n)
            case Payload() | Chunk() | Done():
                req = self._request_for(envelope)
                if req is None:
                    self.board.release(leases)
                else:
                    req.arrive(envelope, leases)

    def _request_for(self, envelope: Payload | Chunk | Done) -> StageRequest | None:
        """The live request this input belongs to, made (and its task started) if new;
        None when the input is for a buried life of the id or the stage is full."""
        rid, inc = envelope.rid, envelope.inc
        req = self.requests.get(rid)
        if req is not None:
            return req if req.inc == inc else None
        if self.tombstones.buries(rid, inc) or self._nursery is None:
            return None
        limit = self.plan.config.max_queue
        if limit is not None and len(self.requests) >= limit:
            self.board.send(
                Failed(rid, inc, self.name, "StageOverloaded", f"stage queue is full ({limit} requests)", True)
            )
            self.tombstones.add(rid, inc)
            return None
        return self._start(StageRequest(self, rid, inc))

    def _start(self, req: StageRequest) -> StageRequest:
        assert self._nursery is not None
        self.requests[req.request_id] = req
        self._nursery.start_soon(req.serve)
        return req

    # -- the scheduler's side -----------------------------------------------------------

    def _on_handed_over(self, messages: list[IncomingMessage]) -> None:
        """Chunks reached the scheduler: their producers get credit back."""
        requests = self.requests
        for msg in messages:
            if msg.type == "stream_chunk" and (req := requests.get(msg.request_id)) is not None:
                req.handed_over(msg.data)

    def _no_output_yet(self, request_id: str) -> bool:
        """Whether the scheduler's output for ``request_id`` would be its first here; the
        bridge asks on the scheduler thread (a read of the live table, never a change)."""
        req = self.requests.get(request_id)
        return req is not None and not req.answered

    def _on_outputs(self, outputs: list[OutgoingMessage]) -> None:
        """Called by the bridge in the trio thread; outputs of inactive requests are dropped."""
        requests = self.requests
        for out in outputs:
            req = requests.get(out.request_id)
            if req is not None:
                backlog = req.push(out)
                if self.bridge is not None:
                    hold_back(self.bridge, backlog)
            elif out.type == "admitted" and self._nursery is not None:
                self._start(StageRequest(self, out.request_id, 0, Phase.SCHEDULED))
