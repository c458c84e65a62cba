"""Qwen2.5-Omni's front: a chat request becomes what ``Qwen2_5OmniProcessor`` makes of the same messages under
the model's own system prompt, 16 kHz audio is never resampled, and the towers batch requests without
changing any request's embeddings.

References: ``Qwen2_5OmniProcessor`` itself (built without its video processor) and the towers run on one
request at a time.
"""

from __future__ import annotations

import base64
import io
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from schedulers.media import resample
from schedulers.qwen2_5_omni.front.encoders import AudioTower, VisionTower
from schedulers.qwen2_5_omni.front.preprocess import SYSTEM_PROMPT, Preprocessor
from tests.qwen2_5_omni_reference import (
    clip,
    picture,
    reference_inputs,
    reference_processor,
    tiny_checkpoint,  # noqa: F401  (fixture tiny)
)


@pytest.fixture(scope="module")
def preprocessor(tiny: Path) -> Preprocessor:
    return Preprocessor(tiny)


@pytest.fixture(scope="module")
def reference(tiny: Path) -> Any:
    return reference_processor(tiny)


def wav(samples: np.ndarray, rate: int) -> str:
    """``samples`` as a base64 PCM16 WAV file at ``rate``."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return base64.b64encode(buffer.getvalue()).decode()


def pcm16(samples: np.ndarray) -> np.ndarray:
    """What a 16 kHz PCM16 WAV of ``samples`` holds, as the model reads it: int16 / 32768."""
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").astype(np.float32) / 32768.0


def png(image: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def request(*parts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"task": "chat", "messages": [{"role": "user", "content": list(parts)}], **extra}


def audio_part(samples: np.ndarray, rate: int = 16_000) -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": wav(samples, rate), "format": "wav"}}


def test_a_chat_request_is_what_the_processor_makes_of_it_under_the_models_system_prompt(
    preprocessor: Preprocessor, reference: Any
) -> None:
    sound, image = clip(440, 1.2), picture(0, 60, 45)
    got = preprocessor(
        request(
            audio_part(sound), {"type": "image_url", "image_url": {"url": png(image)}}, {"type": "text", "text": "Hi"}
        )
    )
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {
            "role": "user",
            "content": [
                {"type": "audio", "audio": pcm16(sound)},
                {"type": "image", "image": image},
                {"type": "text", "text": "Hi"},
            ],
        },
    ]
    expected = reference_inputs(reference, messages)
    assert torch.equal(got.input_ids, expected["input_ids"][0])
    assert got.feature_attention_mask is not None and got.input_features is not None
    frames = got.feature_attention_mask.shape[1]
    assert torch.equal(got.input_features, expected["input_features"][:, :, :frames])
    assert torch.equal(got.pixel_values, expected["pixel_values"])
    assert torch.equal(got.image_grid_thw, expected["image_grid_thw"])


def test_audio_at_16_khz_reaches_the_model_unresampled_and_other_rates_are_resampled(
    preprocessor: Preprocessor, reference: Any
) -> None:
    sound = clip(300, 0.8)
    at_16k = preprocessor(request(audio_part(sound, 16_000)))
    direct = reference.feature_extractor([pcm16(sound)], sampling_rate=16_000, return_tensors="pt")["input_features"]
    frames = at_16k.feature_attention_mask.shape[1]
    assert torch.equal(at_16k.input_features, direct[:, :, :frames])
    at_24k = preprocessor(request(audio_part(resample(sound, 16_000, 24_000), 24_000)))
    assert at_24k.input_features is not None and not torch.equal(at_24k.input_features, at_16k.input_features)


def test_the_system_prompt_is_the_models_unless_the_request_brings_one(
    preprocessor: Preprocessor, reference: Any
) -> None:
    tokenizer = reference.tokenizer
    plain = tokenizer.decode(preprocessor("Hello").input_ids)
    assert plain.startswith(f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nHello")
    own = {"task": "chat", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}
    assert tokenizer.decode(preprocessor(own).input_ids).startswith("<|im_start|>system\nBe brief.<|im_end|>")


@pytest.mark.parametrize(
    ("voice", "speaker"),
    [(None, "Chelsie"), ("Chelsie", "Chelsie"), ("ethan", "Ethan"), ("ETHAN", "Ethan"), ("alloy", "Chelsie")],
)
def test_the_voice_names_a_speaker_of_the_checkpoint(preprocessor: Preprocessor, voice: Any, speaker: str) -> None:
    knobs = preprocessor(
        request({"type": "text", "text": "Hi"}, modalities=["text", "audio"], audio={"voice": voice})
    ).knobs
    assert knobs.want_audio and knobs.speaker == speaker


def test_an_unknown_voice_is_refused_naming_the_speakers(preprocessor: Preprocessor) -> None:
    with pytest.raises(ValueError, match=r"audio.voice: 'bob' .* Chelsie, Ethan"):
        preprocessor(request({"type": "text", "text": "Hi"}, modalities=["audio"], audio={"voice": "bob"}))


def test_a_text_answer_has_no_speaker_and_the_knobs_are_read(preprocessor: Preprocessor) -> None:
    knobs = preprocessor(request({"type": "text", "text": "Hi"}, max_tokens=5, temperature=0, seed=7)).knobs
    assert (knobs.want_audio, knobs.speaker, knobs.max_new_tokens, knobs.temperature, knobs.seed) == (
        False,
        None,
        5,
        0.0,
        7,
    )
    with pytest.raises(ValueError, match="max_tokens"):
        preprocessor(request({"type": "text", "text": "Hi"}, max_tokens=0))


@pytest.mark.parametrize("part", [{"type": "video_url", "video_url": {"url": "x"}}, {"type": "input_video"}])
def test_video_is_refused_naming_it(preprocessor: Preprocessor, part: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"messages\[0\].content\[0\]: video input is not supported"):
        preprocessor(request(part))


def test_the_towers_batch_requests_without_changing_any(tiny: Path, preprocessor: Preprocessor) -> None:
    requests = [
        preprocessor(request(audio_part(clip(440, 1.3)), audio_part(clip(220, 0.4)))),
        preprocessor(request(audio_part(clip(330, 2.1)))),
        preprocessor(request({"type": "image", "image": np.asarray(picture(1, 56, 56))})),
        preprocessor(
            request(
                {"type": "image", "image": np.asarray(picture(2, 84, 28))},
                {"type": "image", "image": np.asarray(picture(3))},
            )
        ),
    ]
    audio, vision = AudioTower(tiny), VisionTower(tiny)
    clips = [(r.input_features, r.feature_attention_mask) for r in requests[:2]]
    together = audio.encode(clips)
    for (embeds, lengths), alone in zip(together, clips, strict=True):
        [(solo, solo_lengths)] = audio.encode([alone])
        torch.testing.assert_close(embeds, solo, rtol=0, atol=1e-6)
        assert torch.equal(lengths, solo_lengths)
    images = [(r.pixel_values, r.image_grid_thw) for r in requests[2:]]
    for embeds, alone in zip(vision.encode(images), images, strict=True):
        torch.testing.assert_close(embeds, vision.encode([alone])[0], rtol=0, atol=1e-6)
