"""An SGLang thinker (``schedulers.ar.sglang_backend``) served in a pipeline against a real SGLang engine on CPU.

Needs the separate venv (``python -m tests.sglang_env setup``) and runs there only::

    python -m tests.sglang_env test

The model is the CPU engine's tiny random Llama with the locally trained tokenizer, saved as a
Hugging Face directory, so SGLang and :class:`~schedulers.ar.engine.ARBatchEngine` run the same
weights.  Every test runs the pipeline of :mod:`tests.sglang_env.pipeline` (ChatML preprocess → thinker →
text relay, and a recorder of the thinker's result when hidden states are asked for) with the thinker's
engine arguments overridden for CPU, and checks that the engine left nothing in ``/dev/shm``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sglang", reason="needs the SGLang venv: python -m tests.sglang_env setup, then ... test")

import torch
import trio

from omnitrio import CompleteMessage, Overloaded, StreamMessage, open_pipeline
from omnitrio.config_loading import load
from omnitrio.errors import StartupError
from omnitrio.pipeline import Pipeline
from schedulers.ar.engine import ARBatchEngine, GenerationRequest
from schedulers.ar.model import build_model
from schedulers.ar.sglang_backend import SGLangScheduler, create_sglang_scheduler
from schedulers.ar.sglang_stages import chatml_prompt
from schedulers.ar.tokenizer import load_tokenizer
from schedulers.simple import SimpleScheduler
from tests.sglang_env.pipeline import pipeline_toml
from tests.sglang_env.tiny_model import save_tiny_llama, tiny_config

pytestmark = [pytest.mark.sglang_engine, pytest.mark.timeout(900)]

SHAPE = {"seed": 7, "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 512}
ENGINE_ON_CPU = [
    'device="cpu"',
    'dtype="float32"',
    'attention_backend="torch_native"',
    'sampling_backend="pytorch"',
    "disable_cuda_graph=true",
    "disable_overlap_schedule=true",
    "mem_fraction_static=0.05",
    'log_level="error"',
]
SHM = Path("/dev/shm")
LEFT_BEHIND = ("sglang_loads_", "sem.mp-")

thinkers: list[SGLangScheduler] = []
thinker_results: list[dict[str, Any]] = []


def create_observed_thinker(model_path: str, **kwargs: Any) -> SGLangScheduler:
    """``create_sglang_scheduler``, kept where the test can reach its engine."""
    thinkers.append(create_sglang_scheduler(model_path, **kwargs))
    return thinkers[-1]


def create_result_recorder() -> SimpleScheduler:
    """The thinker's second terminal: keeps the result data it brought, answers how many rows it had."""

    def record(payload: Any) -> Any:
        thinker_results.append(dict(payload.data))
        payload.data = {"rows": len(payload.data.get("output_token_ids") or ())}
        return payload

    return SimpleScheduler(record)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(directory, **SHAPE)
    return directory


def left_behind() -> set[str]:
    return {name for name in os.listdir(SHM) if name.startswith(LEFT_BEHIND)}


@pytest.fixture
def shm_is_clean() -> Iterator[None]:
    """After the test, /dev/shm holds no SGLang file that was not there before it."""
    before = left_behind()
    thinkers.clear()
    thinker_results.clear()
    yield
    assert left_behind() - before == set()


def overrides(model_dir: Path, *extra: str) -> list[str]:
    return [
        "thinker.factory_path=tests.test_sglang_engine.create_observed_thinker",
        f'thinker.factory.model_path="{model_dir}"',
        *(f"thinker.factory.{arg}" for arg in ENGINE_ON_CPU),
        *extra,
    ]


ONE_AT_A_TIME = "thinker.factory.scheduler_args={stream=true, max_running_requests=1, max_waiting_requests=1}"


@pytest.fixture
async def pipeline(model_dir: Path, shm_is_clean: None, tmp_path: Path) -> AsyncIterator[Pipeline]:
    config = load(pipeline_toml(tmp_path), overrides(model_dir, ONE_AT_A_TIME))
    async with open_pipeline(config, inline=True) as running:
        yield running


@pytest.fixture
async def recorded(model_dir: Path, shm_is_clean: None, tmp_path: Path) -> AsyncIterator[Pipeline]:
    """The pipeline with hidden states asked for and the thinker's result recorded at a second terminal."""
    config = load(pipeline_toml(tmp_path, recorder=f"{__name__}.create_result_recorder"), overrides(model_dir))
    async with open_pipeline(config, inline=True) as running:
        yield running


def chat(text: str, max_tokens: int) -> dict[str, Any]:
    return {"task": "chat", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}


def cpu_engine_greedy(inputs: dict[str, Any], max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """The project's CPU engine on the same weights: greedy ids and hidden states, eos included."""
    tokenizer = load_tokenizer()
    engine = ARBatchEngine(build_model(tiny_config(tokenizer, **SHAPE)), max_running_requests=1)
    request = GenerationRequest(
        request_id="oracle",
        prompt_ids=tokenizer.encode(chatml_prompt(inputs)),
        max_new_tokens=max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        return_hidden_states=True,
    )
    engine.add(request)
    while engine.has_work:
        events, _ = engine.step()
        for event in events:
            if event.finish_reason is not None:
                assert event.hidden_states is not None
                return list(event.output_ids), event.hidden_states
    raise AssertionError("the CPU engine finished without a last event")


async def test_thinker_streams_text_and_its_result_carries_tokens_and_hidden_states(recorded: Pipeline) -> None:
    inputs = chat("Say hello to the quick brown fox.", max_tokens=24)
    deltas: list[str] = []
    results: dict[str, Any] = {}
    async with recorded.stream("voice", inputs) as messages:
        async for message in messages:
            match message:
                case StreamMessage(modality="text", chunk=chunk):
                    deltas.append(chunk)
                case CompleteMessage(from_stage=stage, result=result):
                    results[stage] = result
    ids, hidden = cpu_engine_greedy(inputs, 24)
    assert len(deltas) > 1
    assert "".join(deltas) == results["detokenize"]["text"] == load_tokenizer().decode(ids)
    (result,) = thinker_results
    assert result["output_token_ids"] == ids and results["hidden"] == {"rows": len(ids)}
    assert result["hidden_states"].shape == hidden.shape == (len(ids), SHAPE["dim"])
    torch.testing.assert_close(result["hidden_states"], hidden, rtol=1e-4, atol=1e-4)


async def test_one_running_one_waiting_more_is_overloaded_and_abort_frees_the_engine(pipeline: Pipeline) -> None:
    (thinker,) = thinkers
    manager = thinker.engine.tokenizer_manager  # sglang 0.5.23's Engine has no abort_request of its own
    aborted: list[str] = []
    abort_request = manager.abort_request

    def spy(rid: str = "", abort_all: bool = False) -> Any:
        aborted.append(rid)
        return abort_request(rid=rid, abort_all=abort_all)

    manager.abort_request = spy
    waiting: list[Any] = []

    async def submit_waiting() -> None:
        waiting.append(await pipeline.submit("waiting", chat("hi", max_tokens=4)))

    async with trio.open_nursery() as nursery:
        async with pipeline.stream("long", chat("Tell me a long story.", max_tokens=400)) as messages:
            async for message in messages:
                assert isinstance(message, StreamMessage)
                break
            # max_running_requests=1, max_waiting_requests=1: "long" runs, "waiting" waits, a third is refused.
            nursery.start_soon(submit_waiting)
            with trio.fail_after(30):
                while thinker.inbox.qsize() or not thinker.num_waiting:
                    await trio.sleep(0.05)
            with pytest.raises(Overloaded, match="max_waiting_requests=1"):
                await pipeline.submit("refused", chat("hi", max_tokens=4))
            assert waiting == []
        # Leaving the stream aborted "long"; "waiting" runs only once the engine let it go.
        with trio.fail_after(120):
            while not waiting:
                await trio.sleep(0.05)
    assert waiting[0]["finish_reason"] in ("length", "stop")
    assert set(aborted) == {"long"}  # the adapter's call, and SGLang's own when the stream is cancelled
    assert "long" not in manager.rid_to_state


async def test_an_engine_that_cannot_start_is_a_startup_error_naming_the_stage(
    tmp_path: Path, shm_is_clean: None
) -> None:
    config = load(pipeline_toml(tmp_path), overrides(tmp_path / "no-model-here"))
    with pytest.raises(StartupError, match=r"stage 'thinker'.*no-model-here"):
        async with open_pipeline(config, inline=True):
            pass


async def test_the_pipeline_checks_with_sglang_installed(tmp_path: Path) -> None:
    from omnitrio.cli import main

    assert main(["check", str(pipeline_toml(tmp_path))]) == 0
