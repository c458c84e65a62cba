"""The front of the Qwen3-Omni graph run by the runtime (preprocess → encoders → aggregate), and
``omnitrio check --model DIR`` on a config of these stages.

The pipeline here ends at ``aggregate`` (its result is the thinker's input), so the test sees what the
thinker would get and compares it with the thinker's own encoders in transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnitrio import CompleteMessage, open_pipeline
from omnitrio.cli import main
from omnitrio.config_loading import load
from schedulers.front.handoffs import ThinkerInput
from schedulers.qwen3_omni.tiny import write_checkpoint
from toys.qwen3_omni_reference import (
    load_reference_model,
    png_data_url,
    reference_processor,
    sample_clip,
    sample_image,
    wav_base64,
)

pytestmark = pytest.mark.timeout(600)

R = "schedulers.qwen3_omni.graph"
CONFIG = f"""
name = "qwen3-omni-front"
serves = ["chat"]
model_args = ["preprocess.factory.model_dir", "audio_encoder.factory.model_dir", "image_encoder.factory.model_dir"]

[[stages]]
name = "preprocess"
factory_path = "schedulers.qwen3_omni.front.preprocess.create_preprocess_stage"
next = ["audio_encoder", "image_encoder", "aggregate"]
route_fn = "schedulers.graph.front.route_preprocess"
[stages.project_payload]
audio_encoder = "{R}:EDGES.project_to_audio_encoder"
image_encoder = "{R}:EDGES.project_to_image_encoder"
aggregate = "{R}:EDGES.project_to_aggregate"

[[stages]]
name = "audio_encoder"
factory_path = "schedulers.qwen3_omni.front.encoders.create_audio_encoder_stage"
next = "aggregate"

[[stages]]
name = "image_encoder"
factory_path = "schedulers.qwen3_omni.front.encoders.create_image_encoder_stage"
next = "aggregate"

[[stages]]
name = "aggregate"
factory_path = "schedulers.qwen3_omni.front.aggregate.create_aggregate_stage"
wait_for = ["preprocess", "audio_encoder", "image_encoder"]
wait_for_fn = "schedulers.graph.front.wait_for_aggregate"
merge_fn = "{R}:EDGES.merge_aggregate"
terminal = true
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return write_checkpoint(tmp_path_factory.mktemp("qwen3-omni") / "tiny", size="tiny")


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "front.toml"
    path.write_text(CONFIG)
    return path


async def _result(pipeline: Any, rid: str, inputs: Any) -> ThinkerInput:
    async with pipeline.stream(rid, inputs) as messages:
        async for message in messages:
            if isinstance(message, CompleteMessage):
                assert isinstance(message.result, ThinkerInput)
                return message.result
    raise AssertionError("no result")


async def test_the_thinker_gets_what_its_own_encoders_give(tiny: Path, config_file: Path) -> None:
    clip = np.round(sample_clip("tone", 1.2) * 32768) / 32768
    image = sample_image(48, 40)
    parts = [
        {"type": "input_audio", "input_audio": {"data": wav_base64(clip), "format": "wav"}},
        {"type": "image_url", "image_url": {"url": png_data_url(image)}},
        {"type": "text", "text": "What is this?"},
    ]
    inputs = {"task": "chat", "messages": [{"role": "user", "content": parts}], "modalities": ["text", "audio"]}
    async with open_pipeline(load(config_file, model=tiny), inline=True) as pipeline:
        got = await _result(pipeline, "r1", inputs)
        text_only = await _result(pipeline, "r2", {**inputs, "messages": [{"role": "user", "content": "Hi"}]})
    processor = reference_processor(tiny)
    messages = [
        {"role": "user", "content": [{"type": "audio"}, {"type": "image"}, {"type": "text", "text": "What is this?"}]}
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    expected = processor(text=text, audio=[clip.astype(np.float32)], images=[image], return_tensors="pt")
    thinker = load_reference_model(tiny).thinker
    with torch.inference_mode():
        audio = thinker.get_audio_features(expected["input_features"], expected["feature_attention_mask"])
        vision = thinker.get_image_features(expected["pixel_values"], expected["image_grid_thw"])
    assert torch.equal(got.input_ids, expected["input_ids"][0])
    torch.testing.assert_close(got.audio_embeds, audio.last_hidden_state, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.image_embeds, torch.cat(vision.pooler_output), rtol=1e-5, atol=1e-5)
    assert got.deepstack_image_embeds is not None and got.audio_feature_lengths is not None
    assert len(got.deepstack_image_embeds) == len(vision.deepstack_features)
    assert got.audio_feature_lengths.tolist() == expected["feature_attention_mask"].sum(-1).tolist()
    assert (got.knobs.speaker, got.knobs.want_audio) == ("ethan", True)
    assert text_only.audio_embeds is None and text_only.image_embeds is None


def test_check_validates_the_checkpoint_given_with_model(
    tiny: Path, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "--model", str(tiny), str(config_file)]) == 0


def test_check_names_the_broken_file_of_the_checkpoint(
    tiny: Path, config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny, broken)
    (broken / "model-00003-of-00004.safetensors").unlink()
    assert main(["check", "--model", str(broken), str(config_file)]) == 2
    assert "model-00003-of-00004.safetensors: missing" in capsys.readouterr().err


def test_check_without_model_says_how_to_give_it(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(config_file)]) == 2
    assert "serve --model DIR" in capsys.readouterr().err
