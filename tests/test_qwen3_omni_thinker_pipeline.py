"""The thinker and the text decode stage served by the runtime: words stream to the caller as they decode."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch

from omnitrio import CompleteMessage, StreamMessage, open_pipeline
from omnitrio.config_loading import from_dict
from omnitrio.pipeline import Pipeline
from schedulers.qwen3_omni.tiny import write_checkpoint
from toys.qwen3_omni_reference import load_reference_model, processor_inputs, reference_processor
from toys.qwen3_omni_thinker import thinker_payload

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("qwen3-omni-tiny"), size="tiny")


@pytest.fixture
async def pipeline(checkpoint: Path) -> AsyncIterator[Pipeline]:
    model_dir = str(checkpoint)
    config = from_dict(
        {
            "name": "qwen3-omni-thinker",
            "stages": [
                {
                    "name": "thinker",
                    "factory_path": "schedulers.qwen3_omni.thinker.stage.create_thinker_stage",
                    "factory": {"model_dir": model_dir, "max_new_tokens": 32},
                    "next": "decode",
                    "stream_to": ["decode"],
                },
                {
                    "name": "decode",
                    "factory_path": "schedulers.qwen3_omni.thinker.text_decode.create_decode_stage",
                    "factory": {"model_dir": model_dir},
                    "terminal": True,
                    "can_accept_stream_before_payload": True,
                },
            ],
        }
    )
    async with open_pipeline(config, inline=True) as running:
        yield running


async def test_text_answer_streams_the_decoded_greedy_answer_of_generate(pipeline: Pipeline, checkpoint: Path) -> None:
    torch.set_num_threads(1)
    reference, processor = load_reference_model(checkpoint), reference_processor(checkpoint)
    messages = [{"role": "user", "content": "hello there, how are you today?"}]
    inputs = processor_inputs(processor, messages)
    with torch.inference_mode():
        expected = reference.generate(
            **inputs,
            return_audio=False,
            thinker_max_new_tokens=10,
            thinker_eos_token_id=reference.config.im_end_token_id,
            thinker_do_sample=False,
        )[0, inputs["input_ids"].shape[1] :]
    text = processor.tokenizer.decode(expected, skip_special_tokens=True)

    deltas: list[str] = []
    result: Any = None
    async with pipeline.stream("r", thinker_payload(reference, inputs, max_new_tokens=10)) as stream:
        async for message in stream:
            match message:
                case StreamMessage(modality="text", chunk=chunk):
                    deltas.append(chunk)
                case CompleteMessage(result=done):
                    result = done
    assert text and "".join(deltas) == text == result["text"]
    assert result["usage"]["completion_tokens"] == len(expected)
    assert result["finish_reason"] == ("stop" if expected[-1] == reference.config.im_end_token_id else "length")
