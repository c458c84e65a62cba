"""ThreadedSimpleScheduler driven directly: a worker pool over one compute function."""

from __future__ import annotations

import threading
import time

import pytest

from omnitrio.contract import StagePayload
from schedulers.threaded import ThreadedSimpleScheduler
from tests.scheduler_harness import TIMEOUT, Gate, new, put_atomically, running, take


def test_requests_overlap_up_to_max_concurrency() -> None:
    barrier = threading.Barrier(3, timeout=TIMEOUT)  # passes only if 3 computes run at once
    intervals: list[tuple[float, float]] = []

    def compute(p: StagePayload) -> StagePayload:
        start = time.monotonic()
        barrier.wait()
        intervals.append((start, time.monotonic()))
        return p

    with running(ThreadedSimpleScheduler(compute, max_concurrency=3)) as s:
        put_atomically(s.inbox, [new(f"r{i}") for i in range(3)])
        outs = take(s.outbox, 3)
    assert {o.type for o in outs} == {"result"}
    assert max(a for a, _ in intervals) < min(b for _, b in intervals)


def test_outputs_come_in_completion_order() -> None:
    gate = Gate("slow")
    with running(ThreadedSimpleScheduler(gate, max_concurrency=2)) as s:
        s.inbox.put(new("slow"))
        gate.wait_started("slow")
        s.inbox.put(new("fast"))
        assert take(s.outbox)[0].request_id == "fast"
        gate.release.set()
        assert take(s.outbox)[0].request_id == "slow"


def test_abort_of_queued_request_cancels_its_compute() -> None:
    gate = Gate("a", "b")
    aborted: list[str] = []
    with running(ThreadedSimpleScheduler(gate, max_concurrency=2, abort_callback=aborted.append)) as s:
        put_atomically(s.inbox, [new("a"), new("b")])
        gate.wait_started("a")
        gate.wait_started("b")
        s.inbox.put(new("queued"))  # both workers are busy: it waits
        s.abort("queued")
        gate.release.set()
        s.inbox.put(new("fence"))
        outs = take(s.outbox, 3)
    assert sorted(o.request_id for o in outs) == ["a", "b", "fence"]
    assert "queued" not in gate.calls
    assert aborted == ["queued"]
    assert s.outbox.empty()


def test_abort_of_running_request_drops_its_result() -> None:
    gate = Gate("slow")
    with running(ThreadedSimpleScheduler(gate, max_concurrency=2)) as s:
        s.inbox.put(new("slow"))
        gate.wait_started("slow")
        s.abort("slow")
        gate.release.set()
        s.inbox.put(new("fence"))
        assert take(s.outbox)[0].request_id == "fence"
    assert s.outbox.empty()  # start() joined the workers: "slow" finished without output


def test_abort_before_arrival_is_remembered_once() -> None:
    gate = Gate()
    with running(ThreadedSimpleScheduler(gate, max_concurrency=2)) as s:
        s.abort("early")
        s.inbox.put(new("early", "first life"))
        s.inbox.put(new("fence"))
        assert take(s.outbox)[0].request_id == "fence"
        s.inbox.put(new("early", "second life"))
        (out,) = take(s.outbox)
    assert out.data.data == "second life"
    assert gate.calls.count("early") == 1


def test_compute_error_fails_only_its_request() -> None:
    def compute(p: StagePayload) -> StagePayload:
        if p.request_id == "bad":
            raise ValueError("bad input")
        return p

    with running(ThreadedSimpleScheduler(compute, max_concurrency=4)) as s:
        put_atomically(s.inbox, [new("bad"), new("good")])
        outs = {o.request_id: o for o in take(s.outbox, 2)}
    assert outs["bad"].type == "error"
    assert isinstance(outs["bad"].data, ValueError)
    assert outs["good"].type == "result"


def test_async_compute_runs_on_workers() -> None:
    async def compute(p: StagePayload) -> StagePayload:
        p.data = threading.current_thread().name
        return p

    with running(ThreadedSimpleScheduler(compute, max_concurrency=2)) as s:
        s.inbox.put(new("r1"))
        (out,) = take(s.outbox)
    assert "worker" in out.data.data


def test_bad_concurrency_is_named() -> None:
    with pytest.raises(ValueError, match="max_concurrency"):
        ThreadedSimpleScheduler(lambda p: p, max_concurrency=0)
