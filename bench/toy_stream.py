"""The seed's talker → vocoder stages for the streaming and abort benchmarks, on either runtime.

The talker and vocoder are the seed's ``ToyTalkerScheduler``/``ToyVocoderScheduler``
unchanged (omnitrio's port in ``toys/seed``, the peer's original in ``bench/peer/seed``);
this module adds the ``steps`` argument and a slow talker that stops once aborted.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import torch

try:  # the peer (SGLang-Omni): the seed's module as the seed wrote it
    from ch4_stream_stages import ToyTalkerScheduler, ToyVocoderScheduler  # type: ignore[import-not-found]
    from sglang_omni.scheduling.message import OutgoingMessage  # type: ignore[import-not-found]
except ImportError:
    from omnitrio.contract import OutgoingMessage
    from toys.seed.ch4_stream_stages import ToyTalkerScheduler, ToyVocoderScheduler


def create_talker(steps: int = 100) -> Any:
    """The seed's toy talker with ``steps`` chunks per request."""
    return ToyTalkerScheduler(steps=steps)


def create_vocoder() -> Any:
    return ToyVocoderScheduler()


class SlowTalkerScheduler(ToyTalkerScheduler):  # type: ignore[misc,valid-type]
    """The seed's talker with ``step_s`` of work per step, stopping between steps once aborted."""

    def __init__(self, steps: int = 200, step_s: float = 0.005) -> None:
        super().__init__(steps=steps)
        self.step_s = step_s
        self.aborted: set[str] = set()
        self.lock = threading.Lock()

    def start(self) -> None:
        self.running = True
        while self.running:
            try:
                msg = self.inbox.get(timeout=0.1)
            except queue.Empty:
                continue
            if msg.type == "abort":
                self.abort(msg.request_id)
            if msg.type != "new_request":
                continue
            payload = msg.data
            for step in range(self.steps):
                with self.lock:
                    if msg.request_id in self.aborted:
                        break
                time.sleep(self.step_s)
                self.outbox.put(OutgoingMessage(msg.request_id, "stream", data=_codes(step), metadata={"step": step}))
            else:
                payload.data = {"num_steps": self.steps}
                self.outbox.put(OutgoingMessage(msg.request_id, "result", data=payload))

    def abort(self, request_id: str) -> None:
        with self.lock:
            self.aborted.add(request_id)


def _codes(step: int) -> Any:
    return torch.tensor([step * 10 + 1, step * 10 + 2])


def create_slow_talker(steps: int = 200, step_s: float = 0.005) -> Any:
    return SlowTalkerScheduler(steps=steps, step_s=step_s)
