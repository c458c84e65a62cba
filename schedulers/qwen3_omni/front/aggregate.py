"""The aggregate stage: the fan-in point of the front, where the thinker's input is whole.

The runtime's fan-in gathers ``preprocess`` and the encoders the request needs; ``merge_fn``
(``schedulers.qwen3_omni.graph:EDGES.merge_aggregate``) builds the thinker's input from them, so the stage
itself passes it on unchanged.
"""

from __future__ import annotations

from schedulers.simple import SimpleScheduler


def create_aggregate_stage() -> SimpleScheduler:
    """The fan-in point: ``merge_fn`` (``schedulers.qwen3_omni.graph:EDGES.merge_aggregate``) built the
    thinker's input."""
    return SimpleScheduler(lambda payload: payload)
