"""Streaming stage factories for the streaming tests."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from omnitrio.contract import IncomingMessage, OutgoingMessage, StagePayload, StreamItem
from schedulers.streaming import StreamingSimpleScheduler


class Producer:
    """Streams ``count`` chunks per request (``count=0``: until aborted), then its result.

    The outbox is bounded, as a real generator's should be: when the runtime stops
    draining it, ``put`` blocks and the producer slows down.
    """

    def __init__(self, count: int = 5, chunk_bytes: int = 16, outbox_size: int = 32) -> None:
        self.inbox: queue.Queue[IncomingMessage | None] = queue.Queue()
        self.outbox: queue.Queue[OutgoingMessage] = queue.Queue(maxsize=outbox_size)
        self.count = count
        self.chunk_bytes = chunk_bytes
        self._aborted: set[str] = set()
        self._lock = threading.Lock()
        self._stopped = False

    def warm_up_serving_thread(self) -> None:
        return

    def start(self) -> None:
        workers: list[threading.Thread] = []
        while (msg := self.inbox.get()) is not None:
            if msg.type != "new_request":
                continue
            worker = threading.Thread(target=self._produce, args=(msg,), daemon=True)
            worker.start()
            workers = [w for w in workers if w.is_alive()]  # finished ones hold memory
            workers.append(worker)
        for worker in workers:
            worker.join(timeout=5)

    def _produce(self, msg: IncomingMessage) -> None:
        """One request's chunks (an int input overrides ``count``); requests produce concurrently."""
        rid = msg.request_id
        wanted = msg.data.data.get("raw_inputs")
        count = wanted if isinstance(wanted, int) else self.count
        i = 0
        while (count == 0 or i < count) and not self._stopped:
            with self._lock:
                if rid in self._aborted:
                    self._aborted.discard(rid)
                    break
            chunk = {"i": i, "blob": b"x" * self.chunk_bytes}
            try:
                self.outbox.put(OutgoingMessage(rid, "stream", data=chunk, metadata={"modality": "test"}), timeout=1)
            except queue.Full:
                continue  # flow control holds us back; look at abort/stop again
            i += 1
        else:
            payload: StagePayload = msg.data
            payload.data = {"sent": i}
            self.outbox.put(OutgoingMessage(rid, "result", data=payload))

    def stop(self) -> None:
        self._stopped = True
        self.inbox.put(None)
        try:
            while True:
                self.outbox.get_nowait()  # unblock a put waiting on a full outbox
        except queue.Empty:
            return

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborted.add(request_id)


def create_producer(count: int = 5, chunk_bytes: int = 16, outbox_size: int = 32) -> Producer:
    return Producer(count, chunk_bytes, outbox_size)


class Counter(StreamingSimpleScheduler):
    """Counts chunks; completes on end-of-stream (streaming payload) or at once (other)."""

    def __init__(self, streaming: bool = True, fail_at_chunk: int | None = None) -> None:
        super().__init__(compute_fn=self._finish_now)
        self.streaming = streaming
        self.fail_at_chunk = fail_at_chunk
        self.seen: dict[str, list[int]] = {}
        self.events: dict[str, list[str]] = {}

    def _finish_now(self, payload: StagePayload) -> StagePayload:
        rid = payload.request_id
        payload.data = {"chunk_ids": self.seen.pop(rid, []), "done": False, "events": self.events.pop(rid, [])}
        return payload

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        return self.streaming

    def on_streaming_new_request(self, request_id: str, payload: StagePayload) -> None:
        self.events.setdefault(request_id, []).append("payload")

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        if item.chunk_id == self.fail_at_chunk:
            raise ValueError(f"chunk {item.chunk_id} is not what I wanted")
        self.seen.setdefault(request_id, []).append(item.chunk_id)
        return []

    def on_stream_done_before_payload(self, request_id: str) -> list[OutgoingMessage]:
        self.events.setdefault(request_id, []).append("done-before-payload")
        return []

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage]:
        payload = self.stream_payloads[request_id]
        events = [*self.events.pop(request_id, []), "done"]
        payload.data = {"chunk_ids": self.seen.pop(request_id, []), "done": True, "events": events}
        return [OutgoingMessage(request_id, "result", data=payload)]

    def clear_stream_state(self, request_id: str) -> None:
        self.seen.pop(request_id, None)
        self.events.pop(request_id, None)


def create_counter(streaming: bool = True, fail_at_chunk: int | None = None) -> Counter:
    return Counter(streaming, fail_at_chunk)


class OrderRecorder(StreamingSimpleScheduler):
    """Notes where in its overall order each request's first chunk came; stalls on the very first.

    The stall (``first_chunk_delay`` seconds, holding the scheduler thread) lets a backlog
    build up in front of it, as a busy model would.
    """

    def __init__(self, first_chunk_delay: float) -> None:
        super().__init__(compute_fn=None)
        self.first_chunk_delay = first_chunk_delay
        self.handled = 0
        self.first_at: dict[str, int] = {}

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        return True

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        if self.handled == 0:
            time.sleep(self.first_chunk_delay)
        self.first_at.setdefault(request_id, self.handled)
        self.handled += 1
        return []

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage]:
        payload = self.stream_payloads[request_id]
        payload.data = {"first_chunk_at": self.first_at.pop(request_id, None)}
        return [OutgoingMessage(request_id, "result", data=payload)]

    def clear_stream_state(self, request_id: str) -> None:
        self.first_at.pop(request_id, None)


def create_order_recorder(first_chunk_delay: float = 0.5) -> OrderRecorder:
    return OrderRecorder(first_chunk_delay)


def done_only_to_b(request_id: str, result: Any) -> list[str]:
    return ["b"]
