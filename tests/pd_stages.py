"""A prefill/decode pair for the ``admitted`` test: prefill hands each request to its decode
partner through their own channel (``kv_transfer``); decode admits it and answers."""

from __future__ import annotations

import queue
from typing import Any

from omnitrio.contract import IncomingMessage, OutgoingMessage, StagePayload

_CHANNELS: dict[str, queue.Queue[Any]] = {}
"""Per test key: prefill → decode (this process only: both stages share it)."""
CHUNKS = 20
"""More than one stream window: decode needs the caller's credits to finish."""


def _channel(key: str) -> queue.Queue[Any]:
    return _CHANNELS.setdefault(key, queue.Queue())


class _Partner:
    """One side of the pair: queues, the channel, no-op warm-up and abort."""

    def __init__(self, key: str) -> None:
        self.inbox: queue.Queue[IncomingMessage | None] = queue.Queue()
        self.outbox: queue.Queue[OutgoingMessage] = queue.Queue()
        self._channel = _channel(key)

    def warm_up_serving_thread(self) -> None:
        return None

    def abort(self, request_id: str) -> None:
        return None


class Prefill(_Partner):
    def start(self) -> None:
        while (msg := self.inbox.get()) is not None:
            if msg.type == "new_request":
                assert isinstance(msg.data, StagePayload)
                self._channel.put((msg.request_id, msg.data.data["raw_inputs"]))
                self.outbox.put(OutgoingMessage(msg.request_id, "kv_transfer"))

    def stop(self) -> None:
        self.inbox.put(None)


class Decode(_Partner):
    """Reads only its partner's channel; its inbox brings nothing it needs."""

    def start(self) -> None:
        while (item := self._channel.get()) is not None:
            rid, text = item
            self.outbox.put(OutgoingMessage(rid, "admitted"))
            for i in range(CHUNKS):
                self.outbox.put(OutgoingMessage(rid, "stream", data=i))
            self.outbox.put(OutgoingMessage(rid, "result", data=StagePayload(rid, None, {"decoded": text})))

    def stop(self) -> None:
        self._channel.put(None)


def create_prefill(key: str) -> Prefill:
    return Prefill(key)


def create_decode(key: str) -> Decode:
    return Decode(key)
