"""Identity and tensor stages for the benchmarks: the same code runs on omnitrio and on the peer.

Only the imports differ: with ``sglang_omni`` importable (the peer's venv) the peer's
classes are used, otherwise omnitrio's.  torch is imported only by the tensor stages, so
a chain of identity stages starts without it.
"""

from __future__ import annotations

from typing import Any

try:  # the peer (SGLang-Omni) when its package is importable
    from sglang_omni.proto import StagePayload  # type: ignore[import-not-found]
    from sglang_omni.scheduling.simple_scheduler import SimpleScheduler  # type: ignore[import-not-found]
except ImportError:
    from omnitrio.contract import StagePayload
    from schedulers.simple import SimpleScheduler

SIZES_MB = (1, 16, 128)


def create_echo() -> Any:
    """An identity stage (a chain hop)."""
    return SimpleScheduler(lambda payload: payload)


def create_tensor_source(device: str = "cpu") -> Any:
    """Returns a preallocated float32 tensor of ``inputs`` MB on ``device`` (first 1.0, last 2.0)."""
    import torch

    tensors = {}
    for mb in SIZES_MB:
        t = torch.zeros(mb * 1024 * 1024 // 4, dtype=torch.float32, device=device)
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
