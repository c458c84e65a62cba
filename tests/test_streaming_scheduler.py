"""StreamingSimpleScheduler driven directly: chunks, end-of-stream, payloads, aborts."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from omnitrio.contract import IncomingMessage, OutgoingMessage, StagePayload, StreamItem
from schedulers.streaming import StreamingSimpleScheduler
from tests.scheduler_harness import TIMEOUT, chunk, done, new, put_atomically, running, take
from toys.seed.ch4_stream_stages import ToyVocoderScheduler  # the seed's experiment 3 vocoder


class Collector(StreamingSimpleScheduler):
    """Streams ``2 * chunk``; on done, returns the collected chunks as the result.

    A payload streams when its data is ``{"stream": True}``.  ``fail_on`` names request ids
    whose chunks raise.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.collected: dict[str, list[Any]] = {}
        self.cleared: list[str] = []
        self.fail_on: set[str] = set()

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        return isinstance(payload.data, dict) and bool(payload.data.get("stream"))

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        if request_id in self.fail_on:
            raise RuntimeError(f"cannot decode chunk {item.chunk_id}")
        self.collected.setdefault(request_id, []).append(item.data)
        return [OutgoingMessage(request_id, "stream", data=item.data * 2)]

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage] | None:
        payload = self.stream_payloads[request_id]
        payload.data = {"chunks": self.collected.get(request_id, [])}
        return [OutgoingMessage(request_id, "result", data=payload)]

    def on_stream_done_before_payload(self, request_id: str) -> list[OutgoingMessage]:
        return [OutgoingMessage(request_id, "stream", data="tail")]

    def clear_stream_state(self, request_id: str) -> None:
        self.cleared.append(request_id)
        self.collected.pop(request_id, None)


STREAM = {"stream": True}


def fence(s: StreamingSimpleScheduler, rid: str = "fence") -> None:
    """Round-trip a non-streaming request: everything put before it has been handled."""
    s.inbox.put(new(rid, "plain"))
    out = take(s.outbox)[0]
    assert (out.request_id, out.type) == (rid, "result"), out


def echo(p: StagePayload) -> StagePayload:
    return p


def test_chunks_before_payload_stream_out_as_they_come() -> None:
    with running(Collector(compute_fn=echo)) as s:
        s.inbox.put(chunk("r1", 0, 1))
        assert take(s.outbox)[0].data == 2  # before any payload
        s.inbox.put(chunk("r1", 1, 2))
        assert take(s.outbox)[0].data == 4
        s.inbox.put(new("r1", STREAM))
        s.inbox.put(chunk("r1", 2, 3))
        assert take(s.outbox)[0].data == 6
        s.inbox.put(done("r1"))
        (result,) = take(s.outbox)
        fence(s)
        assert (result.type, result.data.data) == ("result", {"chunks": [1, 2, 3]})
        assert s.stream_payloads == {}
        assert s.pending_done == set()
        assert s.collected == {}


def test_done_before_payload_emits_at_once_and_completes_on_payload() -> None:
    with running(Collector(compute_fn=echo)) as s:
        put_atomically(s.inbox, [chunk("r1", 0, 1), done("r1")])
        first, tail = take(s.outbox, 2)
        assert (first.data, tail.data) == (2, "tail")
        assert s.pending_done == {"r1"}
        s.inbox.put(new("r1", STREAM))
        (result,) = take(s.outbox)
        assert result.data.data == {"chunks": [1]}
        fence(s)
        assert s.pending_done == set()
        assert s.stream_payloads == {}


def test_streaming_payload_waits_for_done() -> None:
    with running(Collector(compute_fn=echo)) as s:
        s.inbox.put(new("r1", STREAM))
        fence(s)
        assert set(s.stream_payloads) == {"r1"}
        s.inbox.put(done("r1"))
        assert take(s.outbox)[0].type == "result"


def test_non_streaming_payloads_still_batch() -> None:
    batches: list[list[str]] = []

    def batch(ps: list[StagePayload]) -> list[StagePayload]:
        batches.append([p.request_id for p in ps])
        return ps

    with running(Collector(compute_fn=echo, batch_compute_fn=batch, max_batch_size=8)) as s:
        put_atomically(s.inbox, [new("a"), new("s", STREAM), new("b"), chunk("s", 0, 1), new("c")])
        outs = take(s.outbox, 4)
        assert sorted((o.request_id, o.type) for o in outs) == [
            ("a", "result"),
            ("b", "result"),
            ("c", "result"),
            ("s", "stream"),
        ]
        assert set(s.stream_payloads) == {"s"}
    assert batches == [["a", "b", "c"]]


def test_hook_error_fails_only_its_request() -> None:
    with running(Collector(compute_fn=echo)) as s:
        s.fail_on.add("bad")
        put_atomically(s.inbox, [new("bad", STREAM), new("good", STREAM), chunk("bad", 0, 1), chunk("good", 0, 1)])
        error, streamed = take(s.outbox, 2)
        assert (error.request_id, error.type) == ("bad", "error")
        assert str(error.data) == "cannot decode chunk 0"
        assert (streamed.request_id, streamed.type) == ("good", "stream")
        s.inbox.put(done("good"))
        assert take(s.outbox)[0].data.data == {"chunks": [1]}
        fence(s)
        assert s.stream_payloads == {}
        assert "bad" in s.cleared


def test_late_chunks_after_failure_create_no_state() -> None:
    with running(Collector(compute_fn=echo)) as s:
        s.fail_on.add("bad")
        put_atomically(s.inbox, [chunk("bad", 0, 1)])
        assert take(s.outbox)[0].type == "error"
        s.fail_on.clear()
        put_atomically(s.inbox, [chunk("bad", 1, 2), done("bad")])
        fence(s)
        assert s.collected == {}
        assert s.pending_done == set()


def test_is_streaming_payload_error_fails_the_request() -> None:
    class Picky(Collector):
        def is_streaming_payload(self, payload: StagePayload) -> bool:
            raise KeyError("params must be a dict")

    with running(Picky(compute_fn=echo)) as s:
        s.inbox.put(new("r1", STREAM))
        (out,) = take(s.outbox)
    assert out.type == "error"
    assert isinstance(out.data, KeyError)


def test_non_stream_item_chunk_fails_the_request() -> None:
    with running(Collector(compute_fn=echo)) as s:
        s.inbox.put(IncomingMessage("r1", "stream_chunk", data=[1, 2]))
        (out,) = take(s.outbox)
    assert out.type == "error"
    assert "StreamItem" in str(out.data)


def test_late_chunk_after_abort_creates_no_state() -> None:
    aborted: list[str] = []
    with running(Collector(compute_fn=echo, abort_callback=aborted.append)) as s:
        s.inbox.put(chunk("r1", 0, 1))
        take(s.outbox)
        assert s.collected == {"r1": [1]}
        s.abort("r1")
        put_atomically(s.inbox, [chunk("r1", 1, 2), done("r1")])
        fence(s)
        assert s.collected == {}
        assert s.pending_done == set()
        assert "r1" in s.cleared
        assert aborted == ["r1"]
    assert s.outbox.empty()


def test_abort_message_clears_streaming_request() -> None:
    with running(Collector(compute_fn=echo)) as s:
        put_atomically(s.inbox, [new("r1", STREAM), chunk("r1", 0, 1)])
        take(s.outbox)
        s.inbox.put(IncomingMessage("r1", "abort"))
        fence(s)
        assert s.stream_payloads == {}
        assert s.collected == {}
        assert "r1" in s.cleared
    assert s.outbox.empty()


def test_what_follows_the_abort_message_is_a_new_life_even_chunks_first() -> None:
    """The runtime's order: abort() now, the abort message in order, then the reused id's
    new life, whose chunks may come before its payload (stream before payload)."""
    aborted: list[str] = []
    with running(Collector(compute_fn=echo, abort_callback=aborted.append)) as s:
        put_atomically(s.inbox, [chunk("r1", 0, 1), chunk("r1", 1, 2)])
        take(s.outbox, 2)
        s.abort("r1")
        put_atomically(s.inbox, [chunk("r1", 2, 3), IncomingMessage("r1", "abort")])
        put_atomically(s.inbox, [chunk("r1", 0, 7), done("r1"), new("r1", STREAM)])
        streamed, tail, result = take(s.outbox, 3)
    assert (streamed.data, tail.data) == (14, "tail")
    assert result.data.data == {"chunks": [7]}
    assert aborted == ["r1"]


def test_an_abort_message_alone_also_starts_a_new_life() -> None:
    """Without a prior abort() call (another runtime), the message aborts and ends the life."""
    aborted: list[str] = []
    with running(Collector(compute_fn=echo, abort_callback=aborted.append)) as s:
        s.inbox.put(chunk("r1", 0, 1))
        take(s.outbox)
        put_atomically(s.inbox, [IncomingMessage("r1", "abort"), chunk("r1", 0, 5), done("r1"), new("r1", STREAM)])
        streamed, tail, result = take(s.outbox, 3)
    assert (streamed.data, tail.data) == (10, "tail")
    assert result.data.data == {"chunks": [5]}
    assert aborted == ["r1"]


def test_a_new_life_after_a_failure_may_begin_with_its_end_of_stream() -> None:
    with running(Collector(compute_fn=echo)) as s:
        s.fail_on.add("r1")
        s.inbox.put(chunk("r1", 0, 1))
        assert take(s.outbox)[0].type == "error"
        s.fail_on.clear()
        put_atomically(s.inbox, [chunk("r1", 1, 2), IncomingMessage("r1", "abort")])
        put_atomically(s.inbox, [done("r1"), new("r1", STREAM)])
        tail, result = take(s.outbox, 2)
    assert tail.data == "tail"
    assert result.data.data == {"chunks": []}


def test_id_is_reusable_after_abort() -> None:
    with running(Collector(compute_fn=echo)) as s:
        put_atomically(s.inbox, [new("r1", STREAM), chunk("r1", 0, 1)])
        take(s.outbox)
        s.abort("r1")
        put_atomically(s.inbox, [new("r1", STREAM), chunk("r1", 0, 7), done("r1")])
        streamed, result = take(s.outbox, 2)
    assert streamed.data == 14
    assert result.data.data == {"chunks": [7]}


def test_abort_before_arrival_drops_that_request() -> None:
    with running(Collector(compute_fn=echo)) as s:
        s.abort("r1")
        put_atomically(s.inbox, [chunk("r1", 0, 1), new("r1", STREAM), done("r1")])
        fence(s)
        assert s.stream_payloads == {}
        assert s.collected == {}
    assert s.outbox.empty()


def test_completion_later_from_another_thread() -> None:
    class Deferred(Collector):
        def on_stream_done(self, request_id: str) -> list[OutgoingMessage] | None:
            payload = self.stream_payloads[request_id]
            threading.Thread(
                target=self.complete_stream_request,
                args=(request_id, [OutgoingMessage(request_id, "result", data=payload)]),
            ).start()
            return None

    with running(Deferred(compute_fn=echo)) as s:
        put_atomically(s.inbox, [new("r1", STREAM), done("r1")])
        (out,) = take(s.outbox)
        assert out.type == "result"
        fence(s)
        assert s.stream_payloads == {}
        assert "r1" in s.cleared


def test_non_streaming_payload_without_compute_fn_fails_clearly() -> None:
    with running(Collector()) as s:
        s.inbox.put(new("r1", "plain"))
        (out,) = take(s.outbox)
    assert out.type == "error"
    assert "compute_fn" in str(out.data)


def test_stop_returns_promptly() -> None:
    s = Collector()
    thread = threading.Thread(target=s.start, daemon=True)
    thread.start()
    s.stop()
    thread.join(TIMEOUT)
    assert not thread.is_alive()


def talker_codes(rid: str) -> list[IncomingMessage]:
    return [chunk(rid, step, np.array([step * 10 + 1, step * 10 + 2])) for step in range(3)]


def test_seed_vocoder_streams_then_completes_when_done_precedes_payload() -> None:
    with running(ToyVocoderScheduler()) as s:
        # What the runtime delivers: the code stream, end-of-stream, then the payload.
        put_atomically(s.inbox, [*talker_codes("r1"), done("r1"), new("r1", {"num_steps": 3})])
        outs = take(s.outbox, 4)
    assert [o.data for o in outs[:3]] == [{"samples": [100, 200]}, {"samples": [1100, 1200]}, {"samples": [2100, 2200]}]
    assert [o.metadata for o in outs[:3]] == [{"modality": "audio"}] * 3
    assert (outs[3].type, outs[3].data.data) == ("result", {"total_samples": 6})
    assert s.stream_payloads == {}
    assert s.pending_done == set()


def test_seed_vocoder_completes_when_payload_precedes_done() -> None:
    with running(ToyVocoderScheduler()) as s:
        put_atomically(s.inbox, [new("r1", {"num_steps": 3}), *talker_codes("r1"), done("r1")])
        outs = take(s.outbox, 4)
    assert outs[3].data.data == {"total_samples": 6}
