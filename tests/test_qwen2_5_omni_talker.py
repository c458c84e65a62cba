"""The Qwen2.5-Omni talker wrapper speaks the codes ``generate`` speaks, from the thinker's stream.

Reference: ``Qwen2_5OmniForConditionalGeneration.generate(return_audio=True)`` greedy, the talker's codes as
it hands them to token2wav.  Ours: :class:`TalkerModel` (loaded from the checkpoint: ``talker.`` and the
thinker embedding rows it needs) fed by :class:`TalkerText` with the thinker states ``generate`` computed,
one token at a time as a stream would bring them, codes chosen by :class:`CodecSampler`.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers.cache_utils import DynamicCache

from schedulers.qwen2_5_omni.talker.codec_sampling import CodecSampler, CodecSampling, choose_codes
from schedulers.qwen2_5_omni.talker.model import TalkerModel
from schedulers.qwen2_5_omni.talker.prompt import TalkerText
from tests.qwen2_5_omni_reference import (  # noqa: F401  (fixtures)
    TALKER_PROMPTS,
    Answer,
    left_padded,
    reference_answer,
    reference_inputs,
    reference_model,
    reference_processor,
    talker_model,
    tiny_checkpoint,
    tiny_processor,
)

GREEDY = CodecSampling(do_sample=False)


PROMPTS = TALKER_PROMPTS


def stream(talker: TalkerModel, processor: Any, messages: Any, answer: Answer, speaker: str) -> TalkerText:
    """The thinker's stream of ``answer`` as a talker request begins it: the prompt, no answer token yet."""
    ids = reference_inputs(processor, messages)["input_ids"][0]
    return TalkerText(talker, ids, answer.hidden[0][0], answer.embeds[0][0], speaker)


def forwarded(answer: Answer) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The answer tokens the thinker forwarded (all but the last), as ``(hidden, embed)``."""
    return [(hidden[0, -1], embeds[0, -1]) for hidden, embeds in zip(answer.hidden[1:], answer.embeds[1:], strict=True)]


def speak(talker: TalkerModel, feed: TalkerText, sampler: CodecSampler, tokens: list[Any]) -> list[int]:
    """Run one request to its end, handing it the thinker's tokens only when a step waits for one."""
    pending = list(tokens)
    while not feed.prefill_ready():
        feed.add(*pending.pop(0)) if pending else feed.end()
    rows = feed.prefill()
    cache = DynamicCache(config=talker.config.talker_config)
    positions = torch.arange(rows.shape[0]).view(1, 1, -1).expand(3, 1, -1)
    logits = talker.forward(rows[None], positions, cache)
    step, length = 1, rows.shape[0]
    while not sampler.done:
        code = sampler.choose(logits[0])
        if sampler.done:
            break
        while not feed.has_step(step):
            feed.add(*pending.pop(0)) if pending else feed.end()
        logits = talker.forward(feed.step_input(step, code)[None, None], torch.full((3, 1, 1), length), cache)
        step, length = step + 1, length + 1
    assert sampler.codes[-1] in sampler.ends
    return sampler.codes[:-1]


def answer_of(model: Any, processor: Any, case: str, speaker: str = "Chelsie", tokens: int = 10) -> Answer:
    return reference_answer(model, processor, PROMPTS[case], speaker=speaker, max_new_tokens=tokens)


@pytest.mark.parametrize("case", ["text", "audio", "image"])
def test_greedy_codes_equal_generate(model: Any, processor: Any, talker: TalkerModel, case: str) -> None:
    expected = answer_of(model, processor, case)
    feed = stream(talker, processor, PROMPTS[case], expected, "Chelsie")
    codes = speak(talker, feed, CodecSampler(talker, GREEDY), forwarded(expected))
    assert codes == expected.codes
    assert len(codes) == len(expected.ids)  # the tiny talker ends on <tts_text_pad>: a code per token


def test_the_voice_changes_the_codes_as_generate_does(model: Any, processor: Any, talker: TalkerModel) -> None:
    chelsie, ethan = (answer_of(model, processor, "text", speaker=name) for name in ("Chelsie", "Ethan"))
    assert chelsie.ids == ethan.ids and chelsie.codes != ethan.codes
    feed = stream(talker, processor, PROMPTS["text"], ethan, "Ethan")
    assert speak(talker, feed, CodecSampler(talker, GREEDY), forwarded(ethan)) == ethan.codes


def test_an_answer_ended_by_eos_is_voiced_to_its_last_word(model: Any, processor: Any, talker: TalkerModel) -> None:
    expected = answer_of(model, processor, "ends by eos", tokens=40)
    assert expected.ids[-1] == model.thinker.generation_config.eos_token_id and len(expected.ids) < 40
    feed = stream(talker, processor, PROMPTS["ends by eos"], expected, "Chelsie")
    assert speak(talker, feed, CodecSampler(talker, GREEDY), forwarded(expected)) == expected.codes


def test_a_batch_of_rows_equals_the_rows_alone(model: Any, processor: Any, talker: TalkerModel) -> None:
    cases = ["image", "text", "audio"]
    answers = [answer_of(model, processor, case) for case in cases]
    feeds = [stream(talker, processor, PROMPTS[case], a, "Chelsie") for case, a in zip(cases, answers, strict=True)]
    for feed, answer in zip(feeds, answers, strict=True):
        for token in forwarded(answer):
            feed.add(*token)
        feed.end()
    prefills, caches = [], []
    for feed in feeds:
        rows = feed.prefill()
        caches.append(DynamicCache(config=talker.config.talker_config))
        positions = torch.arange(rows.shape[0]).view(1, 1, -1).expand(3, 1, -1)
        prefills.append((rows.shape[0], talker.forward(rows[None], positions, caches[-1])[0]))
    assert len({length for length, _ in prefills}) == len(cases)
    cache, mask = left_padded(caches)
    samplers = [CodecSampler(talker, GREEDY) for _ in cases]
    codes = choose_codes(samplers, torch.stack([logits for _, logits in prefills]))
    lengths = [length for length, _ in prefills]
    for step in range(1, 12):
        inputs = torch.stack([feed.step_input(step, code) for feed, code in zip(feeds, codes, strict=True)])
        mask = torch.cat([mask, torch.ones(len(cases), 1, dtype=torch.long)], dim=1)
        positions = torch.tensor(lengths).view(1, -1, 1).expand(3, -1, -1)
        codes = choose_codes(samplers, talker.forward(inputs[:, None], positions, cache, mask))
        lengths = [n + 1 for n in lengths]
    for sampler, answer in zip(samplers, answers, strict=True):
        spoken = sampler.codes[: sampler.codes.index(next(c for c in sampler.codes if c in sampler.ends))]
        assert spoken == answer.codes


def test_sampled_codes_follow_the_seed(model: Any, processor: Any, talker: TalkerModel) -> None:
    expected = answer_of(model, processor, "text")

    def sampled(seed: int) -> list[int]:
        feed = stream(talker, processor, PROMPTS["text"], expected, "Chelsie")
        return speak(talker, feed, CodecSampler(talker, CodecSampling(), seed=seed), forwarded(expected))

    first, again, other = sampled(0), sampled(0), sampled(1)
    assert first == again and first != other


def test_a_one_token_answer_has_nothing_to_voice(model: Any, processor: Any, talker: TalkerModel) -> None:
    expected = answer_of(model, processor, "text", tokens=2)  # the stream ends before token 0 is forwarded
    feed = stream(talker, processor, PROMPTS["text"], expected, "Chelsie")
    feed.end()
    assert feed.prefill_ready() and not feed.speakable()
    with pytest.raises(ValueError, match="nothing to voice"):
        feed.prefill()


def test_an_unknown_speaker_is_refused(model: Any, processor: Any, talker: TalkerModel) -> None:
    expected = answer_of(model, processor, "text", tokens=2)
    with pytest.raises(ValueError, match="Chelsie, Ethan"):
        stream(talker, processor, PROMPTS["text"], expected, "alloy")


def test_the_penalty_covers_the_prompts_codec_ids_and_bos_is_never_chosen(talker: TalkerModel) -> None:
    # generate's talker input_ids are [mask] * P + [pad, bos]: the repetition penalty reaches pad from the start
    logits = torch.full((talker.config.talker_config.vocab_size,), -10.0)
    logits[talker.codec_pad], logits[100], logits[talker.codec_bos] = 1.0, 0.97, 5.0
    sampler = CodecSampler(talker, GREEDY)
    assert sampler.choose(logits) == 100  # pad: 1.0 / 1.05 < 0.97; bos suppressed
    logits[100] = 0.9
    assert sampler.choose(logits) == talker.codec_pad and sampler.done
