"""schedulers.qwen2_5_omni.front.processor gives what transformers' Qwen2_5OmniProcessor gives, without video.

The reference is ``Qwen2_5OmniProcessor`` itself, assembled from the same tiny checkpoint without its video
processor, called on the same text and media.  The processor pads every clip to five minutes; ours sends the
frames up to the longest clip's end, which must equal the processor's there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from schedulers.qwen2_5_omni.front.processor import OmniProcessor, audio_token_count
from tests.front_checks import assert_refuses_video
from tests.qwen2_5_omni_reference import (
    clip,
    picture,
    reference_processor,
    tiny_checkpoint,  # noqa: F401  (fixture tiny)
)


@pytest.fixture(scope="module")
def processors(tiny: Path) -> tuple[OmniProcessor, Any]:
    return OmniProcessor.from_pretrained(tiny), reference_processor(tiny)


def _messages(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is this?"}]}]


CASES = {
    "text": ([], []),
    "one clip": ([clip(440, 1.0)], []),
    "clips of different lengths": ([clip(300, 0.73), clip(500, 2.31)], []),
    "a clip not a whole number of frames": ([clip(440, 0.40313)], []),
    "one image": ([], [picture(0, 40, 50)]),
    "images of different sizes": ([], [picture(1, 40, 50), picture(2, 70, 33)]),
    "clip and image": ([clip(220, 1.5)], [picture(3, 64, 64)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_outputs_equal_qwen2_5_omni_processor(processors: tuple[OmniProcessor, Any], case: str) -> None:
    ours, reference = processors
    audio, images = CASES[case]
    parts = [{"type": "audio", "audio": a} for a in audio] + [{"type": "image", "image": i} for i in images]
    text = ours.render(_messages(parts))
    assert text == reference.apply_chat_template(_messages(parts), add_generation_prompt=True, tokenize=False)
    got = ours(text, audio=audio, images=images)
    expected = reference(text=text, audio=audio or None, images=images or None, return_tensors="pt")
    assert set(got) == set(expected) - {"num_audio_tokens"}
    if audio:
        frames = got["feature_attention_mask"].shape[1]
        assert frames == int(expected["feature_attention_mask"].sum(-1).max())
        assert torch.equal(
            expected["feature_attention_mask"][:, frames:],
            torch.zeros_like(expected["feature_attention_mask"][:, frames:]),
        )
        expected["input_features"] = expected["input_features"][:, :, :frames]
        expected["feature_attention_mask"] = expected["feature_attention_mask"][:, :frames]
    for key in got:
        assert got[key].dtype == expected[key].dtype, key
        assert torch.equal(got[key], expected[key]), key


def test_a_clip_past_the_extractors_limit_is_cut_as_the_processor_cuts_it(
    processors: tuple[OmniProcessor, Any],
) -> None:
    ours, reference = processors
    ours.feature_extractor.n_samples = reference.feature_extractor.n_samples = 16_000
    try:
        audio = [clip(440, 1.7), clip(330, 0.5)]
        text = ours.render(_messages([{"type": "audio", "audio": a} for a in audio]))
        got = ours(text, audio=audio)
        expected = reference(text=text, audio=audio, return_tensors="pt")
    finally:
        ours.feature_extractor.n_samples = reference.feature_extractor.n_samples = 300 * 16_000
    assert torch.equal(got["input_ids"], expected["input_ids"])
    assert torch.equal(got["input_features"], expected["input_features"])


@pytest.mark.parametrize("frames", [1, 2, 3, 4, 5, 37, 99, 100, 101, 3000])
def test_audio_token_count_is_the_processors(frames: int) -> None:
    from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import _get_feat_extract_output_lengths

    assert audio_token_count(frames) == int(_get_feat_extract_output_lengths(torch.tensor(frames)))


def test_a_prompt_with_video_is_refused(processors: tuple[OmniProcessor, Any]) -> None:
    assert_refuses_video(processors[0])


def test_placeholders_must_match_the_media(processors: tuple[OmniProcessor, Any]) -> None:
    ours, _ = processors
    text = ours.render(_messages([{"type": "audio", "audio": clip(440)}]))
    with pytest.raises(ValueError, match="placeholders"):
        ours(text)
    with pytest.raises(ValueError, match="placeholders"):
        ours(text, audio=[clip(440), clip(220)])


def test_an_empty_clip_is_refused(processors: tuple[OmniProcessor, Any]) -> None:
    ours, _ = processors
    text = ours.render(_messages([{"type": "audio", "audio": np.zeros(0, np.float32)}]))
    with pytest.raises(ValueError, match="no samples"):
        ours(text, audio=[np.zeros(0, np.float32)])
