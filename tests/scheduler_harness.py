"""Drive a scheduler directly: its thread, its inbox, its outbox (shared by the scheduler tests)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from omnitrio.contract import IncomingMessage, OmniRequest, OutgoingMessage, StagePayload, StreamItem
from toys.stage_feed import put_atomically as put_atomically
from toys.stage_feed import running as toy_running

TIMEOUT = 2.0


def running(scheduler: Any, *, warm_up: bool = False) -> Any:
    """:func:`toys.stage_feed.running`, joined within :data:`TIMEOUT`."""
    return toy_running(scheduler, warm_up=warm_up, timeout=TIMEOUT)


@contextmanager
def schedulers_running(timeout: float = 10) -> Iterator[Callable[[Any], Any]]:
    """A function that starts each scheduler given (:func:`toys.stage_feed.running`) and returns it; when the
    block ends every one is stopped and joined within ``timeout`` seconds."""
    with ExitStack() as stack:
        yield lambda scheduler: stack.enter_context(toy_running(scheduler, timeout=timeout))


def payload(rid: str, data: Any = None) -> StagePayload:
    return StagePayload(rid, OmniRequest(inputs=data), data)


def new(rid: str, data: Any = None) -> IncomingMessage:
    return IncomingMessage(rid, "new_request", payload(rid, data))


def chunk(rid: str, chunk_id: int, data: Any) -> IncomingMessage:
    return IncomingMessage(rid, "stream_chunk", StreamItem(chunk_id, data, "upstream"))


def done(rid: str) -> IncomingMessage:
    return IncomingMessage(rid, "stream_done", "upstream")


def take(outbox: queue.Queue[OutgoingMessage], count: int = 1) -> list[OutgoingMessage]:
    return [outbox.get(timeout=TIMEOUT) for _ in range(count)]


def by_id(messages: list[OutgoingMessage]) -> dict[str, OutgoingMessage]:
    return {msg.request_id: msg for msg in messages}


def answer_burst(scheduler: Any, messages: list[IncomingMessage]) -> dict[str, OutgoingMessage]:
    """Start ``scheduler``, hand it ``messages`` as one burst (:func:`put_atomically`) and return one output
    per message, by request id; the scheduler is stopped after."""
    with running(scheduler):
        put_atomically(scheduler.inbox, messages)
        return by_id(take(scheduler.outbox, len(messages)))


def until_final(scheduler: Any, rid: str) -> list[OutgoingMessage]:
    """``rid``'s outputs up to and with its result or error; an output of another request fails the test."""
    seen: list[OutgoingMessage] = []
    while not seen or seen[-1].type not in ("result", "error"):
        out = scheduler.outbox.get(timeout=TIMEOUT)
        assert out.request_id == rid, out
        seen.append(out)
    return seen


def outputs_until_done(scheduler: Any, rids: set[str], timeout: float = 10) -> list[OutgoingMessage]:
    """Everything ``scheduler`` sends until each of ``rids`` has a result or an error, in order."""
    pending, seen = set(rids), []
    while pending:
        out = scheduler.outbox.get(timeout=timeout)
        seen.append(out)
        if out.type in ("result", "error"):
            pending.discard(out.request_id)
    return seen


class Gate:
    """A compute_fn that blocks chosen requests until released."""

    def __init__(self, *blocking: str) -> None:
        self.blocking = set(blocking)
        self.started = {rid: threading.Event() for rid in blocking}
        self.release = threading.Event()
        self.calls: list[str] = []

    def __call__(self, p: StagePayload) -> StagePayload:
        self.calls.append(p.request_id)
        if p.request_id in self.blocking:
            self.started[p.request_id].set()
            assert self.release.wait(TIMEOUT)
        return p

    def wait_started(self, rid: str) -> None:
        assert self.started[rid].wait(TIMEOUT)


def ask_streamed(scheduler: Any, rid: str, inputs: Any) -> tuple[list[OutgoingMessage], OutgoingMessage]:
    """Send one request that streams (``inputs`` as a chat responder reads them); its stream chunks and its
    result (or error), in order."""
    request = StagePayload(rid, OmniRequest(inputs, params={"stream": True}), {"raw_inputs": inputs})
    scheduler.inbox.put(IncomingMessage(rid, "new_request", request))
    chunks = []
    while (out := scheduler.outbox.get(timeout=300)).type == "stream":
        chunks.append(out)
    return chunks, out
