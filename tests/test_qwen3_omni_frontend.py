"""Qwen3-Omni's preprocessing stage and per-request graph (schedulers.qwen3_omni.front.preprocess / .graph).

Chat inputs as the HTTP layer hands them become what transformers' processor makes of the same messages;
voices map to the checkpoint's speakers; a request waits only for the encoders it uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnitrio.contract import OmniRequest, StagePayload
from schedulers.engine.handoffs import ThinkerResult
from schedulers.front.handoffs import (
    AudioEmbeddings,
    ImageEmbeddings,
    ImageEncoderInput,
    Preprocessed,
    PreprocessedText,
    ThinkerInput,
)
from schedulers.graph import front
from schedulers.qwen3_omni.front.preprocess import Preprocessor, create_preprocess_stage, resolve_speaker
from schedulers.qwen3_omni.graph import EDGES, TASKS
from schedulers.qwen3_omni.handoffs import Knobs
from schedulers.qwen3_omni.tiny import write_checkpoint
from tests.scheduler_harness import new, running, take
from toys.qwen3_omni_reference import (
    png_data_url,
    processor_inputs,
    reference_processor,
    sample_clip,
    sample_image,
    wav_base64,
)

SPEAKERS = ("chelsie", "ethan", "aiden")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("qwen3-omni") / "tiny", size="tiny")


@pytest.fixture(scope="module")
def preprocessor(tiny: Path) -> Preprocessor:
    return Preprocessor(tiny)


def _chat(*parts: dict[str, Any], modalities: tuple[str, ...] = ("text",), voice: str | None = None) -> dict[str, Any]:
    return {
        "task": "chat",
        "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "What is this?"}]}],
        "modalities": list(modalities),
        "audio": None if voice is None else {"voice": voice, "format": "wav"},
        "max_tokens": 7,
        "temperature": 0,
    }


def test_audio_and_image_parts_become_what_the_processor_makes(tiny: Path, preprocessor: Preprocessor) -> None:
    clip = np.round(sample_clip("tone", 1.3) * 32768) / 32768  # exactly what a 16-bit WAV carries
    image = sample_image(40, 50)
    data = preprocessor(
        _chat(
            {"type": "input_audio", "input_audio": {"data": wav_base64(clip), "format": "wav"}},
            {"type": "image_url", "image_url": {"url": png_data_url(image)}},
        )
    )
    parts = [{"type": "audio", "audio": clip.astype(np.float32)}, {"type": "image", "image": image}]
    messages = [{"role": "user", "content": [*parts, {"type": "text", "text": "What is this?"}]}]
    expected = processor_inputs(reference_processor(tiny), messages)
    assert torch.equal(data.input_ids, expected["input_ids"][0])
    for key in ("input_features", "feature_attention_mask", "pixel_values", "image_grid_thw"):
        assert torch.equal(getattr(data, key), expected[key]), key
    assert data.encoders == (front.AUDIO_ENCODER, front.IMAGE_ENCODER)
    assert data.knobs == Knobs(max_new_tokens=7, temperature=0.0, want_audio=False)


def test_a_text_request_needs_no_encoder(preprocessor: Preprocessor) -> None:
    data = preprocessor(_chat())
    assert data.encoders == ()
    assert data.input_features is None and data.pixel_values is None


@pytest.mark.parametrize(
    ("voice", "speaker"), [(None, "ethan"), ("alloy", "ethan"), ("cedar", "ethan"), ("Chelsie", "chelsie")]
)
def test_voices_map_to_the_checkpoints_speakers(preprocessor: Preprocessor, voice: str | None, speaker: str) -> None:
    data = preprocessor(_chat(modalities=("text", "audio"), voice=voice))
    assert (data.knobs.speaker, data.knobs.want_audio) == (speaker, True)


def test_an_unknown_voice_is_refused_with_the_speakers_listed() -> None:
    with pytest.raises(ValueError, match="chelsie, ethan, aiden"):
        resolve_speaker("robot", SPEAKERS, "ethan")


def test_a_text_only_request_has_no_speaker(preprocessor: Preprocessor) -> None:
    assert preprocessor(_chat()).knobs.speaker is None


@pytest.mark.parametrize(
    "part",
    [
        {"type": "input_video", "input_video": {"data": "AAAA"}},
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}},
    ],
)
def test_video_is_refused(preprocessor: Preprocessor, part: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"messages\[0\]\.content\[0\]: video"):
        preprocessor(_chat(part))


def test_the_stage_fails_a_bad_request_with_a_value_error(tiny: Path) -> None:
    stage = create_preprocess_stage(model_dir=str(tiny))
    bad = {"task": "chat", "messages": []}
    with running(stage):
        stage.inbox.put(new("r1", {"raw_inputs": bad}))
        [out] = take(stage.outbox)
    assert out.type == "error" and isinstance(out.data, ValueError)


def _payload(data: Any, inputs: Any = None) -> StagePayload:
    return StagePayload("r1", OmniRequest(inputs=inputs), data)


@pytest.mark.parametrize(
    "encoders", [(), (front.AUDIO_ENCODER,), (front.IMAGE_ENCODER,), (front.AUDIO_ENCODER, front.IMAGE_ENCODER)]
)
def test_aggregate_waits_only_for_the_encoders_a_request_uses(encoders: tuple[str, ...]) -> None:
    ids = torch.tensor([1, 2])
    payload = _payload(Preprocessed(ids, encoders, Knobs()))
    assert front.route_preprocess("r1", payload) == [*encoders, front.AGGREGATE]
    arrivals = {
        front.PREPROCESS: PreprocessedText(ids, encoders, Knobs()),
        front.AUDIO_ENCODER: AudioEmbeddings(torch.zeros(1, 4), torch.tensor([3]), encoders),
        front.IMAGE_ENCODER: ImageEmbeddings(torch.zeros(1, 4), (), torch.ones(1, 3), encoders),
    }
    for source in (front.PREPROCESS, *encoders):
        waited = front.wait_for_aggregate("r1", source, _payload(arrivals[source]))
        assert waited == [front.PREPROCESS, *encoders]


def test_merge_builds_the_thinkers_input(preprocessor: Preprocessor) -> None:
    data = preprocessor(_chat({"type": "image", "image": sample_image()}, modalities=("text", "audio")))
    pre = EDGES.project_to_aggregate(_payload(data))
    image = EDGES.project_to_image_encoder(_payload(data)).data
    assert isinstance(image, ImageEncoderInput) and image.encoders == data.encoders
    assert image.pixel_values is data.pixel_values and image.image_grid_thw is data.image_grid_thw
    assert data.image_grid_thw is not None
    encoded = ImageEmbeddings(torch.ones(2, 32), (torch.zeros(2, 32),), data.image_grid_thw, data.encoders)
    merged = EDGES.merge_aggregate({front.PREPROCESS: pre, front.IMAGE_ENCODER: _payload(encoded)}).data
    assert isinstance(merged, ThinkerInput)
    assert torch.equal(merged.input_ids, data.input_ids)
    assert merged.image_embeds is encoded.image_embeds
    assert merged.deepstack_image_embeds is encoded.deepstack_image_embeds
    assert merged.audio_embeds is None and merged.audio_feature_lengths is None
    assert merged.knobs == data.knobs
    assert (merged.knobs.speaker, merged.knobs.want_audio, merged.knobs.max_new_tokens) == ("ethan", True, 7)


def test_text_only_requests_never_reach_the_talker() -> None:
    text, spoken = _chat(), _chat(modalities=("text", "audio"))
    assert TASKS.chat_terminal_stages("r1", text) == ["decode"]
    assert TASKS.chat_terminal_stages("r1", spoken) == ["decode", "code2wav"]
    said = ThinkerResult((5,), 3, "stop", want_audio=False)
    assert TASKS.route_thinker("r1", _payload(said)) == ["decode"]
    spoke = ThinkerResult((5,), 3, "stop", want_audio=True)
    assert TASKS.route_thinker("r1", _payload(spoke)) == ["decode", "talker"]
