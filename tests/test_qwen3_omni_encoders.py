"""Qwen3-Omni's encoder stages give what the thinker's own get_audio_features / get_image_features give.

The reference is transformers' whole model loaded from the same tiny checkpoint; the stages load only
their tower's weights.  A request's output must not depend on what it was batched with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from schedulers.front.handoffs import AudioEmbeddings, AudioEncoderInput, ImageEmbeddings, ImageEncoderInput
from schedulers.qwen3_omni.front.encoders import (
    AudioTower,
    VisionTower,
    create_audio_encoder_stage,
    create_image_encoder_stage,
)
from schedulers.qwen3_omni.front.processor import OmniProcessor
from tests.qwen3_omni_tiny import tiny_qwen3_omni_checkpoint  # noqa: F401  (fixture tiny_qwen3_omni)
from tests.scheduler_harness import answer_burst, new
from toys.qwen3_omni_reference import load_reference_model, sample_clip, sample_image

TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}  # packing changes matmul shapes, so sums may round differently


@pytest.fixture(scope="module")
def tiny(tiny_qwen3_omni: Path) -> Path:
    return tiny_qwen3_omni


@pytest.fixture(scope="module")
def thinker(tiny: Path) -> Any:
    return load_reference_model(tiny).thinker


@pytest.fixture(scope="module")
def processor(tiny: Path) -> OmniProcessor:
    return OmniProcessor.from_pretrained(tiny)


def _audio(processor: OmniProcessor, *seconds: float) -> dict[str, Any]:
    text = "<|audio_start|><|audio_pad|><|audio_end|>" * len(seconds)
    return processor(text, audio=[sample_clip("tone", s) for s in seconds])


def _images(processor: OmniProcessor, *sizes: tuple[int, int]) -> dict[str, Any]:
    text = "<|vision_start|><|image_pad|><|vision_end|>" * len(sizes)
    return processor(text, images=[sample_image(h, w) for h, w in sizes])


AUDIO_REQUESTS = [(1.0,), (0.73, 2.31), (3.4,)]
IMAGE_REQUESTS = [((40, 50),), ((64, 64), (70, 33)), ((96, 40),)]


def _reference_audio(thinker: Any, inputs: dict[str, Any]) -> Any:
    with torch.inference_mode():
        return thinker.get_audio_features(inputs["input_features"], inputs["feature_attention_mask"]).last_hidden_state


def _reference_image(thinker: Any, inputs: dict[str, Any]) -> tuple[Any, list[Any]]:
    with torch.inference_mode():
        out = thinker.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
    return torch.cat(out.pooler_output), [torch.cat(layer) for layer in out.deepstack_features]


def test_audio_tower_alone_equals_get_audio_features(tiny: Path, thinker: Any, processor: OmniProcessor) -> None:
    tower = AudioTower(str(tiny))
    for seconds in AUDIO_REQUESTS:
        inputs = _audio(processor, *seconds)
        [(embeds, lengths)] = tower.encode([(inputs["input_features"], inputs["feature_attention_mask"])])
        assert torch.equal(embeds, _reference_audio(thinker, inputs))
        assert lengths.tolist() == inputs["feature_attention_mask"].sum(-1).tolist()


def test_audio_requests_batched_together_equal_each_alone(tiny: Path, thinker: Any, processor: OmniProcessor) -> None:
    tower = AudioTower(str(tiny))
    inputs = [_audio(processor, *seconds) for seconds in AUDIO_REQUESTS]
    batched = tower.encode([(i["input_features"], i["feature_attention_mask"]) for i in inputs])
    for each, (embeds, _) in zip(inputs, batched, strict=True):
        torch.testing.assert_close(embeds, _reference_audio(thinker, each), **TOLERANCE)


def test_vision_tower_alone_equals_get_image_features(tiny: Path, thinker: Any, processor: OmniProcessor) -> None:
    tower = VisionTower(str(tiny))
    for sizes in IMAGE_REQUESTS:
        inputs = _images(processor, *sizes)
        [(embeds, deepstack)] = tower.encode([(inputs["pixel_values"], inputs["image_grid_thw"])])
        expected, expected_deepstack = _reference_image(thinker, inputs)
        assert torch.equal(embeds, expected)
        assert len(deepstack) == len(expected_deepstack) >= 1
        assert all(torch.equal(a, b) for a, b in zip(deepstack, expected_deepstack, strict=True))


def test_image_requests_batched_together_equal_each_alone(tiny: Path, thinker: Any, processor: OmniProcessor) -> None:
    tower = VisionTower(str(tiny))
    inputs = [_images(processor, *sizes) for sizes in IMAGE_REQUESTS]
    batched = tower.encode([(i["pixel_values"], i["image_grid_thw"]) for i in inputs])
    for each, (embeds, deepstack) in zip(inputs, batched, strict=True):
        expected, expected_deepstack = _reference_image(thinker, each)
        torch.testing.assert_close(embeds, expected, **TOLERANCE)
        for got, want in zip(deepstack, expected_deepstack, strict=True):
            torch.testing.assert_close(got, want, **TOLERANCE)


def test_audio_stage_batches_a_burst_and_answers_each_request(
    tiny: Path, thinker: Any, processor: OmniProcessor
) -> None:
    stage = create_audio_encoder_stage(model_dir=str(tiny), max_batch_size=8)
    inputs = {f"r{i}": _audio(processor, *seconds) for i, seconds in enumerate(AUDIO_REQUESTS)}
    messages = [
        new(rid, AudioEncoderInput(data["input_features"], data["feature_attention_mask"], ("audio_encoder",)))
        for rid, data in inputs.items()
    ]
    results = answer_burst(stage, messages)
    for rid, data in inputs.items():
        out = results[rid].data.data
        assert results[rid].type == "result" and isinstance(out, AudioEmbeddings)
        assert out.encoders == ("audio_encoder",)
        torch.testing.assert_close(out.audio_embeds, _reference_audio(thinker, data), **TOLERANCE)
        assert out.audio_feature_lengths.tolist() == data["feature_attention_mask"].sum(-1).tolist()


def test_image_stage_answers_with_embeds_deepstack_and_grid(tiny: Path, thinker: Any, processor: OmniProcessor) -> None:
    stage = create_image_encoder_stage(model_dir=str(tiny), max_batch_size=8)
    inputs = {f"r{i}": _images(processor, *sizes) for i, sizes in enumerate(IMAGE_REQUESTS)}
    messages = [
        new(rid, ImageEncoderInput(data["pixel_values"], data["image_grid_thw"], ("image_encoder",)))
        for rid, data in inputs.items()
    ]
    results = answer_burst(stage, messages)
    for rid, data in inputs.items():
        out = results[rid].data.data
        assert isinstance(out, ImageEmbeddings) and out.encoders == ("image_encoder",)
        expected, expected_deepstack = _reference_image(thinker, data)
        torch.testing.assert_close(out.image_embeds, expected, **TOLERANCE)
        assert len(out.deepstack_image_embeds) == len(expected_deepstack)
        for got, want in zip(out.deepstack_image_embeds, expected_deepstack, strict=True):
            torch.testing.assert_close(got, want, **TOLERANCE)
        assert torch.equal(out.image_grid_thw, data["image_grid_thw"])


def test_a_stage_loads_only_its_towers_weights(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import schedulers.qwen3_omni.front.encoders as encoders

    prefixes: list[str] = []
    real = encoders.load_weights
    monkeypatch.setattr(encoders, "load_weights", lambda d, prefix, m: (prefixes.append(prefix), real(d, prefix, m)))
    AudioTower(str(tiny))
    VisionTower(str(tiny))
    assert prefixes == ["thinker.audio_tower.", "thinker.visual."]
