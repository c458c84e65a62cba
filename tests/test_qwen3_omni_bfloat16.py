"""configs/qwen3-omni.toml served in bfloat16 on the CPU answers what transformers' bfloat16 ``generate`` answers.

Every model stage is placed by the one flag (``load(..., dtype="bfloat16")``, what ``serve --dtype
bfloat16`` does): preprocess, the audio and image encoders, the thinker, the talker with its code
predictor and code2wav.  The reference is ``Qwen3OmniMoeForConditionalGeneration.from_pretrained(dtype=
torch.bfloat16)`` on the same tiny checkpoint, greedy (thinker and talker).  What is asserted, and why:

* **The thinker's ids, hence the transcript, and the number of codec frames: exactly generate's.**  Greedy
  margins in bfloat16 are tiny (one step of the text prompt ties its top two logits), so this holds only
  because a lone request runs transformers' own modules on the shapes ``generate`` runs them on and
  rounds exactly as it does; measured on this checkpoint: 4 prompts x 48 tokens, every id equal.  It is
  the check that tells a stage left in float32: the thinker in float32 departs at the 5th token of the
  text prompt, the image encoder at the 3rd of the image prompt.  (Should a future engine reshape the
  computation, say attention over a padded KV batch, this is the test that says so; the weaker check to
  fall back on is "equal up to the first step whose reference margin is under one bfloat16 step".)
* **pcm16: generate's length, and >= 35 dB SNR against its waveform.**  code2wav streams in windows on a
  KV cache while ``generate`` decodes whole: equal in float32 up to an LSB (>= 80 dB), but in bfloat16
  the window shapes round differently, measured 43.2 dB at worst (tone; text decodes bit-exact).  One
  wrong code among the 23 frames costs far more (measured 15-26 dB, 28 dB for a float32 talker), so
  35 dB tells a rounding difference from a different code.
* **code2wav holds from_pretrained's bfloat16 code2wav, tensor for tensor.**  The pcm cannot tell a
  code2wav left in float32 (37 dB against the bfloat16 decode); its weights can.
* Serving on the CPU never initialises CUDA.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from omnitrio import open_pipeline
from omnitrio.config import PipelineConfig
from omnitrio.config_loading import load
from schedulers.qwen3_omni.code2wav.stage import create_code2wav_stage
from schedulers.qwen3_omni.tiny import patch_loaded_model
from tests.pipelines import streamed_answer
from tests.qwen3_omni_tiny import tiny_qwen3_omni_checkpoint  # noqa: F401  (fixture tiny_qwen3_omni)
from tests.test_qwen3_omni_pipeline import (  # the float32 test's prompts, lengths and reading
    CONFIG,
    GREEDY_TALKER,
    PROMPTS,
    TALKER_TOKENS,
    THINKER_TOKENS,
)
from toys.qwen3_omni_reference import (
    ReferenceOutput,
    reference_generate,
    reference_processor,
    sample_messages,
)
from toys.qwen3_omni_requests import chat_inputs, on_pcm_grid, pcm16, snr_db

pytestmark = pytest.mark.timeout(600)

MIN_SNR_DB = 35.0  # the module docstring says why


@pytest.fixture(scope="module")
def checkpoint(tiny_qwen3_omni: Path) -> Path:
    return tiny_qwen3_omni


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> Any:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.bfloat16)
    patch_loaded_model(model)
    return model.eval()


@pytest.fixture(scope="module")
def messages() -> dict[str, list[dict[str, Any]]]:
    return {name: on_pcm_grid(sample_messages()[name]) for name in PROMPTS}


@pytest.fixture(scope="module")
def expected(checkpoint: Path, reference: Any, messages: Any) -> dict[str, tuple[ReferenceOutput, str]]:
    processor = reference_processor(checkpoint)
    out = {}
    for name in PROMPTS:
        answer = reference_generate(
            reference, processor, messages[name], max_new_tokens=THINKER_TOKENS, talker_max_new_tokens=TALKER_TOKENS
        )
        out[name] = (answer, processor.tokenizer.decode(answer.token_ids, skip_special_tokens=True))
    return out


@pytest.fixture(scope="module")
def config(checkpoint: Path) -> PipelineConfig:
    return load(CONFIG, GREEDY_TALKER, model=checkpoint, dtype="bfloat16")


async def test_served_in_bfloat16_it_speaks_what_generate_speaks_in_bfloat16(
    config: PipelineConfig, messages: Any, expected: Any
) -> None:
    async with open_pipeline(config, inline=True) as pipeline:
        for prompt in PROMPTS:
            reference, transcript = expected[prompt]
            got = await streamed_answer(pipeline, prompt, chat_inputs(messages[prompt], max_tokens=THINKER_TOKENS))
            results, pcm = got["results"], got["pcm"]
            assert results["decode"]["token_ids"] == reference.token_ids, prompt
            assert results["decode"]["transcript"] == transcript
            assert results["code2wav"]["num_frames"] == reference.codes.shape[1], prompt
            want = pcm16(reference.waveform)
            assert len(pcm) == len(want) and snr_db(want, pcm) >= MIN_SNR_DB, prompt
    assert not torch.cuda.is_initialized()  # every stage on the CPU: nothing touched CUDA


def test_code2wav_in_bfloat16_holds_from_pretrained_bfloat16_code2wav(config: PipelineConfig, reference: Any) -> None:
    stage = create_code2wav_stage(**config.stage("code2wav").factory.to_kwargs())
    ours = dict([*stage.runner.model.named_parameters(), *stage.runner.model.named_buffers()])
    theirs = dict([*reference.code2wav.named_parameters(), *reference.code2wav.named_buffers()])
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert ours[name].dtype == tensor.dtype and torch.equal(ours[name], tensor), name
