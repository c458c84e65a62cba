"""Routes, terminals and fan-in sources chosen by the request, a stage that streams to the
stages the request names, a stage a test opens like a gate, and a scheduler whose ``stop()``
leaves its ``start()`` blocked: for the tests of routed-away stages, of what completion
releases, and of bounded shutdown.  Everything here works inline and in stage processes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from omnitrio.contract import IncomingMessage, OutgoingMessage, StagePayload
from schedulers.simple import SimpleScheduler
from toys.hand_scheduler import HandScheduler

R = "tests.route_stages"


def _route_from_inputs(key: str) -> Callable[[str, StagePayload], Any]:
    """A ``route_fn`` that sends the request where its inputs say, under ``key``."""

    def route(request_id: str, payload: StagePayload) -> Any:
        return payload.request.inputs[key]

    return route


route_router = _route_from_inputs("router")
route_x = _route_from_inputs("x")
route_y = _route_from_inputs("y")


def only_b(request_id: str, inputs: Any) -> list[str]:
    return ["b"]


def terminals_from_inputs(request_id: str, inputs: Any) -> Any:
    """A ``terminal_stages_fn``: the terminals the request names under ``terminals``."""
    return inputs["terminals"]


def every_source(request_id: str, from_stage: str, payload: StagePayload) -> list[str]:
    """A ``wait_for_fn`` that expects both fan-in sources, whatever the route chose."""
    return ["b", "c"]


def source_b_only(request_id: str, from_stage: str, payload: StagePayload) -> list[str]:
    """A ``wait_for_fn`` that expects only ``b`` (the route upstream of ``c`` leaves it out)."""
    return ["b"]


def merge_both(inputs: dict[str, StagePayload]) -> StagePayload:
    """A ``merge_fn`` that needs both sources (it raises ``KeyError`` without one)."""
    first = inputs["b"]
    return StagePayload(first.request_id, first.request, {"b": first.data, "c": inputs["c"].data})


class TargetedStreamer(HandScheduler):
    """For each stage named in ``inputs["stream"]``, streams three chunks addressed to it
    (``OutgoingMessage.target``), then answers with its payload; one request at a time."""

    def on_request(self, msg: IncomingMessage) -> None:
        payload: StagePayload = msg.data
        for target in payload.request.inputs.get("stream", []):
            for i in range(3):
                self.outbox.put(OutgoingMessage(msg.request_id, "stream", data={"i": i}, target=target))
        self.outbox.put(OutgoingMessage(msg.request_id, "result", data=payload))


def create_targeted_streamer() -> TargetedStreamer:
    return TargetedStreamer()


def create_gate(fifo: str) -> SimpleScheduler:
    """Passes each payload on once a byte can be read from the named pipe ``fifo``."""

    def wait_then_pass(payload: StagePayload) -> StagePayload:
        with open(fifo, "rb") as gate:
            gate.read(1)
        return payload

    return SimpleScheduler(wait_then_pass)


class StuckScheduler(HandScheduler):
    """Answers each request with its payload; ``stop()`` does not wake ``start()``, which
    waits in a bare ``inbox.get()`` (a test ends it by putting None in ``inbox``)."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped = threading.Event()

    def on_request(self, msg: IncomingMessage) -> None:
        self.outbox.put(OutgoingMessage(msg.request_id, "result", data=msg.data))

    def stop(self) -> None:
        self.stopped.set()


STUCK: list[StuckScheduler] = []
"""Every stuck scheduler built in this process, for the test to end their threads."""


def create_stuck() -> StuckScheduler:
    STUCK.append(StuckScheduler())
    return STUCK[-1]
