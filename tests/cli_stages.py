"""Stage factories for the ``omnitrio run`` tests: a voice that answers with a tone when asked for audio."""

from __future__ import annotations

from typing import Any

import numpy as np

from omnitrio.contract import StagePayload
from schedulers.simple import SimpleScheduler

RATE = 16_000


def answer(payload: StagePayload) -> dict[str, Any]:
    """``{"text"}``, plus 0.25 s of tone in ``audio`` when the chat inputs ask for audio."""
    inputs = payload.data["raw_inputs"]
    if not isinstance(inputs, dict) or "audio" not in inputs.get("modalities", ()):
        return {"text": str(inputs)}
    tone = (0.2 * np.sin(np.arange(RATE // 4) * 0.1) * 32767).astype(np.int16)
    return {"text": inputs["messages"][-1]["content"], "audio": {"pcm": tone, "sample_rate": RATE}}


def create_voice() -> SimpleScheduler:
    return SimpleScheduler(answer)
