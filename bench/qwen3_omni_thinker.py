"""Decode throughput of the Qwen3-Omni thinker engine at batch 1, 4 and 8, beside transformers' ``generate``.

For each checkpoint size (random ``tiny`` and ``medium`` ones, :mod:`schedulers.qwen3_omni.tiny`), ``batch``
requests with random text prompts of ``--prompt`` tokens are added to one
:class:`~schedulers.engine.decoder.Decoder` at once and decoded greedily, ``--tokens`` each
(eos ignored); tokens per second is every generated token over the wall time of all steps (prefills
included).  ``generate`` (thinker only, batch 1, one request after the other) is the reference line.
One torch thread.  Rounds alternate and medians are kept; on a shared machine the figures are loaded.

Run: ``.venv/bin/python bench/qwen3_omni_thinker.py [--quick]``; figures go to
``bench/results/qwen3_omni_thinker.json``.  Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from schedulers.engine.decoder import Decoder, DecoderRequest  # noqa: E402
from schedulers.engine.sampling import Sampler, SamplingDefaults  # noqa: E402
from schedulers.qwen3_omni.thinker.model import ThinkerLM  # noqa: E402
from schedulers.qwen3_omni.tiny import write_checkpoint  # noqa: E402
from toys.qwen3_omni_reference import load_reference_model  # noqa: E402
from toys.qwen3_omni_thinker import thinker_scheduler  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "qwen3_omni_thinker.json"


def _prompts(lm: ThinkerLM, count: int, length: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (length,), generator=generator) for _ in range(count)]


def engine_tokens_per_second(lm: ThinkerLM, prompts: list[torch.Tensor], tokens: int) -> float:
    engine = Decoder(lm, max_running=len(prompts))
    greedy = Sampler.build(SamplingDefaults(), 0.0)
    start = time.perf_counter()
    for i, ids in enumerate(prompts):
        engine.add(DecoderRequest(f"r{i}", lm.prompt_inputs(ids), tokens, greedy, None))
    while engine.has_work:
        engine.step()
    return len(prompts) * tokens / (time.perf_counter() - start)


def generate_tokens_per_second(model: Any, prompts: list[torch.Tensor], tokens: int) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        for ids in prompts:
            model.generate(
                ids[None],
                return_audio=False,
                thinker_max_new_tokens=tokens,
                thinker_min_new_tokens=tokens,
                thinker_do_sample=False,
            )
    return len(prompts) * tokens / (time.perf_counter() - start)


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "torch_threads": 1,
        "rounds": args.rounds,
        "prompt_tokens": args.prompt,
        "new_tokens": args.tokens,
        "load_avg_before": round(os.getloadavg()[0], 2),
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            model_dir = write_checkpoint(Path(tmp) / size, size=size)
            lm = thinker_scheduler(model_dir).engine.lm
            model = load_reference_model(model_dir)
            for batch in args.batch:
                prompts = _prompts(lm, batch, args.prompt, seed=batch)
                ours, theirs = [], []
                for _ in range(args.rounds):
                    ours.append(engine_tokens_per_second(lm, prompts, args.tokens))
                    theirs.append(generate_tokens_per_second(model, prompts, args.tokens))
                row = {
                    "size": size,
                    "batch": batch,
                    "engine_tok_s": round(statistics.median(ours), 1),
                    "generate_sequential_tok_s": round(statistics.median(theirs), 1),
                }
                row["ratio"] = round(row["engine_tok_s"] / row["generate_sequential_tok_s"], 2)
                results["runs"].append(row)
                print(
                    f"{size:6} batch {batch}: engine {row['engine_tok_s']:7.1f} tok/s   "
                    f"generate (sequential) {row['generate_sequential_tok_s']:7.1f} tok/s   x{row['ratio']}",
                    flush=True,
                )
    results["load_avg_after"] = round(os.getloadavg()[0], 2)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "medium"])
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 4, 8])
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round, 16 tokens (proves the bench runs)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.tokens = 1, 16
    results = run(args)
    results["quick"] = args.quick
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
