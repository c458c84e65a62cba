"""Qwen2.5-Omni served (configs/qwen2.5-omni.toml, one process per stage) beside transformers' ``generate``.

For each checkpoint size (random weights, schedulers/qwen2_5_omni/tiny.py):
``Qwen2_5OmniForConditionalGeneration.generate(return_audio=True)`` runs the prompts one after another
(batch 1; it is not streaming, so its time to first audio is its whole time), then the pipeline answers
``c`` concurrent requests for each ``c`` of ``--concurrency``: time to first audio (submit → first pcm
chunk) and audio seconds produced per wall second.  Both greedy (thinker ``temperature`` 0, talker
``talker.factory.do_sample=false`` / ``talker_do_sample=False``), the same speaker and seed, the same
prompts (text, an audio clip, an image, in turn, under the model's system prompt), the same token caps, every
answer exactly ``--frames`` codes on both sides (``talker_min_new_tokens``: a random talker ends early),
one torch thread per process.  ``--stream``: the requests' ``stream`` flag — ``true``, token2wav's
streaming decode (first audio after the first chunk); ``false``, one whole decode once the codes end; both
(the default) labels the rows ``stream``/``whole``.  Also: the pipeline's start-up until every stage
process answers health.

Run: ``.venv/bin/python bench/qwen2_5_omni.py [--sizes tiny medium] [--concurrency 1 4 8] [--stream both]``
(``--quick``: tiny only, 1 and 4 requests, short answers; ``--set STAGE.factory.KEY=VALUE``: a config
override, as serve's).  Prints a table and writes
``bench/results/qwen2_5_omni.json`` with the load average before and after.  Not a test: nothing is
asserted; the issue's targets are shown.  On a GPU: ``--device cuda`` places every model stage there
(serve's flag) and ``generate`` too; ``bench/gpu/omni.sh`` runs it with the equality tests on CUDA.  The
harness is :mod:`bench.omni_speech`'s; transformers is driven as ``tests/qwen2_5_omni_reference.py``
drives it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.omni_speech import Inputs, arguments, begin, finish, quick, run_sizes, time_generate  # noqa: E402
from omnitrio.config import PipelineConfig  # noqa: E402
from omnitrio.config_loading import load  # noqa: E402
from schedulers.qwen2_5_omni.front.preprocess import SYSTEM_PROMPT  # noqa: E402
from schedulers.qwen2_5_omni.tiny import write_checkpoint  # noqa: E402
from toys.qwen2_5_omni_reference import clip, pcm16, picture, png, reference_inputs, reference_processor, wav  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "qwen2_5_omni.json"
CONFIG = ROOT / "configs" / "qwen2.5-omni.toml"
SPEAKER = "Chelsie"
SEED = 0  # token2wav's noise: torch.manual_seed before generate, the request's seed when served
GREEDY = {"thinker_do_sample": False, "talker_do_sample": False}  # the pipeline: temperature 0, the talker set
STREAMS = {"true": {"stream": True}, "false": {"whole": False}, "both": {"stream": True, "whole": False}}


def prompts() -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Text, an audio clip, an image: (transformers' chat messages, the same as a chat request's messages)."""
    sound, image = clip(440, 1.2), picture(4)
    ask = {"type": "text", "text": "What do you make of it?"}
    parts = [
        ([{"type": "text", "text": "Tell me about the sea."}],) * 2,
        (
            [{"type": "audio", "audio": pcm16(sound)}, ask],  # what the WAV decodes to
            [{"type": "input_audio", "input_audio": {"data": wav(sound), "format": "wav"}}, ask],
        ),
        ([{"type": "image", "image": image}, ask], [{"type": "image_url", "image_url": {"url": png(image)}}, ask]),
    ]
    system = {"role": "system", "content": SYSTEM_PROMPT}
    return [
        ([system, {"role": "user", "content": ours}], [system, {"role": "user", "content": served}])
        for ours, served in parts
    ]


def run_generate(model_dir: Path, count: int, tokens: int, frames: int, device: str, dtype: str) -> dict[str, Any]:
    """``count`` greedy ``generate(return_audio=True)`` calls in turn: seconds each, audio seconds each."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    model = model.to(device).eval()
    processor = reference_processor(model_dir)
    messages = [ours for ours, _ in prompts()]

    def generate(i: int, tokens: int, frames: int) -> torch.Tensor | None:
        inputs = reference_inputs(processor, messages[i % len(messages)])
        if "pixel_values" in inputs:  # transformers' generate crashes on pixel_values, not on this name
            inputs["thinker_pixel_values"] = inputs.pop("pixel_values")
        inputs = {k: v.to(device, model.dtype) if v.is_floating_point() else v.to(device) for k, v in inputs.items()}
        torch.manual_seed(SEED)
        with torch.inference_mode():
            caps = {"thinker_max_new_tokens": tokens, "talker_max_new_tokens": frames, "talker_min_new_tokens": frames}
            _, wav = model.generate(**inputs, **caps, **GREEDY, speaker=SPEAKER)
        return wav

    return time_generate(generate, count, tokens, frames, device)


def pipeline_config(model_dir: Path, frames: int, device: str, dtype: str, extra: Sequence[str]) -> PipelineConfig:
    overrides = ["talker.factory.do_sample=false", f"talker.factory.max_new_tokens={frames}"]
    # every answer speaks exactly `frames` codes on both sides: a random talker's own end comes early
    overrides += [f"talker.factory.min_new_tokens={frames}", *extra]
    return load(CONFIG, overrides, model=model_dir, device=device, dtype=dtype)


def chat_inputs(messages: list[dict[str, Any]], *, max_tokens: int, stream: bool) -> dict[str, Any]:
    """The pipeline's raw chat inputs for a spoken, greedy answer."""
    return {
        "task": "chat",
        "messages": messages,
        "modalities": ["text", "audio"],
        "audio": {"voice": SPEAKER, "format": "pcm16"},
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "seed": SEED,
        "stream": stream,
    }


def main() -> None:
    parser = arguments(__doc__ or "", RESULTS)
    parser.add_argument("--stream", choices=list(STREAMS), default="both", help="the requests' stream flag")
    args = quick(parser.parse_args())
    torch.set_num_threads(1)
    results = begin(args)
    results["stream"] = args.stream
    served = [theirs for _, theirs in prompts()]

    def variant(stream: bool) -> Inputs:
        return lambda i: chat_inputs(served[i % len(served)], max_tokens=args.tokens, stream=stream)

    variants = {name: variant(stream) for name, stream in STREAMS[args.stream].items()}
    warm = chat_inputs(served[0], max_tokens=2, stream=True)
    run_sizes(args, results, write_checkpoint, run_generate, pipeline_config, variants, warm)
    finish(results, args.out)


if __name__ == "__main__":
    main()
