"""A stage module that imports torch as it is imported, for tests of what the caller imports."""

from __future__ import annotations

import torch

from omnitrio.contract import StagePayload
from schedulers.simple import SimpleScheduler


def create_torch_tag(tag: str = "torch") -> SimpleScheduler:
    """Adds ``{tag: torch's version}`` to the payload's data."""

    def mark(payload: StagePayload) -> StagePayload:
        payload.data = {**payload.data, tag: torch.__version__}
        return payload

    return SimpleScheduler(mark)
