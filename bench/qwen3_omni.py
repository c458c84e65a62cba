"""Qwen3-Omni served (configs/qwen3-omni.toml, one process per stage) beside transformers' ``generate``.

For each checkpoint size (random weights, schedulers/qwen3_omni/tiny.py): ``generate(return_audio=True)``
runs the prompts one after another (batch 1; it is not streaming, so its time to first audio is its whole
time), then the pipeline answers ``c`` concurrent requests for each ``c`` of ``--concurrency``: time to
first audio (submit → first pcm chunk) and audio seconds produced per wall second.  Both greedy (thinker
and talker), same prompts (text, an audio clip, an image, in turn), same token caps, one torch thread per
process.  Also: the pipeline's start-up until every stage process answers health.

Run: ``.venv/bin/python bench/qwen3_omni.py [--sizes tiny medium] [--concurrency 1 4 8]`` (``--quick``:
tiny only, 1 and 4 requests, short answers).  Prints a table and writes ``bench/results/qwen3_omni.json``
with the load average before and after.  Not a test: nothing is asserted; the issue's targets are shown.
On a GPU: ``--device cuda --dtype bfloat16`` places every model stage there (serve's flags);
``bench/gpu/omni.sh`` runs it with the equality tests on CUDA.  The harness is :mod:`bench.omni_speech`'s.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.omni_speech import arguments, begin, finish, quick, run_sizes, time_generate  # noqa: E402
from omnitrio.config import PipelineConfig  # noqa: E402
from omnitrio.config_loading import load  # noqa: E402
from schedulers.qwen3_omni.tiny import write_checkpoint  # noqa: E402
from toys.qwen3_omni_reference import (  # noqa: E402
    load_reference_model,
    processor_inputs,
    reference_processor,
    sample_messages,
)
from toys.qwen3_omni_requests import chat_inputs, on_pcm_grid  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "qwen3_omni.json"
CONFIG = ROOT / "configs" / "qwen3-omni.toml"
PROMPTS = ("text", "tone", "image")


def run_generate(model_dir: Path, count: int, tokens: int, frames: int, device: str, dtype: str) -> dict[str, Any]:
    """``count`` greedy ``generate(return_audio=True)`` calls in turn: seconds each, audio seconds each."""
    model = load_reference_model(model_dir).to(device, getattr(torch, dtype))
    processor = reference_processor(model_dir)
    eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    messages = {name: on_pcm_grid(m) for name, m in sample_messages().items()}

    def generate(i: int, tokens: int, frames: int) -> torch.Tensor | None:
        inputs = processor_inputs(processor, messages[PROMPTS[i % 3]]).to(device)
        with torch.inference_mode():
            _, wav = model.generate(
                **inputs,
                speaker="ethan",
                return_audio=True,
                thinker_max_new_tokens=tokens,
                thinker_eos_token_id=eos,
                thinker_do_sample=False,
                talker_do_sample=False,
                talker_max_new_tokens=frames,
                talker_min_new_tokens=2,
            )
        return wav

    return time_generate(generate, count, tokens, frames, device)


def pipeline_config(model_dir: Path, frames: int, device: str, dtype: str, extra: Sequence[str]) -> PipelineConfig:
    overrides = ["talker.factory.do_sample=false", f"talker.factory.max_new_tokens={frames}"]
    overrides += ["talker.factory.min_new_tokens=2", *extra]  # min: as toys.qwen3_omni_reference passes generate
    return load(CONFIG, overrides, model=model_dir, device=device, dtype=dtype)


def main() -> None:
    args = quick(arguments(__doc__ or "", RESULTS).parse_args())
    torch.set_num_threads(1)
    results = begin(args)
    messages = {name: on_pcm_grid(m) for name, m in sample_messages().items()}

    def inputs(i: int) -> dict[str, Any]:
        return chat_inputs(messages[PROMPTS[i % 3]], max_tokens=args.tokens)

    warm = chat_inputs(messages["text"], max_tokens=2)
    run_sizes(args, results, write_checkpoint, run_generate, pipeline_config, {"": inputs}, warm)
    finish(results, args.out)


if __name__ == "__main__":
    main()
