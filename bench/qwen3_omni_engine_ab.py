"""Before and after the engine layer, interleaved in one run: the Qwen3-Omni talker and thinker, 1 and 8 requests.

"Before" and "after" are two source trees (``--before``, default ``/work/wt/base``; ``--after``, default
this tree).  Each side is one worker process whose ``sys.path`` starts with its tree, so it runs its own
schedulers on the same random checkpoint (written once per size by this tree's
:mod:`schedulers.qwen3_omni.tiny`) and its own thinker streams (transformers' ``generate`` on that
checkpoint, through the tree's ``toys/qwen3_omni_talker_feed.py``).  Both workers load once, then the
parent asks them for one figure at a time, alternately (``before, after`` then ``after, before`` for the
next figure or round): the two figures of a pair are seconds apart, so a change of the machine's speed
(this one's varies by tens of percent from one minute to the next, with nothing else running) touches
both alike.  Each figure's ratio is the median over ``--rounds`` pairs of after / before; its sides'
figures are the medians of their runs.

What is measured, one torch thread:

* **thinker**: the engine's tokens per second (wall, and per CPU second of its thread) for ``batch``
  requests of ``--prompt`` random tokens decoded greedily, ``--tokens`` each (eos ignored), prefills
  included;
* **talker**, frames per second (wall) and frames per CPU second of the talker's own steps (busy):
  ``burst`` feeds every request's thinker stream at once (nobody ever sits a step out); ``paced`` feeds
  each request's thinker tokens one every ``--pace-ms`` milliseconds (default: slower than the size's
  talker steps, as a larger thinker streaming its answer is), the requests' starts staggered: a request
  whose next token has not come sits the talker's steps out while the others step, which is where a KV
  batch that rebuilds itself at every change of the stepping set pays.  Paced wall figures are bound by
  the feed while the text lasts; the busy figure is the talker's own cost.

Run: ``.venv/bin/python bench/qwen3_omni_engine_ab.py [--sizes tiny medium] [--rounds 8]`` (``--quick``:
tiny only, two rounds, few frames; proves the bench runs, figures not saved).  Figures go to
``bench/results/qwen3_omni_engine_ab.json`` with the load average beside each round.  Not a test:
nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "qwen3_omni_engine_ab.json"
BEFORE = Path("/work/wt/base")
PACE_MS = {"tiny": 15.0, "medium": 120.0}  # a thinker token per request, slower than that size's talker steps


class Timed:
    """Wraps a callable and sums its time on ``clock`` (wall by default; ``time.thread_time``: the CPU time
    of the thread that calls it, which a loaded machine's other processes do not add to)."""

    def __init__(self, fn: Any, clock: Callable[[], float] = time.perf_counter) -> None:
        self.fn, self.clock, self.seconds = fn, clock, 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = self.clock()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += self.clock() - start


def feed(inbox: Any, streams: Sequence[Sequence[Any]], final: Callable[[str], Any], pace_s: float) -> None:
    """Put each request's thinker stream on ``inbox`` as a thinker stage streams it.

    ``pace_s == 0``: every message at once.  Otherwise request ``n``'s chunk ``k`` is due at
    ``(n / len(streams) + k) * pace_s`` after the start; its ``stream_done`` and ``new_request``
    (``final(rid)``) follow its last chunk.  Blocks until the last message is put."""
    from omnitrio.contract import IncomingMessage, StreamItem

    due: list[tuple[float, int, list[Any]]] = []
    for n, stream in enumerate(streams):
        rid, offset = f"r{n}", n / len(streams)
        for k, chunk in enumerate(stream):
            message = IncomingMessage(rid, "stream_chunk", StreamItem(k, chunk, "thinker"))
            due.append(((offset + k) * pace_s, n, [message]))
        ending = [IncomingMessage(rid, "stream_done", "thinker"), final(rid)]
        due.append(((offset + len(stream) - 1) * pace_s, n, ending))
    due.sort(key=lambda item: (item[0], item[1]))
    start = time.perf_counter()
    for at, _, messages in due:
        wait = start + at - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        for message in messages:
            inbox.put(message)


def serve_streams(
    scheduler: Any, streams: Sequence[Sequence[Any]], final: Callable[[str], Any], pace_s: float
) -> tuple[int, float]:
    """Run a talker ``scheduler`` on its own thread, :func:`feed` it ``streams``, and wait for every result.

    Returns the frames its results count and the wall seconds from the first message to the last result."""
    thread = threading.Thread(target=scheduler.start, name="talker-bench")
    thread.start()
    start = time.perf_counter()
    feeder = threading.Thread(target=feed, args=(scheduler.inbox, streams, final, pace_s), name="feed")
    feeder.start()
    done = frames = 0
    while done < len(streams):
        out = scheduler.outbox.get(timeout=600)
        if out.type == "error":
            raise RuntimeError(f"talker failed request {out.request_id}: {out.data}")
        if out.type == "result":
            done += 1
            data = out.data.data
            frames += int(data["num_frames"] if isinstance(data, dict) else data.num_frames)
    wall = time.perf_counter() - start
    feeder.join()
    scheduler.stop()
    thread.join()
    return frames, wall


# -- the worker: runs inside one tree -------------------------------------------------------------


def _tree_api() -> dict[str, Any]:
    """The classes the benchmark drives, from whichever layout the tree on ``sys.path`` has."""
    from omnitrio.contract import IncomingMessage, OmniRequest, StagePayload

    api: dict[str, Any] = {}
    try:  # the family in its parts, with typed handoffs
        from schedulers.engine.decoder import Decoder as ThinkerEngine
        from schedulers.engine.decoder import DecoderRequest as ThinkerRequest
        from schedulers.engine.handoffs import ThinkerResult
        from schedulers.engine.sampling import Sampler, SamplingDefaults
        from schedulers.qwen3_omni.talker.codec_sampling import TalkerSampling
        from schedulers.qwen3_omni.talker.model import TalkerModel
        from schedulers.qwen3_omni.talker.stage import TalkerScheduler

        def data() -> Any:
            return ThinkerResult((), 0, "stop", True)

    except ImportError:  # the flat layout with dict handoffs
        from schedulers.qwen3_omni.codec_sampling import TalkerSampling  # type: ignore[no-redef]
        from schedulers.qwen3_omni.talker_model import TalkerModel  # type: ignore[no-redef]
        from schedulers.qwen3_omni.thinker_engine import ThinkerEngine, ThinkerRequest  # type: ignore[no-redef]
        from schedulers.qwen3_omni.thinker_sampling import Sampler, SamplingDefaults  # type: ignore[no-redef]

        from schedulers.qwen3_omni.talker import TalkerScheduler  # type: ignore[no-redef]

        def data() -> Any:
            return {}

    api.update(
        TalkerSampling=TalkerSampling,
        TalkerModel=TalkerModel,
        TalkerScheduler=TalkerScheduler,
        ThinkerEngine=ThinkerEngine,
        ThinkerRequest=ThinkerRequest,
        greedy=lambda: Sampler.build(SamplingDefaults(), 0.0),
        final=lambda rid: IncomingMessage(rid, "new_request", StagePayload(rid, OmniRequest(), data())),
    )
    return api


def talker_rate(
    api: dict[str, Any], talker: Any, streams: list[list[Any]], frames: int, pace_s: float
) -> dict[str, Any]:
    """Frames per wall second and per second of the talker's step time, for ``streams`` fed at ``pace_s``."""
    sampling = api["TalkerSampling"](do_sample=False, max_new_tokens=frames + 1, min_new_tokens=frames + 1)
    scheduler = api["TalkerScheduler"](talker, sampling=sampling)
    busy = Timed(scheduler._step, time.thread_time)
    scheduler._step = busy
    total, wall = serve_streams(scheduler, streams, api["final"], pace_s)
    sizes = list(scheduler.batch_sizes)
    return {
        "frames_per_s": round(total / wall, 1),
        "frames_per_busy_s": round(total / busy.seconds, 1),
        "mean_batch": round(statistics.fmean(sizes), 2) if sizes else 0.0,
    }


def thinker_rate(api: dict[str, Any], lm: Any, batch: int, prompt: int, tokens: int) -> tuple[float, float]:
    """The engine's tokens per wall second and per CPU second for ``batch`` random prompts decoded greedily
    together (one torch thread: the CPU time is this thread's)."""
    import torch

    generator = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, 256, (prompt,), generator=generator) for _ in range(batch)]
    engine = api["ThinkerEngine"](lm, max_running=batch)
    start, cpu = time.perf_counter(), time.thread_time()
    for i, ids in enumerate(prompts):
        engine.add(api["ThinkerRequest"](f"r{i}", lm.prompt_inputs(ids), tokens, api["greedy"](), None))
    while engine.has_work:
        engine.step()
    generated = batch * tokens
    return generated / (time.perf_counter() - start), generated / (time.thread_time() - cpu)


def worker(args: argparse.Namespace) -> None:
    """Load one tree's thinker and talker for one size, say ``ready``, then answer each figure asked on stdin
    (one JSON line each, see :func:`asks`) with one JSON line of its figures, until stdin ends."""
    sys.path.insert(0, str(Path(args.worker).resolve()))
    import torch

    import schedulers
    from toys.qwen3_omni_reference import load_reference_model, processor_inputs, reference_processor
    from toys.qwen3_omni_talker_feed import reference_run
    from toys.qwen3_omni_thinker import thinker_scheduler

    torch.set_num_threads(1)
    api = _tree_api()
    model_dir = Path(args.checkpoint)
    lm = thinker_scheduler(model_dir).engine.lm
    thinker_rate(api, lm, 1, args.prompt, 4)  # warm-up: first calls allocate
    model, processor = load_reference_model(model_dir), reference_processor(model_dir)
    eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    streams = []
    for index in range(max(args.batches)):
        messages = [{"role": "user", "content": f"request number {index}, say something long"}]
        inputs = dict(processor_inputs(processor, messages))
        ref = reference_run(
            model, inputs, speaker="ethan", thinker_max_new_tokens=args.text, talker_max_new_tokens=4, eos_token_id=eos
        )
        streams.append(ref.chunks)
    del model
    talker = api["TalkerModel"].from_checkpoint(model_dir)
    talker_rate(api, talker, streams[:1], 4, 0.0)  # warm-up
    print(json.dumps({"ready": str(Path(schedulers.__file__).parent.parent)}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        if ask["part"] == "thinker":
            wall, cpu = thinker_rate(api, lm, ask["batch"], args.prompt, args.tokens)
            row: dict[str, Any] = {"tok_s": round(wall, 1), "tok_per_cpu_s": round(cpu, 1)}
        else:
            pace = 0.0 if ask["mode"] == "burst" else args.pace_ms / 1000
            row = talker_rate(api, talker, streams[: ask["batch"]], args.frames, pace)
        print(json.dumps(row), flush=True)


# -- the parent: checkpoints, pairs, medians ------------------------------------------------------


def asks(batches: Sequence[int]) -> list[dict[str, Any]]:
    """Every figure a worker is asked for: the thinker per batch, the talker per mode and batch."""
    thinker = [{"part": "thinker", "mode": None, "batch": batch} for batch in batches]
    talker = [{"part": "talker", "mode": mode, "batch": batch} for mode in ("burst", "paced") for batch in batches]
    return thinker + talker


class Side:
    """One tree's worker process for one size (:func:`worker`), asked one figure at a time."""

    def __init__(self, tree: Path, checkpoint: Path, size: str, args: argparse.Namespace, log: Path) -> None:
        command = [
            sys.executable, str(Path(__file__).resolve()), "--worker", str(tree), "--checkpoint", str(checkpoint),
            "--batches", *map(str, args.batches), "--frames", str(args.frames), "--tokens", str(args.tokens),
            "--prompt", str(args.prompt), "--text", str(args.text), "--pace-ms", str(args.pace_ms or PACE_MS[size]),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.tree, self.log = tree, log
        self.process = subprocess.Popen(
            command, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("w"), text=True
        )
        ready = self._answer()
        if Path(ready["ready"]).resolve() != tree.resolve():
            raise RuntimeError(f"the worker for {tree} imported schedulers from {ready['ready']}")

    def measure(self, ask: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(ask) + "\n")
        self.process.stdin.flush()
        return self._answer()

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                answer: dict[str, Any] = json.loads(line)
                return answer
        raise RuntimeError(f"the worker for {self.tree} exited:\n{self.log.read_text()[-4000:]}")

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


def summarise(size: str, ask: dict[str, Any], pairs: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """One figure's medians per side and the median over its pairs of after / before, per metric."""
    row: dict[str, Any] = {"size": size, **ask}
    for name in pairs[0]["after"]:
        if name == "mean_batch":
            continue
        runs = {side: [pair[side][name] for pair in pairs] for side in ("before", "after")}
        ratios = [pair["after"][name] / pair["before"][name] for pair in pairs if pair["before"][name]]
        row[name] = {
            "before": statistics.median(runs["before"]),
            "after": statistics.median(runs["after"]),
            "ratio": round(statistics.median(ratios), 3),
            "pair_ratios": [round(r, 3) for r in ratios],
            "rounds": runs,
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, default=BEFORE)
    parser.add_argument("--after", type=Path, default=ROOT)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "medium"], choices=["tiny", "medium"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--rounds", type=int, default=8, help="pairs (before, after) of each figure")
    parser.add_argument("--frames", type=int, default=128, help="talker frames per request")
    parser.add_argument("--text", type=int, default=48, help="thinker tokens streamed to the talker per request")
    parser.add_argument("--pace-ms", type=float, help=f"paced mode: ms between a request's tokens (default {PACE_MS})")
    parser.add_argument("--tokens", type=int, default=48, help="thinker tokens generated per request")
    parser.add_argument("--prompt", type=int, default=32, help="thinker prompt tokens")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the figures go")
    parser.add_argument("--quick", action="store_true", help="tiny, one round, few frames; figures not saved")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.sizes, args.rounds, args.frames, args.text, args.tokens = ["tiny"], 2, 16, 12, 16
    sys.path.insert(0, str(ROOT))
    from schedulers.qwen3_omni.tiny import write_checkpoint

    sides = {"before": args.before, "after": args.after}
    results: dict[str, Any] = {
        "before": str(args.before), "after": str(args.after), "cpus": os.cpu_count(), "torch_threads": 1,
        "rounds": args.rounds, "frames": args.frames, "text_tokens": args.text,
        "pace_ms": {size: args.pace_ms or PACE_MS[size] for size in args.sizes},
        "thinker_tokens": args.tokens, "prompt_tokens": args.prompt, "quick": args.quick,
        "loads": [], "figures": [],
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            checkpoint = write_checkpoint(Path(tmp) / size, size=size)
            workers = {
                side: Side(tree, checkpoint, size, args, Path(tmp) / f"{size}-{side}.log")
                for side, tree in sides.items()
            }
            pairs: dict[int, list[dict[str, dict[str, Any]]]] = {i: [] for i in range(len(asks(args.batches)))}
            for round_ in range(args.rounds):
                results["loads"].append({"size": size, "round": round_, "load_avg": round(os.getloadavg()[0], 2)})
                for i, ask in enumerate(asks(args.batches)):
                    order = ["before", "after"] if (round_ + i) % 2 == 0 else ["after", "before"]
                    pairs[i].append({side: workers[side].measure(ask) for side in order})
                print(f"{size} round {round_ + 1}/{args.rounds}: load {os.getloadavg()[0]:.2f}", flush=True)
            for worker_ in workers.values():
                worker_.close()
            results["figures"] += [summarise(size, ask, pairs[i]) for i, ask in enumerate(asks(args.batches))]
    for row in results["figures"]:
        name = "tok_s" if row["part"] == "thinker" else "frames_per_s"
        what = f"{row['size']:6} {row['part']:7} {row['mode'] or '':5} batch {row['batch']}"
        line = "  ".join(
            f"{n} {v['before']:.1f} -> {v['after']:.1f} (x{v['ratio']})"
            for n, v in row.items()
            if isinstance(v, dict) and n in (name, "frames_per_busy_s", "tok_per_cpu_s")
        )
        print(f"{what}: {line}", flush=True)
    if not args.quick:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
