"""The engine's step loop and request intake: message order, abort, refused streams, one wake-up per turn."""

from __future__ import annotations

import queue
import threading
from typing import Any

from omnitrio.contract import IncomingMessage, InvalidRequest, OutgoingMessage, StagePayload
from schedulers.engine.intake import RequestIntake
from tests.scheduler_harness import TIMEOUT, chunk, new, put_atomically, running


class Counter(RequestIntake):
    """Each request ``n`` streams 1..n, one number per step, then its result; ``n < 1`` is refused."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, list[int]] = {}
        self.step_gate: threading.Event | None = None  # when set, a step waits for it
        self.permits: threading.Semaphore | None = None  # when set, each step takes one

    def _has_work(self) -> bool:
        return bool(self.counts)

    def _accept(self, request_id: str, data: Any) -> None:
        assert isinstance(data, StagePayload)
        if data.data < 1:
            raise InvalidRequest(f"n={data.data} must be >= 1", param="n")
        self.counts[request_id] = [data.data, 0]

    def _forget(self, request_id: str) -> None:
        self.counts.pop(request_id, None)

    def _step(self) -> list[OutgoingMessage]:
        if self.step_gate is not None:
            self.step_gate.wait(TIMEOUT)
        if self.permits is not None:
            self.permits.acquire(timeout=TIMEOUT)
        outputs = []
        for rid, state in list(self.counts.items()):
            state[1] += 1
            outputs.append(OutgoingMessage(rid, "stream", state[1]))
            if state[1] == state[0]:
                del self.counts[rid]
                outputs.append(OutgoingMessage(rid, "result", state[1]))
        return outputs


def until_done(outbox: queue.Queue[OutgoingMessage], rids: set[str]) -> dict[str, list[OutgoingMessage]]:
    pending, seen = set(rids), {rid: [] for rid in rids}
    while pending:
        out = outbox.get(timeout=TIMEOUT)
        seen.setdefault(out.request_id, []).append(out)
        if out.type in ("result", "error"):
            pending.discard(out.request_id)
    return seen


def test_an_abort_queued_after_a_new_request_drops_it_and_one_before_it_does_not() -> None:
    scheduler = Counter()
    put_atomically(
        scheduler.inbox,
        [new("gone", 3), IncomingMessage("gone", "abort"), IncomingMessage("kept", "abort"), new("kept", 2)],
    )
    with running(scheduler):
        outputs = until_done(scheduler.outbox, {"kept"})
    assert [o.data for o in outputs["kept"]] == [1, 2, 2]
    assert "gone" not in outputs and scheduler.outbox.empty()


def test_abort_from_another_thread_stops_the_request_before_its_next_step() -> None:
    scheduler = Counter()
    scheduler.permits = threading.Semaphore(1)
    scheduler.inbox.put(new("long", 10_000))
    with running(scheduler):
        first = scheduler.outbox.get(timeout=TIMEOUT)
        scheduler.abort("long")  # the loop may be in its second step already: that one may still finish
        scheduler.inbox.put(new("after", 1))
        for _ in range(10):
            scheduler.permits.release()
        outputs = until_done(scheduler.outbox, {"after"})
    assert (first.request_id, first.data) == ("long", 1)
    assert [o.data for o in outputs.get("long", [])] in ([], [2])
    assert not scheduler.counts


def test_a_refused_request_fails_alone_with_the_error_it_raised() -> None:
    scheduler = Counter()
    put_atomically(scheduler.inbox, [new("bad", 0), new("good", 1)])
    with running(scheduler):
        outputs = until_done(scheduler.outbox, {"bad", "good"})
    (error,) = outputs["bad"]
    assert error.type == "error" and isinstance(error.data, InvalidRequest) and error.data.param == "n"
    assert [o.type for o in outputs["good"]] == ["stream", "result"]


def test_stream_input_fails_the_request_naming_the_scheduler() -> None:
    scheduler = Counter()
    put_atomically(scheduler.inbox, [new("s", 5), chunk("s", 0, "text")])
    with running(scheduler):
        (error,) = until_done(scheduler.outbox, {"s"})["s"]
    assert error.type == "error" and "Counter does not accept stream input (stream_chunk for 's')" in str(error.data)
    assert not scheduler.counts


def test_a_turns_outputs_reach_the_outbox_together_after_its_step() -> None:
    scheduler = Counter()
    scheduler.step_gate = threading.Event()
    put_atomically(scheduler.inbox, [new("bad", 0), new("good", 1)])
    with running(scheduler):
        try:
            scheduler.outbox.get(timeout=0.2)
        except queue.Empty:
            pass
        else:
            raise AssertionError("the refusal went out before the turn's step")
        scheduler.step_gate.set()
        first = scheduler.outbox.get(timeout=TIMEOUT)
        rest = [scheduler.outbox.get_nowait() for _ in range(2)]  # already there: put in one go
    got = [(o.request_id, o.type) for o in [first, *rest]]
    assert got == [("bad", "error"), ("good", "stream"), ("good", "result")]
