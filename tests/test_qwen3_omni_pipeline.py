"""configs/qwen3-omni.toml on a tiny checkpoint answers what transformers' ``generate`` answers.

Greedy thinker (``temperature`` 0) and talker (``talker.factory.do_sample=false``): for a text, an audio
and an image prompt the thinker's ids are ``generate``'s, the transcript is their decode, and the
streamed pcm16 has the length of ``generate``'s waveform and matches it (≥ 80 dB, the figure the code2wav
stage holds against transformers' whole decode: float rounding flips a rare sample by 1 LSB; a different
talker code would change whole frames), inline and with one process per stage.  Eight concurrent
requests each equal their solo answer, and the thinker, the talker and code2wav each held several of
them at once (the pipeline's own event timeline says so); a text-only request never reaches the talker
or code2wav and leaves no request held at any stage; an abort in the middle of the audio, once its
audio has crossed from code2wav's process through shared memory, leaves no request held by any stage
or the coordinator, and once the pipeline is closed none of its segments in /dev/shm.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import trio

from omnitrio import open_pipeline
from omnitrio.config import PipelineConfig
from omnitrio.config_loading import load
from omnitrio.events import EVENT_DIR_ENV
from omnitrio.pipeline import Pipeline
from omnitrio.trace import load as load_events
from omnitrio.transport.relay import DEFAULT_INLINE_LIMIT
from schedulers.qwen3_omni.tiny import write_checkpoint
from tests.pipelines import leave_after_audio, most_held_at_once, our_shm, settled, streamed_answer
from toys.qwen3_omni_reference import (
    ReferenceOutput,
    load_reference_model,
    reference_generate,
    reference_processor,
    sample_messages,
)
from toys.qwen3_omni_requests import chat_inputs, on_pcm_grid, pcm16, snr_db

pytestmark = pytest.mark.timeout(600)

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "qwen3-omni.toml"
THINKER_TOKENS = 10
TALKER_TOKENS = 24
# bench/gpu/qwen3_omni.sh sets it to run the same checks with every model stage on CUDA (float32, no TF32).
DEVICE = os.environ.get("OMNITRIO_QWEN3_OMNI_DEVICE", "cpu")
# The reference runs on the CPU: CUDA's float32 kernels round differently, a few LSB more in pcm16.
MIN_SNR_DB = 80.0 if DEVICE == "cpu" else 60.0
PROMPTS = ("text", "tone", "image")
GREEDY_TALKER = [
    "talker.factory.do_sample=false",
    f"talker.factory.max_new_tokens={TALKER_TOKENS}",
    "talker.factory.min_new_tokens=2",  # what toys.qwen3_omni_reference passes generate
]


def reference_answer(model: Any, processor: Any, messages: list[dict[str, Any]], **speaker: str) -> ReferenceOutput:
    """``generate``'s greedy answer to ``messages`` at these tests' lengths (:data:`THINKER_TOKENS`,
    :data:`TALKER_TOKENS`); ``speaker`` as ``reference_generate`` takes it."""
    return reference_generate(
        model, processor, messages, max_new_tokens=THINKER_TOKENS, talker_max_new_tokens=TALKER_TOKENS, **speaker
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return write_checkpoint(tmp_path_factory.mktemp("qwen3-omni") / "tiny", size="tiny")


@pytest.fixture(scope="module")
def messages() -> dict[str, list[dict[str, Any]]]:
    return {name: on_pcm_grid(m) for name, m in sample_messages().items()}


@pytest.fixture(scope="module")
def references(checkpoint: Path, messages: dict[str, list[dict[str, Any]]]) -> dict[str, ReferenceOutput]:
    model, processor = load_reference_model(checkpoint), reference_processor(checkpoint)
    return {name: reference_answer(model, processor, messages[name]) for name in PROMPTS}


@pytest.fixture(scope="module")
def config(checkpoint: Path) -> PipelineConfig:
    return load(CONFIG, GREEDY_TALKER, model=checkpoint, device=DEVICE)


@pytest.fixture
async def inline(config: PipelineConfig) -> Any:
    async with open_pipeline(config, inline=True) as pipeline:
        yield pipeline


def assert_equal_to_generate(got: dict[str, Any], expected: ReferenceOutput, tokenizer: Any) -> None:
    decode = got["results"]["decode"]
    assert decode["token_ids"] == expected.token_ids
    assert decode["transcript"] == tokenizer.decode(expected.token_ids, skip_special_tokens=True)
    assert expected.codes is not None and expected.waveform is not None
    assert got["results"]["code2wav"]["num_frames"] == expected.codes.shape[1]
    reference = pcm16(expected.waveform)
    assert len(got["pcm"]) == len(reference)
    assert snr_db(reference, got["pcm"]) >= MIN_SNR_DB


@pytest.fixture(scope="module")
def tokenizer(checkpoint: Path) -> Any:
    return reference_processor(checkpoint).tokenizer


@pytest.mark.parametrize("prompt", PROMPTS)
async def test_inline_pipeline_speaks_what_generate_speaks(
    inline: Pipeline, prompt: str, messages: Any, references: Any, tokenizer: Any
) -> None:
    got = await streamed_answer(inline, prompt, chat_inputs(messages[prompt], max_tokens=THINKER_TOKENS))
    assert_equal_to_generate(got, references[prompt], tokenizer)


async def test_one_process_per_stage_speaks_what_generate_speaks(
    config: PipelineConfig, messages: Any, references: Any, tokenizer: Any
) -> None:
    async with open_pipeline(config) as pipeline:
        processes = {entry["process"] for entry in (await pipeline.health())["stages"].values()}
        for prompt in PROMPTS:
            got = await streamed_answer(pipeline, prompt, chat_inputs(messages[prompt], max_tokens=THINKER_TOKENS))
            assert_equal_to_generate(got, references[prompt], tokenizer)
    assert {"frontend", "thinker", "talker", "code2wav"} <= processes  # and the realtime front (ingress, listen)


async def test_eight_concurrent_requests_each_equal_their_solo_answer(
    config: PipelineConfig,
    messages: Any,
    references: Any,
    tokenizer: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(EVENT_DIR_ENV, str(tmp_path))
    answers: dict[int, dict[str, Any]] = {}
    async with open_pipeline(config, inline=True) as pipeline:

        async def one(i: int) -> None:
            inputs = chat_inputs(messages[PROMPTS[i % 3]], max_tokens=THINKER_TOKENS)
            answers[i] = await streamed_answer(pipeline, f"c{i}", inputs)

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(one, i)
    for i, got in answers.items():
        assert_equal_to_generate(got, references[PROMPTS[i % 3]], tokenizer)
    events = load_events([tmp_path])
    together = {stage: most_held_at_once(events, stage) for stage in ("thinker", "talker", "code2wav")}
    assert min(together.values()) >= 2, together


async def test_text_only_request_never_reaches_talker_or_code2wav(
    config: PipelineConfig, messages: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(EVENT_DIR_ENV, str(tmp_path))
    async with open_pipeline(config, inline=True) as pipeline:
        got = await streamed_answer(
            pipeline, "t", chat_inputs(messages["text"], audio=False, max_tokens=THINKER_TOKENS)
        )
    stages = {event.stage for event in load_events([tmp_path]) if event.request_id == "t" and event.stage}
    assert set(got["results"]) == {"decode"} and "text" in got["results"]["decode"]
    assert set(got["modalities"]) == {"text"}
    assert {"thinker", "decode"} <= stages and not stages & {"talker", "code2wav"}


async def test_a_text_only_request_leaves_no_request_held_at_any_stage(inline: Pipeline, messages: Any) -> None:
    got = await streamed_answer(inline, "t", chat_inputs(messages["text"], audio=False, max_tokens=THINKER_TOKENS))
    assert set(got["results"]) == {"decode"}
    await settled(inline, 30)


async def test_abort_in_the_middle_of_the_audio_frees_every_stage(checkpoint: Path, messages: Any) -> None:
    before = our_shm()
    longer = ["talker.factory.do_sample=false", "talker.factory.max_new_tokens=400"]
    longer.append("talker.factory.min_new_tokens=60")  # code2wav's windows grow past the inline limit
    long_talk = load(CONFIG, longer, model=checkpoint, device=DEVICE)
    async with open_pipeline(long_talk) as pipeline:
        inputs = chat_inputs(messages["tone"], max_tokens=64)
        made = await leave_after_audio(pipeline, "a", inputs, over_bytes=DEFAULT_INLINE_LIMIT) - before
        await settled(pipeline, 30)
    assert made, "no audio chunk crossed through shared memory: the check below would prove nothing"
    assert not our_shm() & made and our_shm() <= before  # no segment of this pipeline's processes is left


def test_model_dir_sets_every_stage_and_names_the_model(checkpoint: Path, config: PipelineConfig) -> None:
    assert config.name == checkpoint.name
    readers = [s for s in config.stages if s.factory_path.startswith("schedulers.qwen3_omni.")]
    dirs = {stage.factory.values.get("model_dir") for stage in readers if stage.name not in {"aggregate", "ingress"}}
    assert dirs == {str(checkpoint.resolve())}  # every stage that reads the checkpoint


def test_check_validates_the_checkpoint_for_every_stage(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from omnitrio.cli import main

    assert main(["check", "--model", str(checkpoint), str(CONFIG)]) == 0


def _misplace_a_tensor(directory: Path) -> str:
    import json

    index = json.loads((directory / "model.safetensors.index.json").read_text())
    weights = index["weight_map"]
    name = next(k for k in weights if k.startswith("talker."))
    wrong = next(shard for shard in sorted(set(weights.values())) if shard != weights[name])
    weights[name] = wrong  # the index says a shard holds a tensor it does not
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return f"{wrong}: the index"


def _remove_a_shard(directory: Path) -> str:
    shard = sorted(directory.glob("model-*.safetensors"))[-1]
    shard.unlink()
    return f"{shard.name}: missing"


def _another_models_config(directory: Path) -> str:
    (directory / "config.json").write_text('{"model_type": "llama", "hidden_size": 64}')
    return "config.json: model_type is 'llama'"


@pytest.mark.parametrize("damage", [_misplace_a_tensor, _remove_a_shard, _another_models_config])
def test_check_names_the_file_at_fault(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: Any
) -> None:
    import shutil

    from omnitrio.cli import main

    broken = shutil.copytree(checkpoint, tmp_path / "broken")
    expected = damage(broken)
    assert main(["check", "--model", str(broken), str(CONFIG)]) == 2
    assert expected in capsys.readouterr().err
