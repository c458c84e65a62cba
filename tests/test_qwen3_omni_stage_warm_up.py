"""Qwen3-Omni's model stages run their real first calls before they report ready, and keep nothing of them:
the thinker and the talker serve synthetic requests of each input kind (text, audio, image) alone and in a
batch through their own message handling and steps, code2wav decodes first windows alone, grown ones and a
batch of streams; afterwards no request, key/value row, stream or output is left, and a sampling talker's
random generator is where it was."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.startup_helpers import tiny_qwen3_omni

__all__ = ["tiny_qwen3_omni"]

pytestmark = pytest.mark.timeout(300)


def _count(module: Any, name: str, shape_of: Callable[..., tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Record the shape of each call of ``module.name`` (an instance attribute shadows the method)."""
    calls: list[tuple[int, ...]] = []
    real = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(shape_of(*args, **kwargs))
        return real(*args, **kwargs)

    setattr(module, name, counted)
    return calls


def test_the_thinker_prefills_each_input_kind_and_decodes_a_batch_before_ready(tiny_qwen3_omni: Path) -> None:
    from schedulers.qwen3_omni.thinker.stage import create_thinker_stage

    stage = create_thinker_stage(model_dir=str(tiny_qwen3_omni))
    calls = _count(stage.engine.lm.model, "forward", lambda **kw: tuple(kw["inputs_embeds"].shape[:2]))
    stage.warm_up_serving_thread()
    assert stage.warmed == ["text", "audio", "image", "batch"]
    prefills = [length for batch, length in calls if length > 1]
    assert len(set(prefills[:3])) == 3  # text, audio and image prompts differ in length
    assert (3, 1) in calls  # a decode of three rows at once
    assert (stage.live_requests, stage.kv_bytes, stage.steps, stage.outbox.qsize()) == (0, 0, 0, 0)


def test_the_talker_speaks_each_prompt_kind_and_a_batch_before_ready_and_keeps_nothing(tiny_qwen3_omni: Path) -> None:
    from schedulers.qwen3_omni.talker.stage import create_talker_stage

    stage = create_talker_stage(model_dir=str(tiny_qwen3_omni))
    calls = _count(stage.model.talker.model, "forward", lambda **kw: tuple(kw["inputs_embeds"].shape[:2]))
    predicted = _count(stage.predictor, "frames", lambda hidden, *_: tuple(hidden.shape[:1]))
    generator = stage._generator.get_state()
    stage.warm_up_serving_thread()
    assert stage.warmed == ["text", "audio", "image", "batch"]
    assert len({length for _, length in calls if length > 1}) == 3
    assert (3, 1) in calls and (3,) in predicted
    assert (stage.active_requests, len(stage.kv), stage.batch_sizes, stage.outbox.qsize()) == (0, 0, [], 0)
    assert bool((stage._generator.get_state() == generator).all())


def test_code2wav_decodes_first_windows_alone_and_batched_before_ready(tiny_qwen3_omni: Path) -> None:
    from schedulers.qwen3_omni.code2wav.stage import create_code2wav_stage

    stage = create_code2wav_stage(model_dir=str(tiny_qwen3_omni), first_chunk_frames=5, chunk_frames=25)
    calls = _count(stage.runner, "_convolve", lambda hidden: tuple(hidden.shape[::2]))
    stage.warm_up_serving_thread()
    assert stage.warmed == ["first window", "windows", "batch"]
    assert (1, 5) in calls and (3, 5) in calls  # the first window alone, and three streams' in one forward
    assert max(frames for _, frames in calls) > 25  # a full-size window and its left context
    assert (stage.active_streams, stage.outbox.qsize()) == (0, 0)
