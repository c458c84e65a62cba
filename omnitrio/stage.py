"""The stage: an IO shell on trio around one scheduler.

::

    stage nursery
    ├── scheduler supervisor   SchedulerSupervisor: the scheduler thread (via SchedulerBridge);
    │                          a fresh scheduler when one crashes (failing the requests it
    │                          held), within the stage's restart policy; else the stage is dead
    └── request tasks          one per live request: StageRequest.serve()

Messages for the stage arrive through :meth:`Stage.deliver`, a synchronous call made by
whoever routes them (another stage in this process, the coordinator, or the socket
reader of this process).  It keeps per-edge order: a payload, chunk or end-of-stream is
handed to the scheduler in the order it arrived; what is delivered before the inbox feed
runs next reaches the scheduler's inbox in one atomic step (:mod:`omnitrio.inbox_feed`
says precisely when that is).

A dead stage (its scheduler could not be rebuilt) fails every request it held and every
new one with ``StageDead``, naming the stage and why; the other stages keep serving.

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
from omnitrio.envelopes import UNBOUND, Abort, Chunk, Credit, Cut, Done, Failed, Payload, Released, ToStage
from omnitrio.events import EventRecorder
from omnitrio.flow import hold_back
from omnitrio.inbox_feed import InboxFeed
from omnitrio.stage_request import Phase, StageRequest
from omnitrio.supervision import RestartPolicy, SchedulerSupervisor
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
        self.scheduler: Any = None
        self.supervisor = SchedulerSupervisor(
            self.name,
            build_scheduler,
            RestartPolicy.of(plan.config),
            self._new_bridge,
            InboxFeed(self._on_handed_over),
            on_crash=self._scheduler_crashed,
            on_dead=self._scheduler_dead,
        )

    # -- health ---------------------------------------------------------------------

    @property
    def restarts(self) -> int:
        """Schedulers built after the first."""
        return self.supervisor.restarts

    @property
    def abandoned(self) -> bool:
        """Whether shutdown left its scheduler's thread running (``start()`` outlived ``stop()``
        by ``scheduler_stop_timeout``)."""
        return self.bridge is not None and self.bridge.abandoned

    @property
    def dead(self) -> str | None:
        """Why the stage is dead (its scheduler could not be rebuilt); None while it serves."""
        return self.supervisor.dead_reason

    @property
    def queue_depth(self) -> int:
        """Messages waiting for the scheduler: in its inbox (when it can say) and in the feed."""
        qsize = getattr(getattr(self.scheduler, "inbox", None), "qsize", None)
        return (int(qsize()) if callable(qsize) else 0) + self.supervisor.feed.waiting

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
            await nursery.start(self.supervisor.run)
            task_status.started()

    def _new_bridge(self, scheduler: Any, feed: InboxFeed) -> SchedulerBridge:
        """A scheduler life begins: its bridge is the one requests use from now on."""
        self.scheduler = scheduler
        self.bridge = SchedulerBridge(
            scheduler,
            self.name,
            self._on_outputs,
            feed=feed,
            nice=self._scheduler_nice,
            first_output=self._no_output_yet,
            idle=self._loop_idle,
            stop_timeout=self.plan.config.scheduler_stop_timeout,
        )
        return self.bridge

    def _scheduler_crashed(self, failure: BaseException) -> None:
        for req in list(self.requests.values()):
            req.lost(failure)

    def _scheduler_dead(self, reason: str) -> None:
        for req in list(self.requests.values()):
            req.dead(reason)

    # -- inbound --------------------------------------------------------------------

    def deliver(self, envelope: ToStage, leases: Sequence[Any] = ()) -> None:
        """Accept one message for this stage (synchronous; never blocks)."""
        match envelope:
            case Abort(rid=rid, inc=inc):
                self.tombstones.add(rid, inc)
                req = self.requests.get(rid)
                if req is not None and req.inc <= inc:
                    req.abort()  # its task answers with Released when it has let go
                    if req.inc in (inc, UNBOUND):
                        return
                self.board.send(Released(rid, inc, self.name))
            case Credit(rid=rid, inc=inc, n=n, src=src):
                req = self.requests.get(rid)
                if req is not None and (req.inc == inc or req.inc == UNBOUND):
                    req.grant(src, n)
            case Payload() | Chunk() | Done() | Cut():
                req = self._request_for(envelope)
                if req is None:
                    self.board.release(leases)
                else:
                    req.arrive(envelope, leases)

    def _request_for(self, envelope: Payload | Chunk | Done | Cut) -> StageRequest | None:
        """The live request this input belongs to, made (and its task started) if new;
        None when the input is for a buried or earlier life of the id, clashes with an
        earlier life the stage still holds, or the stage is full."""
        rid, inc = envelope.rid, envelope.inc
        req = self.requests.get(rid)
        if req is not None:
            if req.inc == inc or req.inc == UNBOUND:
                return req
            if req.inc < inc:
                self._clash(req, inc)
            return None  # else a late input of an earlier life
        if self.tombstones.buries(rid, inc) or self._nursery is None:
            return None
        if self.supervisor.dead_reason is not None:
            self.board.send(Failed(rid, inc, self.name, "StageDead", self.supervisor.dead_reason, False))
            self.tombstones.add(rid, inc)
            return None
        limit = self.plan.config.max_queue
        if limit is not None and len(self.requests) >= limit:
            self.board.send(
                Failed(rid, inc, self.name, "StageOverloaded", f"stage queue is full ({limit} requests)", True)
            )
            self.tombstones.add(rid, inc)
            return None
        return self._start(StageRequest(self, rid, inc))

    def _clash(self, held: StageRequest, inc: int) -> None:
        """An input of a later life of an id this stage still holds: the later life fails (its
        caller sees why), and the stage lets go of the earlier one, which nobody waits for any more
        (the coordinator gives an id a new life only once it is done with the old one)."""
        rid = held.request_id
        message = f"request id {rid!r} clashes with an earlier request of that id this stage still holds"
        log.warning("stage %r: %s; letting go of the earlier one", self.name, message)
        self.tombstones.add(rid, inc)
        self.board.send(Failed(rid, inc, self.name, "RequestClash", message))
        held.abort()

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
                    hold_back(self.bridge.outbox, backlog)
            elif out.type == "admitted" and self._nursery is not None:
                self._start(StageRequest(self, out.request_id, UNBOUND, Phase.SCHEDULED))
