"""schedulers.qwen3_omni.front.processor gives what transformers' Qwen3OmniMoeProcessor gives, without video.

The reference is ``Qwen3OmniMoeProcessor`` itself, assembled from the same checkpoint directory without
its video processor (toys.qwen3_omni_reference.reference_processor), called on the same text and media.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from schedulers.qwen3_omni.front.processor import OmniProcessor, audio_token_count
from schedulers.qwen3_omni.tiny import write_checkpoint
from tests.front_checks import assert_refuses_video
from toys.qwen3_omni_reference import reference_processor, sample_clip, sample_image


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("qwen3-omni") / "tiny", size="tiny")


@pytest.fixture(scope="module")
def processors(tiny: Path) -> tuple[OmniProcessor, Any]:
    return OmniProcessor.from_pretrained(tiny), reference_processor(tiny)


def _clip(seconds: float) -> np.ndarray:
    return sample_clip("tone", seconds)


def _messages(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is this?"}]}]


CASES = {
    "text": ([], []),
    "one clip": ([_clip(1.0)], []),
    "clips of different lengths": ([_clip(0.73), _clip(2.31)], []),
    "one image": ([], [sample_image(40, 50)]),
    "images of different sizes": ([], [sample_image(40, 50), sample_image(70, 33)]),
    "clip and image": ([_clip(1.5)], [sample_image(64, 64)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_outputs_equal_qwen3_omni_processor(processors: tuple[OmniProcessor, Any], case: str) -> None:
    ours, reference = processors
    audio, images = CASES[case]
    parts = [{"type": "audio", "audio": a} for a in audio] + [{"type": "image", "image": i} for i in images]
    text = ours.render(_messages(parts))
    assert text == reference.apply_chat_template(_messages(parts), add_generation_prompt=True, tokenize=False)
    got = ours(text, audio=audio, images=images)
    expected = reference(text=text, audio=audio or None, images=images or None, return_tensors="pt")
    assert set(got) == set(expected)
    for key in expected:
        assert torch.equal(got[key], expected[key]), key


@pytest.mark.parametrize("frames", [1, 37, 99, 100, 101, 250, 3000])
def test_audio_token_count_is_the_processors(frames: int) -> None:
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

    assert audio_token_count(frames) == int(_get_feat_extract_output_lengths(torch.tensor(frames)))


def test_a_prompt_with_video_is_refused(processors: tuple[OmniProcessor, Any]) -> None:
    assert_refuses_video(processors[0])


def test_placeholders_must_match_the_media(processors: tuple[OmniProcessor, Any]) -> None:
    ours, _ = processors
    text = ours.render(_messages([{"type": "audio", "audio": _clip(1.0)}]))
    with pytest.raises(ValueError, match="audio_pad"):
        ours(text, audio=[_clip(1.0), _clip(1.0)])
