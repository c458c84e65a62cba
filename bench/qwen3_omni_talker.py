"""Talker stage throughput (codec frames per second) at 1, 4 and 8 concurrent requests, tiny and medium.

For each size, a random checkpoint is written (schedulers/qwen3_omni/tiny.py) and transformers'
``generate`` produces one thinker stream per request (toys/qwen3_omni_talker_feed.py); the talker stage
(:class:`schedulers.qwen3_omni.talker.stage.TalkerScheduler`, greedy, ``min_new_tokens = max_new_tokens`` so
every request speaks exactly ``--frames`` + 1 talker tokens) is then fed all streams at once and timed
from the first chunk to the last result; with ``--pace-ms`` each request's thinker tokens come one every
that many milliseconds instead, the requests' starts staggered, as a thinker streams them, so a request
whose next token has not come sits the talker's steps out (``frames_per_busy_s`` is then the figure of
the talker's own cost: frames over the CPU time its steps took).  The split of the wall time between the
talker's forwards and the code predictor's is measured in the same run (the code predictor runs inside
the stage: the figure says what a stage of its own would have to beat after paying a stream hop each way
per frame).

Run: ``.venv/bin/python bench/qwen3_omni_talker.py [--sizes tiny medium] [--batches 1 4 8] [--frames 64]
[--pace-ms 15]``
(``--quick``: tiny only, 16 frames).  Figures go to ``bench/results/qwen3_omni_talker.json``.  Not a
test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.qwen3_omni_engine_ab import Timed, serve_streams  # noqa: E402
from omnitrio.contract import IncomingMessage, OmniRequest, StagePayload  # noqa: E402
from schedulers.qwen3_omni.handoffs import TalkerPrompt, TalkerToken, ThinkerResult  # noqa: E402
from schedulers.qwen3_omni.talker.codec_sampling import TalkerSampling  # noqa: E402
from schedulers.qwen3_omni.talker.model import TalkerModel  # noqa: E402
from schedulers.qwen3_omni.talker.stage import TalkerScheduler  # noqa: E402
from schedulers.qwen3_omni.tiny import write_checkpoint  # noqa: E402
from toys.qwen3_omni_reference import load_reference_model, processor_inputs, reference_processor  # noqa: E402
from toys.qwen3_omni_talker_feed import reference_run  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "qwen3_omni_talker.json"


def streams(model_dir: Path, count: int) -> list[list[dict[str, Any]]]:
    model, processor = load_reference_model(model_dir), reference_processor(model_dir)
    eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = []
    for index in range(count):
        messages = [{"role": "user", "content": f"request number {index}, say something long"}]
        ref = reference_run(
            model,
            dict(processor_inputs(processor, messages)),
            speaker="ethan",
            thinker_max_new_tokens=24,
            talker_max_new_tokens=4,
            eos_token_id=eos,
        )
        out.append(ref.chunks)
    return out


def _final(rid: str) -> IncomingMessage:
    return IncomingMessage(rid, "new_request", StagePayload(rid, OmniRequest(), ThinkerResult((), 0, "stop", True)))


def measure(
    talker: TalkerModel, chunks: list[list[TalkerPrompt | TalkerToken]], frames: int, pace_s: float = 0.0
) -> dict[str, float]:
    sampling = TalkerSampling(do_sample=False, max_new_tokens=frames + 1, min_new_tokens=frames + 1)
    scheduler = TalkerScheduler(talker, sampling=sampling)
    forward, predict = Timed(talker.forward), Timed(scheduler.predictor.frames)
    busy = Timed(scheduler._step, time.thread_time)
    talker.forward, scheduler.predictor.frames = forward, predict  # type: ignore[method-assign]
    scheduler._step = busy  # type: ignore[method-assign]
    total_frames, wall = serve_streams(scheduler, chunks, _final, pace_s)
    del talker.forward
    return {
        "frames": total_frames,
        "wall_s": round(wall, 3),
        "frames_per_s": round(total_frames / wall, 1),
        "frames_per_busy_s": round(total_frames / busy.seconds, 1),
        "talker_forward_share": round(forward.seconds / wall, 3),
        "code_predictor_share": round(predict.seconds / wall, 3),
        "code_predictor_ms_per_step": round(1000 * predict.seconds / max(len(scheduler.batch_sizes), 1), 3),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "torch_threads": 1,
        "frames_per_request": args.frames,
        "pace_ms": args.pace_ms,
        "load_avg_before": round(os.getloadavg()[0], 2),
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            model_dir = write_checkpoint(Path(tmp) / size, size=size)
            talker = TalkerModel.from_checkpoint(model_dir)
            chunks = streams(model_dir, max(args.batches))
            measure(talker, chunks[:1], 4)  # warm-up: first calls allocate
            for batch in args.batches:
                row = {
                    "size": size,
                    "batch": batch,
                    **measure(talker, chunks[:batch], args.frames, args.pace_ms / 1000),
                }
                results["runs"].append(row)
                print(json.dumps(row), flush=True)
    results["load_avg_after"] = round(os.getloadavg()[0], 2)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "medium"], choices=["tiny", "medium"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4, 8])
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument(
        "--pace-ms", type=float, default=0.0, help="ms between a request's thinker tokens (0: all at once)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny only, 16 frames; figures not saved")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.frames = ["tiny"], 16
    results = run(args)
    if not args.quick:
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
