"""The scheduler bridge: a request's first output reaches an idle IO loop at once; aborts never
stall a scheduler's outbox."""

from __future__ import annotations

import queue

import trio

from omnitrio.bridge import LoopIdle, SchedulerBridge
from omnitrio.contract import IncomingMessage, OutgoingMessage

BURST = 2000


class BurstScheduler:
    """Puts ``BURST`` outputs per request as fast as it can, counting those already put."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[IncomingMessage | None] = queue.Queue()
        self.outbox: queue.Queue[OutgoingMessage] = queue.Queue()
        self.put_before: int = 0
        self.loop_idle = LoopIdle()

    def warm_up_serving_thread(self) -> None:
        return None

    def start(self) -> None:
        while (msg := self.inbox.get()) is not None:
            if msg.type != "new_request":
                continue
            assert self.loop_idle.event.wait(10)  # the IO loop waits for IO with nothing to run
            for i in range(BURST):
                self.outbox.put(OutgoingMessage(msg.request_id, "stream", data=i))
                self.put_before = i + 1

    def stop(self) -> None:
        self.inbox.put(None)

    def abort(self, request_id: str) -> None:
        return None


async def run_burst(*, handoff_s: float) -> list[tuple[int, int]]:
    """(outputs in the batch, outputs the scheduler had finished putting) per delivered batch."""
    scheduler = BurstScheduler()
    batches: list[tuple[int, int]] = []
    received: list[OutgoingMessage] = []
    finished = trio.Event()

    def deliver(outputs: list[OutgoingMessage]) -> None:
        batches.append((len(outputs), scheduler.put_before))
        received.extend(outputs)
        if len(received) == BURST:
            finished.set()

    def first_output(request_id: str) -> bool:
        return not any(out.request_id == request_id for out in received)

    idle = scheduler.loop_idle
    trio.lowlevel.add_instrument(idle)
    bridge = SchedulerBridge(scheduler, "burst", deliver, first_output=first_output, idle=idle, handoff_s=handoff_s)
    async with trio.open_nursery() as nursery:
        await nursery.start(bridge.run)
        bridge.put(IncomingMessage("r1", "new_request", None))
        with trio.fail_after(10):
            await finished.wait()
        nursery.cancel_scope.cancel()
    assert [out.data for out in received] == list(range(BURST))
    return batches


async def test_first_output_is_delivered_before_the_scheduler_puts_the_next() -> None:
    batches = await run_burst(handoff_s=10.0)
    assert batches[0] == (1, 0)
    assert len(batches) < BURST // 10  # the rest of the burst still leaves in batches


OUTBOX = 4


class BoundedScheduler:
    """Answers each request with one result, through an outbox of ``OUTBOX`` places."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[IncomingMessage | None] = queue.Queue()
        self.outbox: queue.Queue[OutgoingMessage] = queue.Queue(maxsize=OUTBOX)

    def warm_up_serving_thread(self) -> None:
        return None

    def start(self) -> None:
        while (msg := self.inbox.get()) is not None:
            if msg.type == "new_request":
                self.outbox.put(OutgoingMessage(msg.request_id, "result", data="done"))

    def stop(self) -> None:
        self.inbox.put(None)
        try:
            while True:
                self.outbox.get_nowait()  # unblock a put waiting for room
        except queue.Empty:
            return

    def abort(self, request_id: str) -> None:
        return None


async def test_a_burst_of_aborts_leaves_room_in_a_bounded_outbox_for_the_next_result() -> None:
    # Each abort the scheduler takes puts a fence in its outbox; as many aborts as the outbox
    # has places, with no output between them, must not leave the next result waiting for room.
    scheduler = BoundedScheduler()
    delivered: list[OutgoingMessage] = []
    answered = trio.Event()

    def deliver(outputs: list[OutgoingMessage]) -> None:
        delivered.extend(outputs)
        answered.set()

    bridge = SchedulerBridge(scheduler, "bounded", deliver)
    async with trio.open_nursery() as nursery:
        await nursery.start(bridge.run)
        for i in range(OUTBOX):
            bridge.abort(f"aborted-{i}")
        bridge.put(IncomingMessage("next", "new_request", None))
        with trio.fail_after(10):
            await answered.wait()
        nursery.cancel_scope.cancel()
    assert [(out.request_id, out.data) for out in delivered] == [("next", "done")]
