"""The Qwen2.5-Omni thinker wrapper answers as ``generate`` does, and hands the talker what ``generate`` does.

Reference: ``Qwen2_5OmniForConditionalGeneration.generate(return_audio=True)`` greedy on the same tiny
checkpoint.  Ours: the front's processor and towers, then :class:`ThinkerLM` (only the text model and head,
loaded from the checkpoint) prefilling and decoding one token at a time through a transformers cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from schedulers.qwen2_5_omni.front.encoders import AudioTower, VisionTower
from schedulers.qwen2_5_omni.front.processor import OmniProcessor
from schedulers.qwen2_5_omni.thinker.model import Prefill, PromptInputs, ThinkerLM
from tests.qwen2_5_omni_reference import (  # noqa: F401  (fixtures model, tiny)
    clip,
    left_padded,
    media,
    picture,
    reference_answer,
    reference_model,
    reference_processor,
    text,
    tiny_checkpoint,
    user,
)

TOKENS = 12


PROMPTS = {
    "text": user(text("Hello, how are you?")),
    "audio": user({"type": "audio", "audio": clip(440)}, text("What is said?")),
    "image": user({"type": "image", "image": picture(0)}, text("Describe it.")),
    "audio and image": user(
        {"type": "audio", "audio": clip(220, 0.7)}, {"type": "image", "image": picture(1, 84, 56)}, text("Both?")
    ),
}


@attrs.define
class Ours:
    processor: OmniProcessor
    audio: AudioTower
    vision: VisionTower
    thinker: ThinkerLM

    def prompt(self, messages: list[dict[str, Any]]) -> PromptInputs:
        audio, images = media(messages)
        inputs = self.processor(self.processor.render(messages), audio=audio, images=images)
        found: dict[str, Any] = {}
        if audio:
            [(found["audio_embeds"], found["audio_feature_lengths"])] = self.audio.encode(
                [(inputs["input_features"], inputs["feature_attention_mask"])]
            )
        if images:
            [found["image_embeds"]] = self.vision.encode([(inputs["pixel_values"], inputs["image_grid_thw"])])
            found["image_grid_thw"] = inputs["image_grid_thw"]
        return self.thinker.prompt_inputs(inputs["input_ids"][0], **found)

    def greedy(self, messages: list[dict[str, Any]], tokens: int = TOKENS) -> tuple[list[int], list[Any]]:
        """The greedy answer's ids and what each forward handed on: ``(hidden, embeds)`` per forward."""
        prompt = self.prompt(messages)
        prefill = self.thinker.prefill(prompt)
        ids, states = [int(prefill.logits.argmax())], [(prefill.hidden, prefill.embeds)]
        length, eos = prompt.input_ids.shape[0], self.thinker.thinker_config.eos_token_id
        while len(ids) < tokens and ids[-1] != eos:
            embed = self.thinker.embed(torch.tensor([ids[-1]]))
            step = self.thinker.decode(embed, [length], [prompt.rope_delta], None, prefill.cache)
            assert step.hidden is not None
            states.append((step.hidden, embed))
            ids.append(int(step.logits[0].argmax()))
            length += 1
        return ids, states


@pytest.fixture(scope="module")
def ours(tiny: Path) -> Ours:
    return Ours(
        OmniProcessor.from_pretrained(tiny), AudioTower(tiny), VisionTower(tiny), ThinkerLM.from_checkpoint(tiny)
    )


@pytest.mark.parametrize("case", list(PROMPTS))
def test_greedy_answer_and_talker_inputs_equal_generate(model: Any, tiny: Path, ours: Ours, case: str) -> None:
    expected = reference_answer(model, reference_processor(tiny), PROMPTS[case], max_new_tokens=TOKENS)
    ids, states = ours.greedy(PROMPTS[case])
    assert ids == expected.ids
    # generate hands the talker every forward's last hidden state and input embeddings
    assert len(states) == len(expected.hidden)
    for (hidden, embeds), their_hidden, their_embeds in zip(states, expected.hidden, expected.embeds, strict=True):
        assert torch.equal(hidden.reshape(their_hidden.shape), their_hidden)
        assert torch.equal(embeds.reshape(their_embeds.shape), their_embeds)


def test_the_answer_depends_on_the_audio(ours: Ours) -> None:
    first = ours.greedy(user({"type": "audio", "audio": clip(440)}, text("What is said?")))[0]
    second = ours.greedy(user({"type": "audio", "audio": clip(220)}, text("What is said?")))[0]
    assert first != second


def test_an_image_prompt_has_3d_positions_and_others_do_not(ours: Ours) -> None:
    image = ours.prompt(PROMPTS["image"])
    assert image.rope_delta != 0 and not torch.equal(image.position_ids[1], image.position_ids[2])
    for case in ("text", "audio"):  # transformers computes 3-D positions only for images and videos
        prompt = ours.prompt(PROMPTS[case])
        assert prompt.rope_delta == 0
        assert all(torch.equal(prompt.position_ids[0], axis) for axis in prompt.position_ids[1:])


def test_a_batch_of_rows_equals_the_rows_alone(ours: Ours) -> None:
    cases = ["audio and image", "text", "audio", "image"]
    solo = {case: ours.greedy(PROMPTS[case], tokens=8) for case in cases}
    prompts = [ours.prompt(PROMPTS[case]) for case in cases]
    prefills: list[Prefill] = [ours.thinker.prefill(prompt) for prompt in prompts]
    assert len({prompt.input_ids.shape[0] for prompt in prompts}) == len(cases)  # rows of different lengths
    cache, mask = left_padded([prefill.cache for prefill in prefills])
    ids = [[int(prefill.logits.argmax())] for prefill in prefills]
    lengths = [prompt.input_ids.shape[0] for prompt in prompts]
    for _ in range(7):
        mask = torch.cat([mask, torch.ones(len(cases), 1, dtype=torch.long)], dim=1)
        embeds = ours.thinker.embed(torch.tensor([row[-1] for row in ids]))
        step = ours.thinker.decode(embeds, lengths, [p.rope_delta for p in prompts], mask, cache)
        assert step.hidden is not None
        for row, case in enumerate(cases):
            hidden, embed = solo[case][1][len(ids[row])]
            torch.testing.assert_close(step.hidden[row], hidden[0], rtol=0, atol=1e-5)
            assert torch.equal(embeds[row], embed[0])
            ids[row].append(int(step.logits[row].argmax()))
        lengths = [n + 1 for n in lengths]
    assert ids == [solo[case][0][:8] for case in cases]


def test_placeholders_without_their_features_are_refused(ours: Ours) -> None:
    prompt = ours.prompt(PROMPTS["audio"])
    with pytest.raises(ValueError, match="audio_embeds: 0 rows sent"):
        ours.thinker.prompt_inputs(prompt.input_ids)
    image = ours.prompt(PROMPTS["image"])
    with pytest.raises(ValueError, match="image_grid_thw"):
        ours.thinker.prompt_inputs(image.input_ids, image_embeds=torch.zeros(4, ours.thinker.hidden_size))
