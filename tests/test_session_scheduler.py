"""SessionScheduler: per-session ordering, concurrency across sessions, limits, abort."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from omnitrio.contract import IncomingMessage, OmniRequest, OutgoingMessage, StageOverloaded, StagePayload
from schedulers.session import SessionContext, SessionRef, SessionScheduler
from tests.scheduler_harness import schedulers_running


class ListHooks:
    """Session state is the list of appended chunks; close returns it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.append_gate: dict[Any, threading.Event] = {}
        self.barrier: threading.Barrier | None = None
        self.fail_open = False

    def open(self, ref: SessionRef, request: OmniRequest) -> dict[str, Any]:
        if self.fail_open:
            raise RuntimeError("open failed on purpose")
        return {"id": ref.session_id, "items": []}

    def append(self, state: dict[str, Any], chunk: Any, payload: StagePayload, ctx: SessionContext) -> dict[str, Any]:
        gate = self.append_gate.get(_key(chunk))
        if gate is not None:
            gate.wait(5)
        if self.barrier is not None:
            self.barrier.wait()
        time.sleep(0.001)
        state["items"].append(chunk)
        ctx.emit(f"got {_key(chunk)}")
        return {"count": len(state["items"])}

    def abort(self, state: dict[str, Any], ref: SessionRef) -> None:
        self.calls.append(("abort", ref.session_id))

    def close(self, state: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("close", state["id"]))
        return {"items": [_key(item) for item in state["items"]]}

    def usage(self, state: dict[str, Any]) -> int:
        return sum(int(getattr(item, "nbytes", 8)) for item in state["items"])


def _key(chunk: Any) -> Any:
    return int(chunk[0]) if isinstance(chunk, np.ndarray) else chunk


def command(rid: str, op: str, session_id: str = "s1", **extra: Any) -> IncomingMessage:
    metadata = {"session": {"op": op, "session_id": session_id, **extra}}
    return IncomingMessage(rid, "new_request", StagePayload(rid, OmniRequest(metadata=metadata)))


@pytest.fixture
def hooks() -> ListHooks:
    return ListHooks()


@pytest.fixture
def make(hooks: ListHooks) -> Iterator[Any]:
    """Build a SessionScheduler over ``hooks`` and start it in a thread; stop and join it at the end."""
    with schedulers_running() as start:
        yield lambda **kwargs: start(SessionScheduler(hooks, **kwargs))


def collect(scheduler: SessionScheduler, *rids: str, timeout: float = 10) -> dict[str, list[OutgoingMessage]]:
    """Outputs per request id until each of ``rids`` got its result or error."""
    outputs: dict[str, list[OutgoingMessage]] = {}
    waiting = set(rids)
    deadline = time.monotonic() + timeout
    while waiting:
        message = scheduler.outbox.get(timeout=max(0.0, deadline - time.monotonic()))
        outputs.setdefault(message.request_id, []).append(message)
        if message.type in ("result", "error"):
            waiting.discard(message.request_id)
    return outputs


def final(outputs: dict[str, list[OutgoingMessage]], rid: str) -> OutgoingMessage:
    return outputs[rid][-1]


def test_commands_of_one_session_run_in_order(make: Any) -> None:
    scheduler = make(max_concurrency=4)
    scheduler.inbox.put(command("o", "open"))
    for index in range(20):
        scheduler.inbox.put(command(f"a{index}", "append", chunk=index))
    scheduler.inbox.put(command("c", "close"))
    outputs = collect(scheduler, "o", "c", *(f"a{index}" for index in range(20)))
    assert final(outputs, "c").data.data == {"session_id": "s1", "op": "close", "items": list(range(20))}


def test_sessions_run_concurrently(make: Any, hooks: ListHooks) -> None:
    hooks.barrier = threading.Barrier(2, timeout=5)
    scheduler = make(max_concurrency=2)
    scheduler.inbox.put(command("o1", "open", "s1"))
    scheduler.inbox.put(command("o2", "open", "s2"))
    collect(scheduler, "o1", "o2")
    scheduler.inbox.put(command("a1", "append", "s1", chunk=1))
    scheduler.inbox.put(command("a2", "append", "s2", chunk=2))
    outputs = collect(scheduler, "a1", "a2")
    assert [final(outputs, rid).type for rid in ("a1", "a2")] == ["result", "result"]


def test_emits_are_stream_outputs_before_the_result(make: Any) -> None:
    scheduler = make()
    scheduler.inbox.put(command("o", "open"))
    scheduler.inbox.put(command("a", "append", chunk=7))
    outputs = collect(scheduler, "o", "a")
    stream, result = outputs["a"]
    assert (stream.type, stream.data, stream.metadata) == ("stream", "got 7", {"modality": "text", "session_id": "s1"})
    assert result.data.data == {"session_id": "s1", "op": "append", "count": 1}


def test_open_past_max_sessions_is_overloaded(make: Any) -> None:
    scheduler = make(max_sessions=2)
    for index in range(3):
        scheduler.inbox.put(command(f"o{index}", "open", f"s{index}"))
    outputs = collect(scheduler, "o0", "o1", "o2")
    error = final(outputs, "o2")
    assert error.type == "error" and isinstance(error.data, StageOverloaded)
    assert "max_sessions=2" in str(error.data)


def test_closing_a_session_frees_its_slot(make: Any) -> None:
    scheduler = make(max_sessions=1)
    scheduler.inbox.put(command("o0", "open", "s0"))
    scheduler.inbox.put(command("c0", "close", "s0"))
    collect(scheduler, "o0", "c0")
    scheduler.inbox.put(command("o1", "open", "s1"))
    assert final(collect(scheduler, "o1"), "o1").type == "result"


def test_append_past_max_state_bytes_is_overloaded_and_keeps_the_session(make: Any) -> None:
    scheduler = make(max_state_bytes=1000)
    scheduler.inbox.put(command("o", "open"))
    scheduler.inbox.put(command("a1", "append", chunk=np.full(100, 1, dtype=np.float64)))  # 800 bytes
    scheduler.inbox.put(command("a2", "append", chunk=np.full(50, 2, dtype=np.float64)))  # 400 more: too many
    scheduler.inbox.put(command("c", "close"))
    outputs = collect(scheduler, "o", "a1", "a2", "c")
    error = final(outputs, "a2")
    assert isinstance(error.data, StageOverloaded) and "max_state_bytes=1000" in str(error.data)
    assert final(outputs, "c").data.data["items"] == [1]
    assert scheduler.state_bytes == 0


def test_abort_op_aborts_then_closes_and_forgets_the_session(make: Any, hooks: ListHooks) -> None:
    scheduler = make()
    scheduler.inbox.put(command("o", "open"))
    scheduler.inbox.put(command("x", "abort"))
    scheduler.inbox.put(command("a", "append", chunk=1))
    outputs = collect(scheduler, "o", "x", "a")
    assert final(outputs, "x").type == "result"
    assert hooks.calls == [("abort", "s1"), ("close", "s1")]
    assert "not open" in str(final(outputs, "a").data)
    assert scheduler.open_sessions == 0


def test_aborting_a_session_that_is_not_open_succeeds_and_does_nothing(make: Any, hooks: ListHooks) -> None:
    """A client that leaves while its session opens aborts it; that is normal use, not a failure."""
    scheduler = make()
    scheduler.inbox.put(command("x", "abort", "never-opened"))
    done = final(collect(scheduler, "x"), "x")
    assert done.type == "result" and done.data.data == {"session_id": "never-opened", "op": "abort"}
    assert hooks.calls == []
    assert scheduler.open_sessions == 0


def test_command_for_unknown_session_names_it(make: Any) -> None:
    scheduler = make()
    scheduler.inbox.put(command("a", "append", "ghost", chunk=1))
    error = final(collect(scheduler, "a"), "a")
    assert error.type == "error" and "session 'ghost' is not open" in str(error.data)


def test_malformed_command_names_the_field(make: Any) -> None:
    scheduler = make()
    scheduler.inbox.put(command("a", "rewind"))
    error = final(collect(scheduler, "a"), "a")
    assert isinstance(error.data, ValueError) and "op must be one of" in str(error.data)


def test_opening_an_open_session_fails(make: Any) -> None:
    scheduler = make()
    scheduler.inbox.put(command("o1", "open"))
    scheduler.inbox.put(command("o2", "open"))
    assert "already open" in str(final(collect(scheduler, "o1", "o2"), "o2").data)


def test_failed_open_leaves_no_session(make: Any, hooks: ListHooks) -> None:
    hooks.fail_open = True
    scheduler = make()
    scheduler.inbox.put(command("o", "open"))
    assert "open failed on purpose" in str(final(collect(scheduler, "o"), "o").data)
    assert scheduler.open_sessions == 0


def test_aborted_request_produces_no_output_and_its_append_never_runs(make: Any, hooks: ListHooks) -> None:
    hooks.append_gate[1] = gate = threading.Event()
    scheduler = make()
    scheduler.inbox.put(command("o", "open"))
    scheduler.inbox.put(command("a1", "append", chunk=1))
    scheduler.inbox.put(command("a2", "append", chunk=2))
    collect(scheduler, "o")
    scheduler.abort("a2")
    gate.set()
    scheduler.inbox.put(command("c", "close"))
    outputs = collect(scheduler, "a1", "c")
    assert "a2" not in outputs
    assert final(outputs, "c").data.data["items"] == [1]


def test_plain_request_runs_compute_fn(make: Any) -> None:
    scheduler = make(compute_fn=lambda payload: f"plain {payload.request.inputs}")
    scheduler.inbox.put(IncomingMessage("p", "new_request", StagePayload("p", OmniRequest(inputs="x"))))
    assert final(collect(scheduler, "p"), "p").data == "plain x"


def test_plain_request_without_compute_fn_is_an_error(make: Any) -> None:
    scheduler = make()
    scheduler.inbox.put(IncomingMessage("p", "new_request", StagePayload("p", OmniRequest(inputs="x"))))
    assert "no metadata['session']" in str(final(collect(scheduler, "p"), "p").data)


def test_stop_aborts_and_closes_open_sessions(hooks: ListHooks) -> None:
    scheduler = SessionScheduler(hooks)
    thread = threading.Thread(target=scheduler.start)
    thread.start()
    scheduler.inbox.put(command("o", "open"))
    collect(scheduler, "o")
    scheduler.stop()
    thread.join(10)
    assert hooks.calls == [("abort", "s1"), ("close", "s1")]
    assert scheduler.open_sessions == 0


def test_bad_limits_are_rejected(hooks: ListHooks) -> None:
    with pytest.raises(ValueError, match="max_sessions"):
        SessionScheduler(hooks, max_sessions=0)
