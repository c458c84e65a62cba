"""Stage factories for test_reused_ids: one of every scheduler family, each able to run long
enough to be aborted mid-request, and a producer that streams token ids until aborted.

No torch here (stage processes start faster); the AR family is in :mod:`tests.reuse_ar_stages`."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from omnitrio.contract import IncomingMessage, OutgoingMessage, StagePayload, StreamItem
from schedulers.detokenize import StreamingDetokenizeScheduler
from schedulers.session import SessionContext, SessionRef, SessionScheduler
from schedulers.simple import SimpleScheduler
from schedulers.streaming import StreamingSimpleScheduler
from schedulers.threaded import ThreadedSimpleScheduler
from schedulers.vocoder import BatchVocoderBase, StreamingVocoderBase


def inputs_of(payload: StagePayload) -> dict[str, Any]:
    data = payload.data
    raw = data.get("raw_inputs", data) if isinstance(data, dict) else data
    return raw if isinstance(raw, dict) else {}


class TokenStreamer:
    """Streams ``{"token_ids": [97 + i % 26]}`` chunks, ``inputs["count"]`` of them (0: until
    aborted), then its result ``{"sent": n}``.  One request at a time; the outbox is bounded,
    so an unread stream holds it back.  ``abort`` stops the request it names before its next chunk."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[IncomingMessage | None] = queue.Queue()
        self.outbox: queue.Queue[OutgoingMessage] = queue.Queue(maxsize=8)
        self._lives: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def warm_up_serving_thread(self) -> None:
        return

    def start(self) -> None:
        while (msg := self.inbox.get()) is not None:
            if msg.type == "new_request":
                self._produce(msg.request_id, msg.data)

    def _produce(self, rid: str, payload: StagePayload) -> None:
        aborted = threading.Event()
        with self._lock:
            self._lives[rid] = aborted
        count = int(inputs_of(payload).get("count", 0))
        sent = 0
        while (count == 0 or sent < count) and not aborted.is_set() and not self._stopped.is_set():
            chunk = OutgoingMessage(rid, "stream", data={"token_ids": [97 + sent % 26]})
            try:
                self.outbox.put(chunk, timeout=0.05)
            except queue.Full:
                continue
            sent += 1
        with self._lock:
            self._lives.pop(rid, None)
        if not aborted.is_set():
            payload.data = {"sent": sent}
            self.outbox.put(OutgoingMessage(rid, "result", data=payload))

    def stop(self) -> None:
        self._stopped.set()
        self.inbox.put(None)

    def abort(self, request_id: str) -> None:
        with self._lock:
            life = self._lives.get(request_id)
        if life is not None:
            life.set()


def create_streamer() -> TokenStreamer:
    return TokenStreamer()


# Stream consumers (behind the streamer, accepting stream data before the payload) -----------------


class Relay(StreamingSimpleScheduler):
    """StreamingSimpleScheduler: passes every chunk's token ids on; the result counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        return True

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        self.counts[request_id] = self.counts.get(request_id, 0) + 1
        return [OutgoingMessage(request_id, "stream", data=item.data, metadata={"modality": "tokens"})]

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage]:
        payload = self.stream_payloads[request_id]
        payload.data = {"chunks": self.counts.get(request_id, 0)}
        return [OutgoingMessage(request_id, "result", data=payload)]

    def clear_stream_state(self, request_id: str) -> None:
        self.counts.pop(request_id, None)


def create_relay() -> Relay:
    return Relay()


class TokenVocoder(StreamingVocoderBase[list[int]]):
    """StreamingVocoderBase: "decodes" each token id to one sample; the result counts samples."""

    sample_rate = 16_000
    stream_input_modality = None

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        return True

    def create_stream_state(self, request_id: str) -> list[int]:
        return []

    def validate_chunk(self, request_id: str, state: list[int], codes: Any) -> list[int]:
        return list(codes["token_ids"])

    def ingest(self, request_id: str, state: list[int], codes: list[int]) -> None:
        state.extend(codes)

    def decode_delta(self, request_id: str, state: list[int], *, is_final: bool) -> list[int] | None:
        audio, state[:] = list(state), []
        return audio or None

    def final_result_data(self, request_id: str, payload: StagePayload, state: list[int]) -> Any:
        return {"sent": payload.data.get("sent") if isinstance(payload.data, dict) else None}


def create_token_vocoder() -> TokenVocoder:
    return TokenVocoder()


class CharTokenizer:
    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def create_detokenizer() -> StreamingDetokenizeScheduler:
    return StreamingDetokenizeScheduler(CharTokenizer(), eos_token_id=None)


# Request-at-a-time families (the request is aborted while it computes) -----------------------------


def slow_tag(payload: StagePayload) -> StagePayload:
    """Sleeps ``inputs["sleep"]`` seconds, then answers ``{"tag": inputs["tag"]}``."""
    inputs = inputs_of(payload)
    time.sleep(float(inputs.get("sleep", 0)))
    payload.data = {"tag": inputs.get("tag")}
    return payload


def slow_tags(payloads: list[StagePayload]) -> list[StagePayload]:
    return [slow_tag(p) for p in payloads]


def create_simple() -> SimpleScheduler:
    return SimpleScheduler(slow_tag)


def create_batching() -> SimpleScheduler:
    return SimpleScheduler(None, batch_compute_fn=slow_tags, max_batch_size=4, max_batch_wait_ms=1)


def create_threaded() -> ThreadedSimpleScheduler:
    return ThreadedSimpleScheduler(slow_tag, max_concurrency=2)


class SleepyBatchVocoder(BatchVocoderBase[str, float]):
    """BatchVocoderBase: each item sleeps ``inputs["sleep"]``; its "waveform" is the tag."""

    def prepare_item(self, payload: StagePayload) -> tuple[str, float]:
        inputs = inputs_of(payload)
        return str(inputs.get("tag")), float(inputs.get("sleep", 0))

    def decode_batch(self, items: list[tuple[str, float]]) -> list[tuple[Any, int]]:
        time.sleep(max(seconds for _, seconds in items))
        return [(tag, 16_000) for tag, _ in items]

    def store_result(self, payload: StagePayload, state: str, wav: Any, sample_rate: int) -> StagePayload:
        payload.data = {"tag": wav}
        return payload


def create_batch_vocoder() -> SimpleScheduler:
    return SleepyBatchVocoder().build_scheduler(max_batch_size=4, max_batch_wait_ms=1)


class TickingHooks:
    """SessionScheduler hooks: an append emits ``chunk`` ticks 5 ms apart and returns how many."""

    def open(self, ref: SessionRef, request: Any) -> list[int]:
        return []

    def append(self, state: list[int], chunk: Any, payload: StagePayload, ctx: SessionContext) -> dict[str, Any]:
        for i in range(int(chunk)):
            ctx.emit(i)
            time.sleep(0.005)
        state.append(int(chunk))
        return {"ticks": int(chunk)}

    def abort(self, state: list[int], ref: SessionRef) -> None:
        return

    def close(self, state: list[int]) -> dict[str, Any]:
        return {"appends": list(state)}

    def usage(self, state: list[int]) -> int:
        return 8 * len(state)


def create_session() -> SessionScheduler:
    return SessionScheduler(TickingHooks(), max_concurrency=2)
