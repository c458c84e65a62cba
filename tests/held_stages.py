"""Streaming stages a test holds and releases through ``threading.Event`` objects (inline pipelines only:
the events are passed as factory arguments, so the stage must run in the test's process)."""

from __future__ import annotations

import threading

from omnitrio.contract import IncomingMessage, OutgoingMessage, StreamItem
from toys.stream_stages import OrderRecorder, Producer

H = "tests.held_stages"


class HeldRecorder(OrderRecorder):
    """An :class:`OrderRecorder` that holds the very first chunk it gets until ``release`` is set."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__(first_chunk_delay=0)
        self.release = release

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        if self.handled == 0:
            self.release.wait(60)
        return super().on_stream_chunk(request_id, item)


def create_held_recorder(release: threading.Event) -> HeldRecorder:
    return HeldRecorder(release)


class NotedProducer(Producer):
    """A :class:`Producer` that sets ``produced`` once it has put a request's last output in its outbox."""

    def __init__(self, produced: threading.Event, **options: int) -> None:
        super().__init__(**options)
        self.produced = produced

    def _produce(self, msg: IncomingMessage) -> None:
        super()._produce(msg)
        self.produced.set()


def create_noted_producer(produced: threading.Event, count: int = 5, outbox_size: int = 32) -> NotedProducer:
    return NotedProducer(produced, count=count, outbox_size=outbox_size)
