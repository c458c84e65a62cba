"""The Qwen3-Omni thinker stage against transformers' own ``generate`` on the same tiny checkpoint.

Greedy answers must be the same token ids for text, audio and image prompts, alone or eight at a time
joining the batch at different steps; a sampled answer draws the tokens ``generate`` draws from the same
seeded generator; the talker's prompt chunk must carry exactly the embeddings and
hidden states ``generate`` computes; abort and finish must free the request's keys/values.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import torch

from omnitrio.contract import IncomingMessage, InvalidRequest, OmniRequest, OutgoingMessage, StagePayload
from schedulers.engine.handoffs import DecodeToken, ThinkerResult
from schedulers.engine.sampling import Sampler, SamplingDefaults
from schedulers.front.handoffs import ThinkerInput
from schedulers.qwen3_omni import checkpoint as checkpoint_module
from schedulers.qwen3_omni.handoffs import Knobs, TalkerPrompt, TalkerToken
from schedulers.qwen3_omni.thinker import stage as thinker_stage_module
from schedulers.qwen3_omni.thinker.stage import ThinkerScheduler, create_thinker_stage
from schedulers.qwen3_omni.tiny import write_checkpoint
from tests.scheduler_harness import running
from toys.qwen3_omni_reference import load_reference_model, processor_inputs, reference_processor
from toys.qwen3_omni_thinker import thinker_payload, thinker_scheduler

TIMEOUT = 120


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("qwen3-omni-tiny"), size="tiny")


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> Any:
    torch.set_num_threads(1)
    return load_reference_model(checkpoint)


@pytest.fixture(scope="module")
def processor(checkpoint: Path) -> Any:
    return reference_processor(checkpoint)


@pytest.fixture
def make_scheduler(checkpoint: Path) -> Callable[..., ThinkerScheduler]:
    return lambda **kwargs: thinker_scheduler(checkpoint, **kwargs)


def _audio(seconds: float, freq: float) -> np.ndarray:
    t = np.arange(int(16_000 * seconds)) / 16_000
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (40, 56, 3), dtype=np.uint8)


def _messages(text: str, *, audio: np.ndarray | None = None, image: np.ndarray | None = None) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if audio is not None:
        parts.append({"type": "audio", "audio": audio})
    if image is not None:
        parts.append({"type": "image", "image": image})
    parts.append({"type": "text", "text": text})
    return [{"role": "user", "content": parts}]


def _generate(reference: Any, inputs: Any, max_new_tokens: int, **kwargs: Any) -> Any:
    """``generate``'s thinker on ``inputs``, greedy unless ``kwargs`` say ``thinker_do_sample=True``."""
    eos = reference.config.im_end_token_id
    with torch.inference_mode():
        return reference.generate(
            **inputs,
            return_audio=False,
            thinker_max_new_tokens=max_new_tokens,
            thinker_eos_token_id=eos,
            **{"thinker_do_sample": False, **kwargs},
        )


def _send(scheduler: ThinkerScheduler, rid: str, data: ThinkerInput) -> None:
    scheduler.inbox.put(IncomingMessage(rid, "new_request", StagePayload(rid, OmniRequest(), data)))


def _collect(scheduler: ThinkerScheduler, rids: set[str]) -> dict[str, list[OutgoingMessage]]:
    """Every output (of any request) until each of ``rids`` has its result or error."""
    outputs: dict[str, list[OutgoingMessage]] = collections.defaultdict(list)
    pending = set(rids)
    while pending:
        out = scheduler.outbox.get(timeout=TIMEOUT)
        outputs[out.request_id].append(out)
        if out.type in ("result", "error"):
            pending.discard(out.request_id)
    return outputs


def _answer(outputs: list[OutgoingMessage]) -> list[int]:
    last = outputs[-1]
    assert last.type == "result", last.data
    return list(last.data.data.token_ids)


def _ask(scheduler: ThinkerScheduler, data: ThinkerInput, rid: str = "r") -> list[OutgoingMessage]:
    with running(scheduler):
        _send(scheduler, rid, data)
        return _collect(scheduler, {rid})[rid]


def test_stage_reads_only_the_thinkers_text_model_and_head(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str] = []
    load = checkpoint_module.load_weights

    def spy(model_dir: Any, prefix: str, module: torch.nn.Module) -> None:
        read.append(prefix)
        load(model_dir, prefix, module)

    monkeypatch.setattr(thinker_stage_module, "load_weights", spy)  # the name the stage reads it by
    scheduler = create_thinker_stage(model_dir=str(checkpoint))
    assert sorted(read) == ["thinker.lm_head.", "thinker.model."]
    assert not any(t.is_meta for t in scheduler.engine.lm.model.state_dict().values())


def test_greedy_text_answer_is_generates(reference: Any, processor: Any, make_scheduler: Any) -> None:
    inputs = processor_inputs(processor, _messages("hello there, how are you today?"))
    expected = _generate(reference, inputs, 12)[0, inputs["input_ids"].shape[1] :].tolist()
    outputs = _ask(make_scheduler(), thinker_payload(reference, inputs, max_new_tokens=12, temperature=0.0))
    assert _answer(outputs) == expected


@pytest.mark.parametrize("media", ["audio", "image", "audio+image"])
def test_greedy_multimodal_answer_is_generates(reference: Any, processor: Any, make_scheduler: Any, media: str) -> None:
    audio = _audio(1.0, 440.0) if "audio" in media else None
    image = _image(1) if "image" in media else None
    inputs = processor_inputs(processor, _messages("what is this?", audio=audio, image=image))
    expected = _generate(reference, inputs, 10)[0, inputs["input_ids"].shape[1] :].tolist()
    outputs = _ask(make_scheduler(), thinker_payload(reference, inputs, max_new_tokens=10))  # no temperature
    assert _answer(outputs) == expected


def test_checkpoint_sampling_applies_only_when_a_request_samples() -> None:
    from transformers import GenerationConfig

    released = GenerationConfig(do_sample=True, temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.05)
    defaults = SamplingDefaults.of(released)
    asked_greedy, unsaid = Sampler.build(defaults, 0.0), Sampler.build(defaults, None)
    assert asked_greedy.greedy and not asked_greedy.processors
    assert not unsaid.greedy
    assert [type(p).__name__ for p in unsaid.processors] == [
        "RepetitionPenaltyLogitsProcessor",
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
    ]
    assert Sampler.build(SamplingDefaults.of(None), None).greedy  # generate's own thinker default


def test_answer_depends_on_the_audio(reference: Any, processor: Any, make_scheduler: Any) -> None:
    answers = []
    for audio in (_audio(1.0, 300.0), np.zeros(16_000, np.float32)):
        inputs = processor_inputs(processor, _messages("listen", audio=audio))
        answers.append(_answer(_ask(make_scheduler(), thinker_payload(reference, inputs, max_new_tokens=8))))
    assert answers[0] != answers[1]


def test_eight_concurrent_requests_each_equal_their_solo_answer(
    reference: Any, processor: Any, make_scheduler: Any
) -> None:
    texts = ["hi", "tell me a story about a cat", "one two three four five six seven", "why?"] * 2
    limits = [9, 4, 14, 6, 11, 3, 8, 12]
    payloads = []
    for i, (text, limit) in enumerate(zip(texts, limits, strict=True)):
        media = {"audio": _audio(0.5 + 0.25 * i, 200.0 + 50 * i)} if i % 3 == 1 else {}
        inputs = processor_inputs(processor, _messages(text * (1 + i % 3), **media))
        payloads.append(lambda inputs=inputs, limit=limit: thinker_payload(reference, inputs, max_new_tokens=limit))
    solo = [_answer(_ask(make_scheduler(), make())) for make in payloads]

    batch_sizes: list[int] = []
    scheduler: ThinkerScheduler

    def join_next(step: int) -> None:  # on the scheduler thread: request `step` joins after step `step`
        batch_sizes.append(len(scheduler.engine.running))
        if step < len(payloads):
            _send(scheduler, f"r{step}", payloads[step]())

    scheduler = make_scheduler(on_step=join_next)
    with running(scheduler):
        _send(scheduler, "r0", payloads[0]())
        outputs = _collect(scheduler, {f"r{i}" for i in range(len(payloads))})
    assert [_answer(outputs[f"r{i}"]) for i in range(len(payloads))] == solo
    assert max(batch_sizes) >= 4
    assert scheduler.live_requests == 0 and scheduler.kv_bytes == 0


def test_abort_mid_decode_frees_the_requests_keys_and_values(
    reference: Any, processor: Any, make_scheduler: Any
) -> None:
    inputs = processor_inputs(processor, _messages("a long answer please"))
    rows: list[list[str]] = []
    scheduler: ThinkerScheduler

    def abort_at_third_step(step: int) -> None:
        rows.append(list(scheduler.engine.kv.rows))
        if step == 3:
            scheduler.abort("doomed")

    scheduler = make_scheduler(on_step=abort_at_third_step, eos_token_id=-1)
    with running(scheduler):
        _send(scheduler, "doomed", thinker_payload(reference, inputs, max_new_tokens=200))
        _send(scheduler, "kept", thinker_payload(reference, inputs, max_new_tokens=12))
        outputs = _collect(scheduler, {"kept"})
    assert len(_answer(outputs["kept"])) == 12
    assert [o.type for o in outputs["doomed"]] == ["stream"] * 3  # three tokens, then nothing
    assert rows[2] == ["doomed", "kept"] and rows[3] == ["kept"]
    assert scheduler.live_requests == 0 and scheduler.kv_bytes == 0


def test_prompt_chunk_holds_generates_embeddings_and_accept_layer_state(
    reference: Any, processor: Any, make_scheduler: Any
) -> None:
    inputs = processor_inputs(processor, _messages("describe", audio=_audio(0.8, 500.0), image=_image(2)))
    result = _generate(reference, inputs, 5, thinker_output_hidden_states=True, thinker_return_dict_in_generate=True)
    data = thinker_payload(reference, inputs, max_new_tokens=5, want_audio=True, speaker="chelsie")
    outputs = _ask(make_scheduler(), data)
    talker = [o.data for o in outputs if o.type == "stream" and o.target == "talker"]
    prompt, tokens = talker[0], talker[1:]
    layer = reference.config.talker_config.accept_hidden_layer
    assert isinstance(prompt, TalkerPrompt) and prompt.speaker == "chelsie"
    assert all(isinstance(t, TalkerToken) for t in tokens)
    assert torch.equal(prompt.token_ids, inputs["input_ids"][0])
    assert torch.equal(prompt.embeds, result.hidden_states[0][0][0])
    assert torch.equal(prompt.hidden, result.hidden_states[0][layer][0])
    generated = result.sequences[0, inputs["input_ids"].shape[1] :]
    assert [t.token_id for t in tokens] == generated.tolist()
    embed = reference.thinker.get_input_embeddings()
    assert all(torch.equal(t.embed, embed(torch.tensor([t.token_id]))) for t in tokens)


def test_text_only_request_sends_the_talker_nothing(reference: Any, processor: Any, make_scheduler: Any) -> None:
    inputs = processor_inputs(processor, _messages("just text"))
    outputs = _ask(make_scheduler(), thinker_payload(reference, inputs, max_new_tokens=6, want_audio=False))
    streams = [o for o in outputs if o.type == "stream"]
    assert streams and all(o.target == "decode" for o in streams)
    assert all(isinstance(o.data, DecodeToken) and not o.data.want_audio for o in streams)
    assert [o.data.token_id for o in streams] == _answer(outputs)


@pytest.mark.parametrize(("asked", "stage_cap", "expected"), [(3, 50, 3), (None, 4, 4), (40, 5, 5)])
def test_max_tokens_caps_the_answer(
    reference: Any, processor: Any, make_scheduler: Any, asked: int | None, stage_cap: int, expected: int
) -> None:
    inputs = processor_inputs(processor, _messages("count"))
    data = thinker_payload(reference, inputs, max_new_tokens=asked)
    outputs = _ask(make_scheduler(max_new_tokens=stage_cap, eos_token_id=-1), data)
    result = outputs[-1].data.data
    assert isinstance(result, ThinkerResult)
    assert len(result.token_ids) == expected and result.finish_reason == "length"
    assert result.usage == {"prompt_tokens": inputs["input_ids"].shape[1], "completion_tokens": expected}


def test_placeholder_mismatch_fails_only_that_request(reference: Any, processor: Any, make_scheduler: Any) -> None:
    inputs = processor_inputs(processor, _messages("hear", audio=_audio(1.0, 440.0)))
    good = thinker_payload(reference, inputs, max_new_tokens=4)
    assert good.audio_embeds is not None
    bad = attrs.evolve(good, audio_embeds=good.audio_embeds[:-1])
    scheduler = make_scheduler()
    with running(scheduler):
        _send(scheduler, "bad", bad)
        _send(scheduler, "good", good)
        outputs = _collect(scheduler, {"bad", "good"})
    assert outputs["bad"][-1].type == "error" and "audio_embeds" in str(outputs["bad"][-1].data)
    assert len(_answer(outputs["good"])) == 4


def test_prompt_longer_than_the_context_is_a_client_error(reference: Any, make_scheduler: Any) -> None:
    context = reference.config.thinker_config.text_config.max_position_embeddings
    outputs = _ask(make_scheduler(), ThinkerInput(torch.full((context,), 5), Knobs(max_new_tokens=4)))
    assert outputs[-1].type == "error"
    assert isinstance(outputs[-1].data, InvalidRequest) and outputs[-1].data.code == "context_length_exceeded"


def test_max_tokens_past_the_context_is_refused_and_no_max_tokens_gets_what_is_left(
    reference: Any, make_scheduler: Any
) -> None:
    context = reference.config.thinker_config.text_config.max_position_embeddings
    prompt = torch.full((context - 3,), 5)
    (refused,) = _ask(make_scheduler(), ThinkerInput(prompt, Knobs(max_new_tokens=4)))
    assert isinstance(refused.data, InvalidRequest) and refused.data.code == "context_length_exceeded"
    assert f"{context - 3} in the messages, 4 in the completion" in str(refused.data)
    answer = _ask(make_scheduler(eos_token_id=-1), ThinkerInput(prompt, Knobs()))[-1].data.data
    assert (len(answer.token_ids), answer.finish_reason) == (3, "length")


def test_sampling_at_a_temperature_draws_what_generate_draws(
    reference: Any, processor: Any, make_scheduler: Any
) -> None:
    """Without a seed the stage draws from torch's global generator, as ``generate`` does: seeded alike,
    both sample the same tokens, which greedy decoding does not give."""
    inputs = processor_inputs(processor, _messages("surprise me"))
    scheduler = make_scheduler()
    knobs = scheduler.sampling  # the stage's top-k, top-p and penalty, given to generate too
    torch.manual_seed(7)
    sampled = _answer(_ask(scheduler, thinker_payload(reference, inputs, max_new_tokens=8, temperature=1.5)))
    torch.manual_seed(7)
    drawn = _generate(
        reference,
        inputs,
        8,
        thinker_do_sample=True,
        thinker_temperature=1.5,
        thinker_top_k=knobs.top_k,
        thinker_top_p=knobs.top_p,
        thinker_repetition_penalty=knobs.repetition_penalty,
    )[0, inputs["input_ids"].shape[1] :].tolist()
    greedy = _answer(_ask(make_scheduler(), thinker_payload(reference, inputs, max_new_tokens=8, temperature=0.0)))
    assert sampled == drawn
    assert sampled != greedy


def test_sampling_is_reproducible_for_a_seed_and_stays_in_vocab(
    reference: Any, processor: Any, make_scheduler: Any
) -> None:
    inputs = processor_inputs(processor, _messages("surprise me"))
    runs = [
        _answer(_ask(make_scheduler(seed=7), thinker_payload(reference, inputs, max_new_tokens=8, temperature=1.5)))
        for _ in range(2)
    ]
    greedy = _answer(_ask(make_scheduler(), thinker_payload(reference, inputs, max_new_tokens=8, temperature=0.0)))
    assert runs[0] == runs[1] != greedy
    assert all(0 <= t < reference.config.thinker_config.text_config.vocab_size for t in runs[0])
