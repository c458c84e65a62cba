"""One request at one stage, start to finish: arrive → scheduler → outputs → finish.

A :class:`StageRequest` is made when the first message of a request reaches a stage (or
its scheduler admits it) and lives until that request's task there ends, whatever the
end.  It owns everything the request holds at the stage — its cancel scope, its output
mailbox (fed by the scheduler bridge), half-collected fan-in inputs, stream chunk
counters, flow-control credits and relay leases — so its :meth:`~StageRequest._finish`
is the one clean-up, and no second bookkeeping path can leak.

Its :class:`Phase` says how far the request got.  Abort is ``cancel_scope.cancel()``
and its queued outputs dropped: the request's task stops wherever it waits, handles no
output after the abort, and its finish tells the scheduler, gives the leases back and
answers the coordinator with ``Released``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import trio

from omnitrio.contract import (
    IncomingMessage,
    InvalidRequest,
    OutgoingMessage,
    StageOverloaded,
    StagePayload,
    StreamItem,
)
from omnitrio.envelopes import (
    COORDINATOR,
    Abort,
    Chunk,
    Complete,
    Credit,
    Cut,
    Done,
    Failed,
    Payload,
    Released,
    Skipped,
    StreamOut,
)
from omnitrio.events import (
    STAGE_ABORTED,
    STAGE_COMPLETE,
    STAGE_DISPATCH,
    STAGE_FAILED,
    STAGE_FIRST_STREAM_CHUNK_SENT,
    STAGE_HOP_SENT,
    STAGE_INPUT_RECEIVED,
)
from omnitrio.fanin import FanIn, FanInError
from omnitrio.flow import CREDIT_BATCH, Consumed, Credits, let_through
from omnitrio.mailbox import Mailbox
from omnitrio.supervision import StageDead
from omnitrio.topology import StageFunctionError

if TYPE_CHECKING:
    from omnitrio.bridge import SchedulerBridge
    from omnitrio.events import EventRecorder
    from omnitrio.reach import RouteChoice
    from omnitrio.switchboard import Switchboard
    from omnitrio.tombstones import Tombstones
    from omnitrio.topology import StagePlan


class Host(Protocol):
    """What a request uses of its stage (:class:`omnitrio.stage.Stage`)."""

    name: str
    plan: StagePlan
    board: Switchboard
    recorder: EventRecorder | None
    bridge: SchedulerBridge | None
    requests: dict[str, StageRequest]
    tombstones: Tombstones


OUTPUT_SLICE = 32
"""Most outputs one request handles per turn: a burst leaves in batches, other requests wait one slice."""


class Phase(enum.IntEnum):
    """How far a request got at a stage; it only moves forward (to a higher value)."""

    ARRIVING = 0
    """Inputs are being collected; the scheduler holds nothing of the request."""
    STREAMING = 1
    """Stream input went to the scheduler ahead of the payload."""
    STREAMING_ANSWERED = 2
    """As STREAMING, and the scheduler's outputs are arriving already."""
    SCHEDULED = 3
    """The payload went to the scheduler."""
    PRODUCING = 4
    """The payload went to the scheduler, and its outputs are arriving."""
    LOST = 5
    """The scheduler that held it crashed; the request is failing."""
    FINISHED = 6
    """Its task has ended; the stage holds nothing of it."""


class Outcome(enum.Enum):
    """How a request's task at a stage ended."""

    DONE = "done"
    """Its result went on (to the next stages or the caller)."""
    FAILED = "failed"
    """It failed here, and the coordinator was told."""
    STOPPED = "stopped"
    """Aborted, or the stage shut down."""


_CALLER = (COORDINATOR,)
"""Where a terminal stage's stream outputs go: the caller, through the coordinator."""
_HELD = (Phase.STREAMING, Phase.STREAMING_ANSWERED, Phase.SCHEDULED, Phase.PRODUCING)
"""Phases in which the scheduler holds something of the request."""
_UNANSWERED = (Phase.ARRIVING, Phase.STREAMING, Phase.SCHEDULED)
"""Phases before the scheduler's first output for the request."""
_AFTER_PAYLOAD = {
    Phase.ARRIVING: Phase.SCHEDULED,
    Phase.STREAMING: Phase.SCHEDULED,
    Phase.STREAMING_ANSWERED: Phase.PRODUCING,
}
_AFTER_STREAM = {Phase.ARRIVING: Phase.STREAMING}
_AFTER_OUTPUT = {Phase.STREAMING: Phase.STREAMING_ANSWERED, Phase.SCHEDULED: Phase.PRODUCING}


class StageRequest:
    """One live request at one stage; see the module docstring."""

    __slots__ = (
        "_chunk_ids",
        "_consumed",
        "_credits",
        "cancel_scope",
        "fan_in",
        "inc",
        "leases",
        "outputs",
        "phase",
        "request_id",
        "stage",
    )

    def __init__(self, stage: Host, request_id: str, inc: int, phase: Phase = Phase.ARRIVING) -> None:
        self.stage = stage
        self.request_id = request_id
        self.inc = inc
        self.phase = phase
        self.cancel_scope = trio.CancelScope()
        self.outputs: Mailbox[OutgoingMessage] = Mailbox()
        self.fan_in = FanIn(stage.plan, request_id) if stage.plan.wait_for else None
        self.leases: list[Any] = []
        self._chunk_ids: dict[str, int] | None = None
        self._credits: Credits | None = None
        self._consumed: Consumed | None = None

    # -- 1. arrive ------------------------------------------------------------------

    def arrive(self, envelope: Payload | Chunk | Done | Cut, leases: Sequence[Any]) -> None:
        """Take one input; what completes an input goes to the scheduler now (never blocks)."""
        self.leases.extend(leases)
        stage, rid = self.stage, self.request_id
        rec = stage.recorder
        match envelope:
            case Payload(src=src, body=body):
                if rec is not None:
                    kind = "submit" if src == COORDINATOR else "payload"
                    rec.emit(rid, stage.name, STAGE_INPUT_RECEIVED, from_stage=src, kind=kind)
                try:
                    payload = self._gather(src, body)
                except (FanInError, StageFunctionError) as exc:
                    self.fail_with(exc)
                    return
                if payload is not None:
                    self._dispatch(payload)
            case Chunk(src=src, chunk_id=chunk_id, body=body, metadata=metadata):
                if self._refuse_early_stream(f"stream chunk #{chunk_id} from {src!r}"):
                    return
                if rec is not None and chunk_id == 0:
                    rec.emit(rid, stage.name, STAGE_INPUT_RECEIVED, from_stage=src, kind="chunk", chunk_id=0)
                item = StreamItem(chunk_id, body, src, metadata)
                self._to_scheduler(IncomingMessage(rid, "stream_chunk", item), _AFTER_STREAM)
            case Done(src=src):
                if not self._refuse_early_stream(f"end of stream from {src!r}"):
                    self._to_scheduler(IncomingMessage(rid, "stream_done", src), _AFTER_STREAM)
            case Cut(sources=sources, by=by):
                if self.fan_in is None:
                    return
                try:
                    complete, merged = self.fan_in.cut(frozenset(sources), by)
                except StageFunctionError as exc:
                    self.fail_with(exc)
                    return
                if complete:
                    self._dispatch(merged)

    def _dispatch(self, payload: Any) -> None:
        self._to_scheduler(IncomingMessage(self.request_id, "new_request", payload), _AFTER_PAYLOAD)
        rec = self.stage.recorder
        if rec is not None:
            rec.emit(self.request_id, self.stage.name, STAGE_DISPATCH)

    def _gather(self, src: str, body: Any) -> Any:
        """The payload to hand the scheduler, or None while fan-in inputs are missing."""
        if self.fan_in is not None and src != COORDINATOR:
            complete, merged = self.fan_in.add(src, body)
            return merged if complete else None
        if self.phase >= Phase.SCHEDULED:
            raise FanInError(f"stage {self.stage.name!r} got a second payload (from {src!r}) for one request")
        return body

    def _refuse_early_stream(self, what: str) -> bool:
        if self.phase != Phase.ARRIVING or self.stage.plan.config.can_accept_stream_before_payload:
            return False
        self.fail_with(
            FanInError(
                f"stage {self.stage.name!r} got {what} before its payload and is not configured to accept "
                "stream data before the payload (can_accept_stream_before_payload=false)"
            )
        )
        return True

    def abort(self) -> None:
        """Stop the request here; its task answers the coordinator with ``Released``.

        Outputs queued for it are dropped, so its task handles none after the abort, even
        one it was already woken for.
        """
        self.cancel_scope.cancel()
        self.outputs.discard()

    # -- 2. hand to the scheduler ---------------------------------------------------

    def _to_scheduler(self, message: IncomingMessage, moves: dict[Phase, Phase]) -> None:
        """Put ``message`` in the scheduler's inbox; ``moves`` says which phase that leads to."""
        if self.phase == Phase.LOST:
            return  # the scheduler that held the rest of it is gone; an error is on its way
        self.phase = moves.get(self.phase, self.phase)
        bridge = self.stage.bridge
        assert bridge is not None
        bridge.put(message)

    def handed_over(self, item: StreamItem) -> None:
        """One of its chunks reached the scheduler: give the producer credit back, in batches."""
        consumed = self._consumed
        if consumed is None:
            consumed = self._consumed = Consumed()
        if consumed.count(item.from_stage):
            stage = self.stage
            stage.board.send(Credit(self.request_id, self.inc, item.from_stage, CREDIT_BATCH, stage.name))

    def lost(self, failure: BaseException) -> None:
        """The scheduler crashed while it held this request: fail it."""
        if self.phase in _HELD:
            self.phase = Phase.LOST
            self.fail_with(RuntimeError(f"scheduler crashed: {type(failure).__name__}: {failure}"))

    def dead(self, reason: str) -> None:
        """The stage is dead (no scheduler will serve it): fail it, whatever its phase."""
        if self.phase < Phase.LOST:
            self.phase = Phase.LOST
            self.fail_with(StageDead(reason))

    # -- 3. outputs -----------------------------------------------------------------

    @property
    def answered(self) -> bool:
        """Whether the scheduler's first output for the request has arrived here."""
        return self.phase not in _UNANSWERED

    def push(self, message: OutgoingMessage) -> int:
        """Hand the request's task an output; never blocks.  The outputs now waiting for it."""
        self.phase = _AFTER_OUTPUT.get(self.phase, self.phase)
        return self.outputs.put(message)

    def fail_with(self, error: BaseException | str) -> None:
        """Fail the request from outside its task (bad input routing, merge errors)."""
        self.outputs.put(OutgoingMessage(self.request_id, "error", data=error))

    def grant(self, consumer: str, n: int) -> None:
        """``consumer`` took in ``n`` of this request's chunks: that many more may go to it."""
        if self._credits is None:
            self._credits = Credits()
        self._credits.grant(consumer, n)

    async def serve(self) -> None:
        """The request's task: handle its outputs until a result or an error, then finish."""
        outcome = Outcome.STOPPED
        try:
            with self.cancel_scope:
                async for outputs in self.outputs.slices(OUTPUT_SLICE):
                    bridge = self.stage.bridge
                    if bridge is not None:
                        let_through(bridge.outbox, self.outputs)  # the backlog shrinks only as a slice is taken
                    for n, out in enumerate(outputs):
                        if n:  # a local send of the output before may have aborted the request
                            await trio.lowlevel.checkpoint_if_cancelled()
                        match out.type:
                            case "stream":
                                await self._stream(out)
                            case "result":
                                self._route(out.data)
                                outcome = Outcome.DONE
                                return
                            case "error":
                                outcome = Outcome.FAILED
                                self._fail(out.data)
                                return
                            case "kv_transfer":
                                # The request goes on at the stage whose scheduler admits it.
                                outcome = Outcome.DONE
                                return
        except (StageFunctionError, FanInError) as exc:
            outcome = Outcome.FAILED
            self._fail(exc)
        finally:
            self._finish(outcome)

    async def _stream(self, out: OutgoingMessage) -> None:
        """One stream output to its consumers (the caller for a terminal stage), each when it has credit."""
        stage, rid = self.stage, self.request_id
        plan = stage.plan
        if out.target is not None:
            if out.target not in plan.stream_to and out.target not in plan.next:
                raise StageFunctionError(
                    f"stream output of stage {stage.name!r}", "ValueError", f"target {out.target!r} is not in stream_to"
                )
            targets: Sequence[str] = (out.target,)
        elif plan.stream_to:
            targets = plan.stream_to
        elif plan.terminal:
            targets = _CALLER
        else:
            raise StageFunctionError(
                f"stream output of stage {stage.name!r}", "RuntimeError", "no target, no stream_to, and not terminal"
            )
        credits, chunk_ids = self._credits, self._chunk_ids
        if credits is None:
            credits = self._credits = Credits()
        if chunk_ids is None:
            chunk_ids = self._chunk_ids = {}
        for target in targets:
            await credits.take(target)  # the consumer has room for it
            chunk_id = chunk_ids.get(target, 0)
            chunk_ids[target] = chunk_id + 1
            if targets is _CALLER:
                stage.board.send(StreamOut(rid, self.inc, stage.name, chunk_id, out.data, _modality(out)))
            else:
                if stage.recorder is not None and chunk_id == 0:
                    stage.recorder.emit(rid, stage.name, STAGE_FIRST_STREAM_CHUNK_SENT, to=target)
                stage.board.send(Chunk(rid, self.inc, target, stage.name, chunk_id, out.data, out.metadata))

    def _route(self, result: Any) -> None:
        """End-of-stream signals first, then the result to each next stage (or the caller).

        The end of its stream goes where the route went (:meth:`StagePlan.stream_done_targets`).
        A route that leaves out targets through which a terminal or a fan-in source could be
        reached tells the coordinator first (:class:`~omnitrio.envelopes.Skipped`); a stage it
        streamed to and then cut off is told to let go (:mod:`omnitrio.reach`).
        """
        stage, rid, inc = self.stage, self.request_id, self.inc
        plan, board, rec = stage.plan, stage.board, stage.recorder
        if plan.terminal:
            if plan.stream_to:
                self._end_streams(plan.stream_done_targets(rid, result, None))
            data = result.data if isinstance(result, StagePayload) else result
            if rec is not None:
                rec.emit(rid, stage.name, STAGE_COMPLETE, terminal=True, next=[])
            board.send(Complete(rid, inc, stage.name, data))
            return
        targets = plan.targets(rid, result)
        choice = plan.choice(targets)
        done_to = plan.stream_done_targets(rid, result, choice) if plan.stream_to else ()
        if done_to:
            self._end_streams(done_to)
        fan_out = len(targets) > 1
        bodies = [plan.project(t, result, fan_out=fan_out) for t in targets]
        if rec is not None:
            rec.emit(rid, stage.name, STAGE_COMPLETE, terminal=False, next=targets)
        if choice is not None:
            self._leave_out(choice, targets, done_to)  # first: a request with nothing left to reach ends
        for target, body in zip(targets, bodies, strict=True):
            if rec is not None:  # before the send: a local send delivers at once
                rec.emit(rid, stage.name, STAGE_HOP_SENT, to_stage=target, transport=board.transport_to(target))
            board.send(Payload(rid, inc, target, stage.name, body))

    def _end_streams(self, targets: Sequence[str]) -> None:
        stage = self.stage
        for target in targets:
            stage.board.send(Done(self.request_id, self.inc, target, stage.name))

    def _leave_out(self, choice: RouteChoice, targets: list[str], done_to: Sequence[str]) -> None:
        """Tell the coordinator what the route left out, when that matters (and which of those
        stages got this stage's stream), and let go of the streams it sent where the route cut off."""
        stage, rid, inc = self.stage, self.request_id, self.inc
        sent = {*self._chunk_ids, *done_to} if self._chunk_ids else done_to
        streamed = tuple(t for t in sent if t not in targets and t in stage.plan.next and t not in choice.cut)
        if self._chunk_ids:
            for target in self._chunk_ids:
                if target in choice.cut:
                    stage.board.send(Abort(rid, inc, target))  # answered to the coordinator, which ignores it
        if choice.reported or streamed:
            stage.board.send(Skipped(rid, inc, stage.name, choice.reported, streamed))

    def _fail(self, error: Any) -> None:
        if isinstance(error, BaseException):
            error_type = getattr(error, "error_type", None) or type(error).__name__
            message = str(error)
        else:
            error_type, message = "Error", str(error)
        stage = self.stage
        stage.tombstones.add(self.request_id, self.inc)
        if stage.recorder is not None:
            stage.recorder.emit(self.request_id, stage.name, STAGE_FAILED, error_type=error_type)
        overloaded = isinstance(error, StageOverloaded)
        failed = Failed(self.request_id, self.inc, stage.name, error_type, message, overloaded)
        if isinstance(error, InvalidRequest):
            failed.code, failed.param = error.code, error.param
        stage.board.send(failed)

    # -- 4. finish ------------------------------------------------------------------

    def _finish(self, outcome: Outcome) -> None:
        """Whatever the end: leave the table, tell the scheduler, give leases back, answer an abort."""
        stage, rid = self.stage, self.request_id
        if stage.requests.get(rid) is self:
            del stage.requests[rid]
        held = self.phase in _HELD
        self.phase = Phase.FINISHED
        self.outputs.close()
        bridge = stage.bridge
        if bridge is not None:
            let_through(bridge.outbox, ())  # the backlog that paused it may have been this request's
            if held and outcome is not Outcome.DONE:
                bridge.abort(rid)
        stage.board.let_go(rid, self.inc, stage.name, self.leases)
        self.leases.clear()
        if outcome is Outcome.DONE and stage.plan.cuttable:
            stage.tombstones.add(rid, self.inc)  # a late Cut (or payload) of this life starts nothing
        if self.cancel_scope.cancel_called:
            if stage.recorder is not None:
                stage.recorder.emit(rid, stage.name, STAGE_ABORTED)
            stage.board.send(Released(rid, self.inc, stage.name))


def _modality(out: OutgoingMessage) -> str | None:
    if out.metadata and "modality" in out.metadata:
        return str(out.metadata["modality"])
    if isinstance(out.data, dict) and isinstance(out.data.get("modality"), str):
        return str(out.data["modality"])
    return None
