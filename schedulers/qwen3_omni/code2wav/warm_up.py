"""What the code2wav stage pays at start-up instead of its first requests: the first windows, alone and batched.

:func:`code2wav_warm_up` gives the :class:`~schedulers.warm_up.WarmUp` steps; each decodes streams of
silent codes (code 0 in every quantizer) the way the stage's decode step does — the ready windows of
every stream, the transformer on each stream's cache, the convolutions in as few forwards as padding
allows — on the serving thread:

* ``first window``: one stream's first ``first_chunk_frames`` frames, before the stream has ended;
* ``windows``: one stream long enough for the windows to grow to ``chunk_frames``, to its end;
* ``batch``: three streams at once (the convolutions of several windows in one forward).

The streams belong to the warm-up alone: the stage holds nothing of them afterwards and nothing was sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from schedulers.qwen3_omni.code2wav.windows import CodeStream
from schedulers.warm_up import WarmUp

if TYPE_CHECKING:
    from schedulers.qwen3_omni.code2wav.stage import Qwen3OmniCode2WavScheduler


def code2wav_warm_up(scheduler: Qwen3OmniCode2WavScheduler) -> WarmUp:
    """The steps of the module docstring, for ``scheduler``."""
    chunking = scheduler.chunking
    first = chunking.first_chunk_frames
    grown = first + 4 * chunking.chunk_frames  # past the ramp: a full-size window at least
    warm_up = WarmUp()
    warm_up.step("first window", lambda: _decode(scheduler, [first], end=False))
    warm_up.step("windows", lambda: _decode(scheduler, [grown], end=True))
    warm_up.step("batch", lambda: _decode(scheduler, [first, first + 1, 2 * first], end=True))
    return warm_up


def _decode(scheduler: Qwen3OmniCode2WavScheduler, frames: list[int], *, end: bool) -> None:
    """Streams of ``frames`` frames arriving one frame at a time, each ready window decoded as it becomes
    ready (as the talker sends them, one frame a chunk); ``end``: then each stream ends."""
    runner = scheduler.runner
    streams = [CodeStream(scheduler.chunking, runner.geometry, runner.num_quantizers) for _ in frames]
    frame = torch.zeros(runner.num_quantizers, 1, dtype=torch.long)
    for arrived in range(1, max(frames) + 1):
        for stream, n in zip(streams, frames, strict=True):
            if arrived <= n:
                stream.add(frame)
            if end and arrived == n:
                stream.finish(n)
        budget = scheduler.max_step_frames
        inputs = [x for stream in streams for x in runner.transform(stream, stream.take_windows(budget))]
        if inputs:
            runner.waveforms(inputs)
