"""Decode throughput of the AR engine against the hand-written loop, at batch 1 and 16.

The engine (:class:`schedulers.ar.engine.ARBatchEngine`: continuous batching, a KV cache per slot,
per-step admission) and :func:`schedulers.ar.reference.handwritten_decode` (a static batch, one
contiguous cache, no scheduling) decode the same random prompts with the same tiny Llama.  Rounds
alternate the two and the medians are compared (see :func:`measure_tokens_per_second`): one run of
each on a shared machine is mostly noise.  The target is a ratio of at least 0.9.

Run: ``.venv/bin/python bench/ar_tokens.py [--rounds 5] [--dtype float32 bfloat16] [--threads 1]``.
Figures go to ``bench/results/ar_tokens.json``.  Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from schedulers.ar.reference import measure_tokens_per_second  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "ar_tokens.json"
TARGET_RATIO = 0.9


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "torch_threads": args.threads,
        "rounds": args.rounds,
        "max_new_tokens": args.tokens,
        "load_avg_before": round(os.getloadavg()[0], 2),
        "target_ratio": TARGET_RATIO,
        "runs": [],
    }
    for dtype_name in args.dtype:
        for batch in args.batch:
            figures = measure_tokens_per_second(
                batch, dtype=getattr(torch, dtype_name), max_new_tokens=args.tokens, rounds=args.rounds
            )
            row = {"dtype": dtype_name, "batch": batch, **{k: round(v, 3) for k, v in figures.items()}}
            row["meets_target"] = row["ratio"] >= TARGET_RATIO
            results["runs"].append(row)
            print(
                f"{dtype_name:9} batch {batch:2}: engine {row['engine']:7.0f} tok/s  "
                f"hand-written {row['handwritten']:7.0f} tok/s  ratio {row['ratio']:.2f}",
                flush=True,
            )
    results["load_avg_after"] = round(os.getloadavg()[0], 2)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    results = run(parser.parse_args())
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
