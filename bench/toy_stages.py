"""Stage factories the benchmarks add to the seed's: the same code runs on omnitrio and on the peer.

Only the imports differ: with ``sglang_omni`` importable (the peer's venv) the peer's
classes are used, otherwise omnitrio's.  The talker and vocoder are the seed's
``ToyTalkerScheduler``/``ToyVocoderScheduler`` unchanged; the factories here only add
the ``steps`` argument and a slow, abortable talker for the abort benchmark.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

try:  # the peer (SGLang-Omni) when its package is importable
    from ch4_stream_stages import ToyTalkerScheduler, ToyVocoderScheduler  # type: ignore[import-not-found]
    from sglang_omni.proto import StagePayload  # type: ignore[import-not-found]
    from sglang_omni.scheduling.message import OutgoingMessage  # type: ignore[import-not-found]
    from sglang_omni.scheduling.simple_scheduler import SimpleScheduler  # type: ignore[import-not-found]
except ImportError:
    from omnitrio.contract import OutgoingMessage, StagePayload
    from schedulers.simple import SimpleScheduler
    from tests.seed.ch4_stream_stages import ToyTalkerScheduler, ToyVocoderScheduler

SIZES_MB = (1, 16, 128)


def create_echo() -> Any:
    """An identity stage (a chain hop)."""
    return SimpleScheduler(lambda payload: payload)


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
    import torch

    return torch.tensor([step * 10 + 1, step * 10 + 2])


def create_slow_talker(steps: int = 200, step_s: float = 0.005) -> Any:
    return SlowTalkerScheduler(steps=steps, step_s=step_s)


def create_tensor_source() -> Any:
    """Returns a preallocated float32 tensor of ``inputs`` MB in ``payload.data`` (first 1.0, last 2.0)."""
    import torch

    tensors = {}
    for mb in SIZES_MB:
        t = torch.zeros(mb * 1024 * 1024 // 4, dtype=torch.float32)
        t[0], t[-1] = 1.0, 2.0
        tensors[mb] = t

    def fn(payload: StagePayload) -> StagePayload:
        payload.data = tensors[int(payload.data["raw_inputs"])]
        return payload

    return SimpleScheduler(fn)


def create_tensor_sink() -> Any:
    """Checks the first and last element and returns only the size in bytes."""

    def fn(payload: StagePayload) -> StagePayload:
        t = payload.data
        if float(t[0]) != 1.0 or float(t[-1]) != 2.0:
            raise ValueError(f"tensor arrived corrupted: first={float(t[0])} last={float(t[-1])}")
        payload.data = {"nbytes": int(t.numel() * t.element_size())}
        return payload

    return SimpleScheduler(fn)
