"""SimpleScheduler driven directly: its thread, its inbox, its outbox."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any

import pytest

from omnitrio.contract import IncomingMessage, StagePayload
from schedulers._idsets import ID_MEMORY
from schedulers.simple import SimpleScheduler
from tests.scheduler_harness import TIMEOUT, Gate, by_id, chunk, done, new, put_atomically, running, take


def echo(p: StagePayload) -> StagePayload:
    return p


# Batching -----------------------------------------------------------------------------


class BatchRecorder:
    """compute_fn / batch_compute_fn that record the batches they saw."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def one(self, p: StagePayload) -> StagePayload:
        self.batches.append([p.request_id])
        p.data = {"batch_size": 1}
        return p

    def batch(self, ps: list[StagePayload]) -> list[StagePayload]:
        self.batches.append([p.request_id for p in ps])
        for p in ps:
            p.data = {"batch_size": len(ps)}
        return ps


def batching_scheduler(rec: BatchRecorder, **kwargs: Any) -> SimpleScheduler:
    kwargs.setdefault("max_batch_size", 8)
    return SimpleScheduler(rec.one, batch_compute_fn=rec.batch, **kwargs)


@pytest.mark.parametrize("when_idle", [True, False])
def test_burst_handed_over_atomically_forms_one_batch(when_idle: bool) -> None:
    rec = BatchRecorder()
    with running(batching_scheduler(rec, max_batch_wait_ms=50, batch_wait_when_idle=when_idle)) as s:
        for round_ in range(3):
            put_atomically(s.inbox, [new(f"b{round_}-{i}") for i in range(4)])
            outs = take(s.outbox, 4)
            assert [o.data.data["batch_size"] for o in outs] == [4, 4, 4, 4]
    assert rec.batches == [[f"b{r}-{i}" for i in range(4)] for r in range(3)]


def test_burst_queued_before_start_forms_one_batch() -> None:
    rec = BatchRecorder()
    s = batching_scheduler(rec, max_batch_wait_ms=0, batch_wait_when_idle=False)
    put_atomically(s.inbox, [new(f"r{i}") for i in range(4)])
    with running(s):
        take(s.outbox, 4)
    assert rec.batches == [["r0", "r1", "r2", "r3"]]


class WindowInbox(queue.Queue[IncomingMessage]):
    """An inbox that says when its scheduler waits in a batching window (a ``get`` with a timeout
    on an empty queue), so a test puts its late joiner inside the window, however loaded the machine."""

    def __init__(self) -> None:
        super().__init__()
        self.in_window = threading.Event()

    def get(self, block: bool = True, timeout: float | None = None) -> IncomingMessage:
        if timeout is not None:
            with self.mutex:
                if not self.queue:
                    self.in_window.set()
        return super().get(block, timeout)


def windowed(scheduler: SimpleScheduler) -> SimpleScheduler:
    scheduler.inbox = WindowInbox()
    return scheduler


def test_idle_window_holds_a_lone_request_for_a_late_joiner() -> None:
    rec = BatchRecorder()
    s = windowed(batching_scheduler(rec, max_batch_size=2, max_batch_wait_ms=5_000, batch_wait_when_idle=True))
    with running(s):
        s.inbox.put(new("first"))
        assert s.inbox.in_window.wait(TIMEOUT)  # the scheduler has taken "first" and waits in its window
        s.inbox.put(new("second"))
        outs = take(s.outbox, 2)
    assert rec.batches == [["first", "second"]]
    assert {o.data.data["batch_size"] for o in outs} == {2}


def test_idle_stage_dispatches_a_lone_request_at_once_without_idle_wait() -> None:
    rec = BatchRecorder()
    with running(batching_scheduler(rec, max_batch_wait_ms=60_000, batch_wait_when_idle=False)) as s:
        s.inbox.put(new("lone"))
        (out,) = take(s.outbox)  # a 60 s window would time this out
        assert out.type == "result"
        assert out.data.data == {"batch_size": 1}
        s.inbox.put(new("next"))
        take(s.outbox)
    assert rec.batches == [["lone"], ["next"]]


def test_window_opens_when_second_request_joins_without_idle_wait() -> None:
    rec = BatchRecorder()
    s = windowed(batching_scheduler(rec, max_batch_size=3, max_batch_wait_ms=5_000, batch_wait_when_idle=False))
    with running(s):
        put_atomically(s.inbox, [new("a"), new("b")])
        assert s.inbox.in_window.wait(TIMEOUT)  # "a" and "b" form a batch whose window is now open
        s.inbox.put(new("c"))
        take(s.outbox, 3)
    assert rec.batches == [["a", "b", "c"]]


def test_cost_cap_starts_next_batch() -> None:
    rec = BatchRecorder()
    costs = {"r0": 3, "r1": 3, "r2": 3, "r3": 1}
    s = batching_scheduler(rec, request_cost_fn=lambda p: costs[p.request_id], max_batch_cost=6)
    with running(s):
        put_atomically(s.inbox, [new(rid) for rid in costs])
        take(s.outbox, 4)
    assert rec.batches == [["r0", "r1"], ["r2", "r3"]]


def test_cost_cap_always_admits_first_request() -> None:
    rec = BatchRecorder()
    costs = {"huge": 100, "small": 1}
    s = batching_scheduler(rec, request_cost_fn=lambda p: costs[p.request_id], max_batch_cost=6)
    with running(s):
        put_atomically(s.inbox, [new("huge"), new("small")])
        outs = by_id(take(s.outbox, 2))
    assert rec.batches == [["huge"], ["small"]]
    assert outs["huge"].type == "result"


def test_cost_fn_error_fails_only_its_request() -> None:
    rec = BatchRecorder()

    def cost(p: StagePayload) -> int:
        if p.request_id == "bad":
            raise KeyError("no cost for bad")
        return 1

    s = batching_scheduler(rec, request_cost_fn=cost, max_batch_cost=10)
    with running(s):
        put_atomically(s.inbox, [new("a"), new("bad"), new("b")])
        outs = by_id(take(s.outbox, 3))
    assert outs["bad"].type == "error"
    assert isinstance(outs["bad"].data, KeyError)
    assert rec.batches == [["a", "b"]]


def test_wrong_length_batch_result_fails_whole_batch() -> None:
    s = SimpleScheduler(echo, batch_compute_fn=lambda ps: ps[:-1], max_batch_size=8)
    with running(s):
        put_atomically(s.inbox, [new(f"r{i}") for i in range(4)])
        outs = take(s.outbox, 4)
    assert {o.type for o in outs} == {"error"}
    assert all(isinstance(o.data, ValueError) for o in outs)
    assert "returned 3 results for a batch of 4" in str(outs[0].data)


def test_exception_in_batch_result_fails_only_its_request() -> None:
    def batch(ps: list[StagePayload]) -> list[Any]:
        return [ValueError("item 1 is bad") if i == 1 else p for i, p in enumerate(ps)]

    s = SimpleScheduler(echo, batch_compute_fn=batch, max_batch_size=8)
    with running(s):
        put_atomically(s.inbox, [new(f"r{i}") for i in range(4)])
        outs = by_id(take(s.outbox, 4))
    assert outs["r1"].type == "error"
    assert str(outs["r1"].data) == "item 1 is bad"
    assert [outs[r].type for r in ("r0", "r2", "r3")] == ["result"] * 3
    assert outs["r0"].data.request_id == "r0"


def test_exception_from_batch_fn_fails_every_request_in_batch() -> None:
    boom = RuntimeError("batch exploded")

    def batch(ps: list[StagePayload]) -> list[StagePayload]:
        raise boom

    s = SimpleScheduler(echo, batch_compute_fn=batch, max_batch_size=8)
    with running(s):
        put_atomically(s.inbox, [new(f"r{i}") for i in range(3)])
        outs = take(s.outbox, 3)
    assert [o.data for o in outs] == [boom, boom, boom]


def test_no_batching_without_batch_fn() -> None:
    seen: list[str] = []

    def one(p: StagePayload) -> StagePayload:
        seen.append(p.request_id)
        return p

    with running(SimpleScheduler(one, max_batch_size=8, max_batch_wait_ms=1000)) as s:
        put_atomically(s.inbox, [new("a"), new("b")])
        assert [o.request_id for o in take(s.outbox, 2)] == ["a", "b"]
    assert seen == ["a", "b"]


# Results and errors --------------------------------------------------------------------


def test_result_carries_returned_payload_in_order() -> None:
    def double(p: StagePayload) -> StagePayload:
        p.data = p.data * 2
        return p

    with running(SimpleScheduler(double)) as s:
        put_atomically(s.inbox, [new("a", 1), new("b", 2)])
        outs = take(s.outbox, 2)
    assert [(o.request_id, o.type, o.data.data) for o in outs] == [("a", "result", 2), ("b", "result", 4)]


def test_compute_error_is_reported_as_the_exception_object() -> None:
    def fail(p: StagePayload) -> StagePayload:
        raise ZeroDivisionError("count exploded on purpose")

    with running(SimpleScheduler(fail)) as s:
        s.inbox.put(new("r1"))
        (out,) = take(s.outbox)
    assert out.type == "error"
    assert isinstance(out.data, ZeroDivisionError)
    assert str(out.data) == "count exploded on purpose"


def test_async_compute_fn_runs() -> None:
    async def compute(p: StagePayload) -> StagePayload:
        await asyncio.sleep(0.001)
        p.data = "async done"
        return p

    with running(SimpleScheduler(compute)) as s:
        s.inbox.put(new("r1"))
        (out,) = take(s.outbox)
    assert out.data.data == "async done"


def test_async_batch_fn_runs() -> None:
    async def batch(ps: list[StagePayload]) -> list[StagePayload]:
        await asyncio.sleep(0.001)
        for p in ps:
            p.data = len(ps)
        return ps

    with running(SimpleScheduler(None, batch_compute_fn=batch, max_batch_size=4)) as s:
        put_atomically(s.inbox, [new(f"r{i}") for i in range(3)])
        outs = take(s.outbox, 3)
    assert [o.data.data for o in outs] == [3, 3, 3]


def test_stream_messages_are_ignored() -> None:
    with running(SimpleScheduler(echo)) as s:
        put_atomically(s.inbox, [chunk("r1", 0, b"x"), done("r1"), new("fence")])
        (out,) = take(s.outbox)
    assert out.request_id == "fence"
    assert s.outbox.empty()


# Concurrency ---------------------------------------------------------------------------


def test_max_concurrency_runs_computes_in_parallel() -> None:
    barrier = threading.Barrier(4, timeout=TIMEOUT)  # only passes if all 4 run at once
    intervals: dict[str, tuple[float, float]] = {}

    def compute(p: StagePayload) -> StagePayload:
        start = time.monotonic()
        barrier.wait()
        time.sleep(0.02)
        intervals[p.request_id] = (start, time.monotonic())
        return p

    with running(SimpleScheduler(compute, max_concurrency=4)) as s:
        put_atomically(s.inbox, [new(f"r{i}") for i in range(4)])
        outs = take(s.outbox, 4)
    assert {o.type for o in outs} == {"result"}
    latest_start = max(start for start, _ in intervals.values())
    earliest_end = min(end for _, end in intervals.values())
    assert latest_start < earliest_end  # every interval overlaps every other


def test_concurrency_with_batching_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"max_concurrency.*batch_compute_fn"):
        SimpleScheduler(echo, batch_compute_fn=lambda ps: ps, max_concurrency=2)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"max_batch_wait_ms": -1}, "max_batch_wait_ms"),
        ({"max_batch_cost": 5}, "request_cost_fn"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        SimpleScheduler(echo, **kwargs)


def test_missing_compute_is_rejected() -> None:
    with pytest.raises(ValueError, match="compute_fn"):
        SimpleScheduler(None)


# Abort ---------------------------------------------------------------------------------


def test_abort_during_compute_drops_result() -> None:
    gate = Gate("slow")
    aborted: list[str] = []
    with running(SimpleScheduler(gate, abort_callback=aborted.append)) as s:
        s.inbox.put(new("slow"))
        gate.wait_started("slow")
        s.abort("slow")
        gate.release.set()
        s.inbox.put(new("fence"))
        (out,) = take(s.outbox)  # outputs are in order: "slow" would have come first
    assert out.request_id == "fence"
    assert aborted == ["slow"]


def test_abort_message_in_inbox_drops_running_request() -> None:
    gate = Gate("slow")
    abort_applied = threading.Event()
    with running(SimpleScheduler(gate, max_concurrency=2, abort_callback=lambda rid: abort_applied.set())) as s:
        s.inbox.put(new("slow"))
        gate.wait_started("slow")
        put_atomically(s.inbox, [IncomingMessage("slow", "abort"), new("fence")])
        assert abort_applied.wait(TIMEOUT)  # read while "slow" still runs
        gate.release.set()
        (out,) = take(s.outbox)
    assert out.request_id == "fence"
    assert s.outbox.empty()  # start() returned, so the worker running "slow" is done


def test_abort_of_queued_request_skips_its_compute() -> None:
    gate = Gate("first")
    with running(SimpleScheduler(gate)) as s:
        s.inbox.put(new("first"))
        gate.wait_started("first")
        put_atomically(s.inbox, [new("queued"), new("fence")])
        s.abort("queued")
        gate.release.set()
        outs = take(s.outbox, 2)
    assert [o.request_id for o in outs] == ["first", "fence"]
    assert gate.calls == ["first", "fence"]


def test_abort_before_arrival_drops_the_request() -> None:
    gate = Gate()
    with running(SimpleScheduler(gate)) as s:
        s.abort("early")
        put_atomically(s.inbox, [new("early"), new("fence")])
        (out,) = take(s.outbox)
    assert out.request_id == "fence"
    assert gate.calls == ["fence"]


def test_id_is_reusable_after_abort_before_arrival() -> None:
    with running(SimpleScheduler(echo)) as s:
        s.abort("r1")
        put_atomically(s.inbox, [new("r1", "first life"), new("r1", "second life")])
        (out,) = take(s.outbox)
    assert out.data.data == "second life"


def test_id_is_reusable_after_abort_during_compute() -> None:
    gate = Gate("r1")
    with running(SimpleScheduler(gate)) as s:
        s.inbox.put(new("r1", "first life"))
        gate.wait_started("r1")
        s.abort("r1")
        gate.blocking.clear()
        gate.release.set()
        s.inbox.put(new("r1", "second life"))
        (out,) = take(s.outbox)
    assert out.data.data == "second life"


def test_abort_after_finish_does_not_swallow_next_use_of_id() -> None:
    aborted: list[str] = []
    with running(SimpleScheduler(echo, abort_callback=aborted.append)) as s:
        s.inbox.put(new("r1", "first life"))
        take(s.outbox)
        s.abort("r1")  # raced the result: nothing left to abort
        s.inbox.put(new("r1", "second life"))
        (out,) = take(s.outbox)
    assert out.data.data == "second life"
    assert aborted == []


def test_abort_in_both_ways_leaves_no_mark() -> None:
    """The runtime calls abort() and also queues an abort message; the id stays usable."""
    with running(SimpleScheduler(echo)) as s:
        s.abort("r1")  # its new_request was never handed over
        s.inbox.put(IncomingMessage("r1", "abort"))
        s.inbox.put(new("r1", "next life"))
        (out,) = take(s.outbox)
    assert out.data.data == "next life"


def test_remembered_aborts_are_bounded() -> None:
    with running(SimpleScheduler(echo)) as s:
        for i in range(ID_MEMORY + 1):
            s.abort(f"never-{i}")
        put_atomically(s.inbox, [new("never-0", "forgotten"), new(f"never-{ID_MEMORY}", "remembered"), new("fence")])
        outs = take(s.outbox, 2)
    assert [o.request_id for o in outs] == ["never-0", "fence"]


def test_aborted_request_in_pending_batch_is_dropped() -> None:
    rec = BatchRecorder()
    entered, gate = threading.Event(), threading.Event()

    def batch(ps: list[StagePayload]) -> list[StagePayload]:
        entered.set()
        assert gate.wait(TIMEOUT)
        return rec.batch(ps)

    s = SimpleScheduler(rec.one, batch_compute_fn=batch, max_batch_size=8)
    with running(s):
        put_atomically(s.inbox, [new("a"), new("b")])
        assert entered.wait(TIMEOUT)  # the batch [a, b] is computing
        s.abort("b")
        gate.set()
        (out,) = take(s.outbox)
        s.inbox.put(new("fence"))
        assert take(s.outbox)[0].request_id == "fence"
    assert out.request_id == "a"
    assert rec.batches[0] == ["a", "b"]


# Lifetime ------------------------------------------------------------------------------


def test_stop_returns_start_promptly_when_idle() -> None:
    calls: list[str] = []
    s = SimpleScheduler(echo, shutdown_callback=lambda: calls.append("shutdown"))
    thread = threading.Thread(target=s.start, daemon=True)
    thread.start()
    s.stop()
    thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert calls == ["shutdown"]


def test_stop_during_batch_window_returns_promptly() -> None:
    rec = BatchRecorder()
    s = windowed(batching_scheduler(rec, max_batch_wait_ms=60_000, batch_wait_when_idle=True))
    thread = threading.Thread(target=s.start, daemon=True)
    thread.start()
    s.inbox.put(new("r1"))
    assert s.inbox.in_window.wait(TIMEOUT)  # the scheduler holds "r1" in its 60 s window
    s.stop()
    thread.join(TIMEOUT)
    assert not thread.is_alive()


def test_stop_before_start_makes_start_return() -> None:
    s = SimpleScheduler(echo)
    s.stop()
    s.start()  # returns at once


def test_stop_waits_for_running_workers() -> None:
    gate = Gate("slow")
    s = SimpleScheduler(gate, max_concurrency=2)
    thread = threading.Thread(target=s.start, daemon=True)
    thread.start()
    s.inbox.put(new("slow"))
    gate.wait_started("slow")
    s.stop()
    thread.join(0.05)
    assert thread.is_alive()  # a compute is still running: start() must not abandon it
    gate.release.set()
    thread.join(TIMEOUT)
    assert not thread.is_alive()
