"""configs/qwen2.5-omni.toml's text answers over HTTP (the official ``openai`` client) equal transformers'.

The front, the thinker (the kit's decoder stage) and the text decode on a tiny checkpoint: text, audio and
image prompts answer exactly ``Qwen2_5OmniForConditionalGeneration.generate``'s text ids and text, greedy
(whole and streamed) and sampled under a seed; ``max_tokens`` ends an answer with ``length``; eight
concurrent requests equal their solo answers while several are in the thinker together; a text-only request
never reaches the talker; a spoken answer's transcript and whole WAV are ``generate``'s; the thinker stage
streams the talker exactly what ``generate`` hands its talker.
"""

from __future__ import annotations

import base64
import io
import wave
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import torch
import trio

from omnitrio import open_pipeline
from omnitrio.config import PipelineConfig
from omnitrio.config_loading import load
from omnitrio.events import EVENT_DIR_ENV
from omnitrio.serve import serve
from omnitrio.trace import load as load_events
from schedulers.qwen2_5_omni.front.preprocess import SYSTEM_PROMPT
from tests import qwen2_5_omni_reference as ref
from tests.pipelines import most_held_at_once
from tests.qwen2_5_omni_reference import reference_model, tiny_checkpoint, tiny_processor  # noqa: F401  (fixtures)
from toys.qwen3_omni_requests import pcm16, snr_db

pytestmark = pytest.mark.timeout(600)

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "qwen2.5-omni.toml"
TOKENS = 10
SOUND, IMAGE = ref.clip(440, 1.2), ref.picture(4, 56, 42)
PROMPTS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
    # name: (the chat request's parts, the same parts as transformers reads them)
    "text": ([{"type": "text", "text": "Hello there"}], [{"type": "text", "text": "Hello there"}]),
    "audio": (
        [
            {"type": "input_audio", "input_audio": {"data": ref.wav(SOUND), "format": "wav"}},
            {"type": "text", "text": "Hm?"},
        ],
        [{"type": "audio", "audio": ref.pcm16(SOUND)}, {"type": "text", "text": "Hm?"}],
    ),
    "image": (
        [{"type": "image_url", "image_url": {"url": ref.png(IMAGE)}}, {"type": "text", "text": "What is it?"}],
        [{"type": "image", "image": IMAGE}, {"type": "text", "text": "What is it?"}],
    ),
}


def generated(
    model: Any, processor: Any, name: str, *, tokens: int = TOKENS, temperature: float = 0, seed: int = 0
) -> list[int]:
    """``generate``'s new text ids for prompt ``name`` under the model's system prompt (greedy at temperature 0,
    else sampled after ``torch.manual_seed(seed)``)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": PROMPTS[name][1]},
    ]
    inputs = ref.reference_inputs(processor, messages)
    if "pixel_values" in inputs:  # transformers 5.23's generate crashes on pixel_values, not on this name
        inputs["thinker_pixel_values"] = inputs.pop("pixel_values")
    sampling: dict[str, Any] = {"thinker_do_sample": bool(temperature)}
    if temperature:
        sampling["thinker_temperature"] = temperature
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(**inputs, generation_mode="text", thinker_max_new_tokens=tokens, **sampling)
    return list(out[0, inputs["input_ids"].shape[1] :].tolist())


@pytest.fixture(scope="module")
def greedy(model: Any, processor: Any) -> dict[str, list[int]]:
    """``generate``'s greedy answer ids per prompt."""
    return {name: generated(model, processor, name) for name in PROMPTS}


def finish_reason(ids: list[int], processor: Any) -> str:
    return "stop" if ids[-1] == processor.tokenizer.convert_tokens_to_ids("<|im_end|>") else "length"


def config_of(tiny: Path, *, processes: bool = False) -> PipelineConfig:
    """The shipped config on ``tiny``, the talker greedy; ``processes``: every stage in its own process;
    every model stage on ``ref.DEVICE``."""
    overrides = [f"{stage.name}.process={stage.name}" for stage in load(CONFIG).stages] if processes else []
    return load(CONFIG, ["talker.factory.do_sample=false", *overrides], model=tiny, device=ref.DEVICE)


async def serving(config: PipelineConfig, *, inline: bool = True) -> AsyncIterator[str]:
    shutdown = trio.Event()
    async with open_pipeline(config, inline=inline) as pipeline, trio.open_nursery() as nursery:
        options: dict[str, Any] = {"port": 0, "handle_signals": False, "graceful_timeout": 0.5, "shutdown": shutdown}
        port = await nursery.start(partial(serve, pipeline, **options))
        yield f"http://127.0.0.1:{port}/v1"
        shutdown.set()


@pytest.fixture(name="url")
async def served_url(tiny: Path, tmp_path: Path) -> AsyncIterator[str]:
    """The shipped config on the tiny checkpoint served over HTTP: its ``/v1`` address."""
    async for address in serving(config_of(tiny)):
        yield address


async def call(url: str, fn: Callable[[openai.OpenAI], Any]) -> Any:
    def run() -> Any:
        with openai.OpenAI(base_url=url, api_key="unused", max_retries=0) as client:
            return fn(client)

    return await trio.to_thread.run_sync(run)


def chat(name: str, **fields: Any) -> dict[str, Any]:
    content = PROMPTS[name][0]
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": TOKENS, **fields}


async def whole(url: str, body: dict[str, Any]) -> tuple[str, str, int]:
    """A non-streamed answer: its text, finish reason and completion tokens."""
    completion = await call(url, lambda c: c.chat.completions.create(**body))
    choice = completion.choices[0]
    assert choice.message.audio is None
    return choice.message.content, choice.finish_reason, completion.usage.completion_tokens


async def streamed(url: str, body: dict[str, Any]) -> tuple[str, str, int]:
    """A streamed answer: its deltas joined, its finish reason and (usage chunk) completion tokens."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    chunks = await call(url, lambda c: list(c.chat.completions.create(**body)))
    deltas = [chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices]
    reasons = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    [usage] = [chunk.usage for chunk in chunks if chunk.usage is not None]
    return "".join(deltas), reasons[-1], usage.completion_tokens


def expected(ids: list[int], processor: Any) -> tuple[str, str, int]:
    return processor.tokenizer.decode(ids, skip_special_tokens=True), finish_reason(ids, processor), len(ids)


@pytest.mark.parametrize("name", list(PROMPTS))
async def test_greedy_answer_is_generates_text_whole_and_streamed(
    url: str, name: str, greedy: dict[str, list[int]], processor: Any
) -> None:
    answer = expected(greedy[name], processor)
    assert await whole(url, chat(name, temperature=0)) == answer
    assert await streamed(url, chat(name, temperature=0)) == answer


async def test_one_process_per_stage_answers_as_generate(
    tiny: Path, tmp_path: Path, greedy: dict[str, list[int]], processor: Any
) -> None:
    async for address in serving(config_of(tiny, processes=True), inline=False):
        for name in PROMPTS:
            assert await whole(address, chat(name, temperature=0)) == expected(greedy[name], processor)


async def test_max_tokens_ends_the_answer_with_length(url: str, greedy: dict[str, list[int]], processor: Any) -> None:
    ids = greedy["audio"][:3]
    assert processor.tokenizer.convert_tokens_to_ids("<|im_end|>") not in ids
    text = processor.tokenizer.decode(ids, skip_special_tokens=True)
    assert await whole(url, chat("audio", temperature=0, max_tokens=3)) == (text, "length", 3)


async def test_a_sampled_answer_under_a_seed_is_generates(url: str, model: Any, processor: Any) -> None:
    answers = {}
    for seed in (3, 4):
        answers[seed] = generated(model, processor, "text", temperature=1.5, seed=seed)
        got = await whole(url, chat("text", temperature=1.5, seed=seed))
        assert got == expected(answers[seed], processor)
    assert answers[3] != answers[4]  # the seed changes the answer


async def test_eight_concurrent_requests_each_equal_their_solo_answer(
    tiny: Path, tmp_path: Path, greedy: dict[str, list[int]], processor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(EVENT_DIR_ENV, str(tmp_path))
    names = [list(PROMPTS)[i % len(PROMPTS)] for i in range(8)]
    answers: dict[int, tuple[str, str, int]] = {}
    async for address in serving(config_of(tiny)):

        async def one(i: int, address: str) -> None:
            ask = streamed if i % 2 else whole
            answers[i] = await ask(address, chat(names[i], temperature=0))

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(one, i, address)
    assert answers == {i: expected(greedy[name], processor) for i, name in enumerate(names)}
    assert most_held_at_once(load_events([tmp_path]), "thinker") >= 2


async def test_a_text_only_request_never_reaches_the_talker(
    tiny: Path, tmp_path: Path, greedy: dict[str, list[int]], processor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(EVENT_DIR_ENV, str(tmp_path))
    async for address in serving(config_of(tiny)):
        assert await whole(address, chat("text", temperature=0)) == expected(greedy["text"], processor)
    stages = {event.stage for event in load_events([tmp_path]) if event.stage and event.request_id}
    assert {"thinker", "decode"} <= stages and "talker" not in stages


async def test_a_spoken_answer_is_generates_text_and_audio(url: str, model: Any, processor: Any) -> None:
    """The speech branch behind the thinker: transcript and whole WAV (``stream: false``) as ``generate``'s."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": PROMPTS["text"][1]},
    ]
    reference = ref.reference_answer(model, processor, messages, speaker="Chelsie", seed=3, max_new_tokens=TOKENS)
    body = chat(
        "text", temperature=0, seed=3, modalities=["text", "audio"], audio={"voice": "Chelsie", "format": "wav"}
    )
    completion = await call(url, lambda c: c.chat.completions.create(**body))
    audio = completion.choices[0].message.audio
    assert audio.transcript == processor.tokenizer.decode(reference.ids, skip_special_tokens=True)
    with wave.open(io.BytesIO(base64.b64decode(audio.data))) as got:
        assert (got.getframerate(), got.getnchannels(), got.getsampwidth()) == (24_000, 1, 2)
        samples = np.frombuffer(got.readframes(got.getnframes()), "<i2")
    expected_pcm = pcm16(reference.wav.reshape(-1).numpy())
    assert len(samples) == len(expected_pcm) and snr_db(expected_pcm, samples) >= 60


@pytest.mark.parametrize("stream", [False, True])
def test_a_spoken_answer_hands_the_talker_what_generate_hands_it(tiny: Path, model: Any, stream: bool) -> None:
    """The thinker stage's talker stream: the prompt's ids, last hidden states and input embeddings, then one
    chunk per forwarded answer token, as ``generate`` computes them; the voice as the request asked."""
    from schedulers.engine.handoffs import ThinkerResult
    from schedulers.front.handoffs import ThinkerInput
    from schedulers.qwen2_5_omni.front.encoders import AudioTower
    from schedulers.qwen2_5_omni.front.processor import OmniProcessor
    from schedulers.qwen2_5_omni.handoffs import Knobs, TalkerPrompt, TalkerToken, Voice
    from schedulers.qwen2_5_omni.thinker.stage import create_thinker_stage
    from tests.scheduler_harness import new, running, take

    messages = ref.user({"type": "audio", "audio": ref.clip(440)}, ref.text("What is said?"))
    front = OmniProcessor.from_pretrained(tiny)
    inputs = front(front.render(messages), audio=[ref.clip(440)], images=[])
    [(audio, lengths)] = AudioTower(tiny).encode([(inputs["input_features"], inputs["feature_attention_mask"])])
    knobs = Knobs(max_new_tokens=8, temperature=0, seed=7, speaker="Chelsie", stream=stream, want_audio=True)
    given = ThinkerInput(inputs["input_ids"][0], knobs, audio_embeds=audio, audio_feature_lengths=lengths)
    reference = ref.reference_answer(model, ref.reference_processor(tiny), messages, max_new_tokens=8)
    scheduler = create_thinker_stage(model_dir=str(tiny), warm_up=False)
    with running(scheduler):
        scheduler.inbox.put(new("r", given))
        outputs = []
        while (out := take(scheduler.outbox)[0]).type == "stream":
            outputs.append(out)
    assert out.type == "result", out.data
    prompt, *tokens = [o.data for o in outputs if o.target == "talker"]
    assert isinstance(prompt, TalkerPrompt) and prompt.voice == Voice("Chelsie", 7, stream)
    assert torch.equal(prompt.token_ids, given.input_ids)
    assert torch.equal(prompt.hidden, reference.hidden[0][0]) and torch.equal(prompt.embeds, reference.embeds[0][0])
    assert len(tokens) == len(reference.ids) - 1  # every answer token but the last was forwarded
    for token, hidden, embed in zip(tokens, reference.hidden[1:], reference.embeds[1:], strict=True):
        assert isinstance(token, TalkerToken)
        assert torch.equal(token.hidden, hidden.reshape(-1)) and torch.equal(token.embed, embed.reshape(-1))
    assert [o.data.token_id for o in outputs if o.target == "decode"] == reference.ids
    prompt_len = int(given.input_ids.numel())
    assert out.data.data == ThinkerResult(tuple(reference.ids), prompt_len, out.data.data.finish_reason, True)
