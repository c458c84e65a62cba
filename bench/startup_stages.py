"""A stage as heavy to import as a model stage (torch and transformers at the top), light to build.

For bench/startup.py's 4-stage torch-importing chain: what it measures is the start of a process
that imports what model stages import, not a model's load.
"""

from __future__ import annotations

import torch
import transformers  # noqa: F401 — imported for its cost, as model stages import it

from omnitrio.contract import StagePayload
from schedulers.simple import SimpleScheduler


def create_torch_stage() -> SimpleScheduler:
    """Passes each payload on after one small tensor operation."""
    ones = torch.ones(4)

    def compute(payload: StagePayload) -> StagePayload:
        payload.data = {"sum": float(ones.sum()), "inputs": payload.data}
        return payload

    return SimpleScheduler(compute)
