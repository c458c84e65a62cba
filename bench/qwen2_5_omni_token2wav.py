"""Qwen2.5-Omni token2wav: the streamed audio's SNR per chunking, time to first audio, throughput.

Writes tiny (and, without ``--quick``, medium) random checkpoints (:mod:`schedulers.qwen2_5_omni.tiny`) and
drives :class:`~schedulers.qwen2_5_omni.token2wav.stage.Token2WavScheduler` directly (its thread, inbox,
outbox) on random codes, one torch thread:

* **snr_db**: the streamed audio against transformers' whole decode of the same codes, speaker and seed,
  per chunking ``first..steady/past/future`` (DiT blocks of 24 mel frames = 12 codes; chunks grow by the
  ramp factor from the first to the steady size) and BigVGAN context and lag (mel frames); ``whole`` is a
  request that does not stream (it equals transformers bit for bit).
* **first_audio_ms**: the first chunk's window of codes reaches an idle stage; the time until its first
  audio (the window's 36 DiT evaluations and BigVGAN).  A user waits for the talker's codes on top of it.
* **audio_per_wall_s**: ``c`` requests (1 and 8) of ``--codes`` codes each, all codes there (a talker far
  ahead), ``streamed`` (the default chunks) and ``whole`` (requests that do not stream, one window each,
  batched across requests): seconds of audio per wall second; ``transformers``: ``Qwen2_5OmniToken2WavModel``
  decoding the same requests one after another (what ``generate`` does per request), on as many torch
  threads as the stage (one).  **audio_per_cpu_s**: the same per CPU second of the thread that decoded (the
  stage's scheduler thread; the caller's for transformers), which other processes on a loaded machine do
  not add to.
* **ceiling**: what the arithmetic alone allows on this machine.  The floating-point operations of one
  request's decode (DiT and BigVGAN, torch's flop counter) per second of audio, whole and streamed (the
  default chunks: their windows overlap, so streaming computes more), against the best rate of the DiT's
  largest matrix product on one thread (``peak``): ``cores × peak ÷ work`` bounds the audio per wall second
  of any server that computes the same decode on this machine's cores, shown against ``transformers``'
  measured rate at 1 request.
* **dit_batch_gain**: one DiT evaluation of 8 windows in one forward against 8 forwards of one window
  (best of 5 each), for windows of 48 and 192 mel frames: how much more audio per second batching across
  requests buys on this device (8 = what a forward of 8 costs just as much as 8 of 1).

Run: ``.venv/bin/python bench/qwen2_5_omni_token2wav.py [--quick] [--sizes tiny medium]``.  Figures go to
``bench/results/qwen2_5_omni_token2wav.json`` with the load average before the run: figures taken on a
loaded machine say so in their ``note``.  Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from omnitrio.contract import IncomingMessage, OmniRequest, StagePayload, StreamItem  # noqa: E402
from schedulers.qwen2_5_omni.checkpoint import speakers  # noqa: E402
from schedulers.qwen2_5_omni.handoffs import TalkerCodes, TalkerDone, Voice  # noqa: E402
from schedulers.qwen2_5_omni.tiny import write_checkpoint  # noqa: E402
from schedulers.qwen2_5_omni.token2wav.model import Row, Token2Wav  # noqa: E402
from schedulers.qwen2_5_omni.token2wav.noise import NoiseStream  # noqa: E402
from schedulers.qwen2_5_omni.token2wav.stage import create_token2wav_stage  # noqa: E402
from schedulers.qwen2_5_omni.token2wav.stream import SpeechStream, decode  # noqa: E402
from schedulers.qwen2_5_omni.token2wav.windows import Schedule  # noqa: E402
from toys.stage_feed import put_atomically, running, serving_thread, wait_results  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "qwen2_5_omni_token2wav.json"
SAMPLE_RATE = 24_000
SAMPLES_PER_CODE = 480
# (first, steady chunk, past, future) in DiT blocks, (context, lag) in mel frames, ramp factor; the first row is
# the stage's default, the second the release's streaming (3 blocks, 2 past, 1 future)
CHUNKINGS: list[tuple[int, int, int, int, int, int, float]] = [
    (1, 8, 2, 1, 24, 12, 2.0),
    (3, 3, 2, 1, 24, 12, 1.0),
    (1, 3, 2, 1, 24, 12, 2.0),
    (1, 2, 2, 1, 24, 12, 2.0),
    (1, 1, 2, 1, 24, 12, 1.0),
    (1, 8, 1, 1, 24, 12, 2.0),
    (1, 8, 2, 0, 24, 12, 2.0),
    (1, 8, 2, 1, 24, 0, 2.0),
    (1, 8, 2, 1, 12, 0, 2.0),
    (2, 8, 4, 2, 24, 12, 2.0),
]


def random_codes(count: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 8192, (count,), generator=torch.Generator().manual_seed(seed))


def snr_db(reference: torch.Tensor, audio: torch.Tensor) -> float:
    ref, got = reference.double(), audio.double()
    return float(10 * torch.log10((ref**2).sum() / ((ref - got) ** 2).sum().clamp_min(1e-30)))


def snr_table(model_dir: Path, lengths: list[int]) -> dict[str, dict[int, float]]:
    """The SNR of each chunking against transformers' whole decode, per length in codes."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    reference = Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir).token2wav.eval()
    model = Token2Wav.from_checkpoint(model_dir)
    speaker = speakers(model_dir)["Chelsie"]
    condition = model.condition(speaker)
    table: dict[str, dict[int, float]] = {}
    for length in lengths:
        codes = random_codes(length, length)
        torch.manual_seed(length)
        with torch.inference_mode():
            whole = reference(codes[None], conditioning=speaker.cond, reference_mel=speaker.ref_mel)
        stream = SpeechStream(Schedule(24, 2), condition, NoiseStream(length, model.mel_dim), model.points, whole=True)
        table.setdefault("whole", {})[length] = snr_db(whole, decode(model, stream, codes))
        for first, chunk, past, future, context, lag, ramp in CHUNKINGS:
            schedule = Schedule(model.block_size, model.repeats, first, chunk, past, future, context, lag, ramp)
            stream = SpeechStream(schedule, condition, NoiseStream(length, model.mel_dim), model.points, whole=False)
            name = f"{first}..{chunk}/{past}/{future} blocks x{ramp:g}, vocoder {context}/{lag}"
            table.setdefault(name, {})[length] = snr_db(whole, decode(model, stream, codes))
    return table


def talker_messages(rid: str, codes: torch.Tensor, voice: Voice, *, end: bool = True) -> list[IncomingMessage]:
    messages = [
        IncomingMessage(
            rid, "stream_chunk", StreamItem(i, TalkerCodes(codes[s : s + 1], voice if i == 0 else None), "talker")
        )
        for i, s in enumerate(range(codes.shape[0]))
    ]
    if end:
        payload = StagePayload(rid, OmniRequest(inputs=None), TalkerDone(codes.shape[0]))
        messages += [IncomingMessage(rid, "new_request", payload), IncomingMessage(rid, "stream_done", "talker")]
    return messages


def first_audio_ms(model_dir: Path, rounds: int) -> float:
    """Median time from the first window's codes (first chunk and its future block) to the first audio."""
    codes = random_codes(24, 1)
    times = []
    with running(create_token2wav_stage(model_dir=str(model_dir))) as scheduler:
        for round_ in range(rounds + 1):
            rid = f"r{round_}"
            start = time.perf_counter()
            put_atomically(scheduler.inbox, talker_messages(rid, codes, Voice("Chelsie", round_), end=False))
            msg = scheduler.outbox.get(timeout=900)
            elapsed = time.perf_counter() - start
            assert msg.type == "stream", msg
            put_atomically(scheduler.inbox, talker_messages(rid, codes, Voice("Chelsie", round_))[-2:])
            wait_results(scheduler, 1, timeout=900)
            if round_:  # the first round warms up
                times.append(elapsed)
    return 1000 * statistics.median(times)


def thread_cpu_s(thread: threading.Thread) -> float:
    """CPU seconds ``thread`` has run so far."""
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def audio_rates(model_dir: Path, concurrency: int, length: int, *, stream: bool) -> tuple[float, float]:
    """Seconds of audio per wall second and per CPU second of the stage's thread, ``concurrency`` requests
    of ``length`` codes at once, streamed or not."""
    codes = [random_codes(length, i) for i in range(concurrency)]
    scheduler = create_token2wav_stage(model_dir=str(model_dir))
    with serving_thread(scheduler) as thread:
        voices = [Voice("Chelsie", i, stream=stream) for i in range(concurrency)]
        messages = [m for i, c in enumerate(codes) for m in talker_messages(f"r{i}", c, voices[i])]
        start, cpu = time.perf_counter(), thread_cpu_s(thread)
        put_atomically(scheduler.inbox, messages)
        wait_results(scheduler, concurrency, timeout=900)
        elapsed, busy = time.perf_counter() - start, thread_cpu_s(thread) - cpu
    audio = concurrency * length * SAMPLES_PER_CODE / SAMPLE_RATE
    return audio / elapsed, audio / busy


def transformers_audio_rates(model_dir: Path, concurrency: int, length: int) -> tuple[float, float]:
    """The same requests through ``Qwen2_5OmniToken2WavModel`` one after another, as ``generate`` decodes:
    audio per wall second and per CPU second of this thread."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    token2wav = Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir).token2wav.eval()
    speaker = speakers(model_dir)["Chelsie"]
    start, cpu = time.perf_counter(), time.thread_time()
    with torch.inference_mode():
        for i in range(concurrency):
            torch.manual_seed(i)
            token2wav(random_codes(length, i)[None], conditioning=speaker.cond, reference_mel=speaker.ref_mel)
    elapsed, busy = time.perf_counter() - start, time.thread_time() - cpu
    audio = concurrency * length * SAMPLES_PER_CODE / SAMPLE_RATE
    return audio / elapsed, audio / busy


def dit_batch_gain(model_dir: Path, frames: int, rows: int = 8, rounds: int = 5) -> float:
    """``rows`` x the best time of a one-window DiT evaluation over the best time of one ``rows``-window
    evaluation, windows of ``frames`` mel frames."""
    model = Token2Wav.from_checkpoint(model_dir)
    voices = speakers(model_dir)
    condition = model.condition(voices.lookup(voices.names[0]))
    windows = [
        Row(torch.randn(frames, model.mel_dim), torch.tensor(0.5), random_codes(frames // 2, i), condition)
        for i in range(rows)
    ]

    def best(batch: list[Row]) -> float:
        return best_s(lambda: model.velocities(batch), rounds)

    return rows * best(windows[:1]) / best(windows)


def matmul_peak_gflop_s(model: Token2Wav, frames: int, rounds: int = 20) -> float:
    """The best rate of the DiT's largest linear layer on ``2 · frames`` rows (a guided window), one thread."""
    linear = max((m for m in model.dit.modules() if isinstance(m, torch.nn.Linear)), key=lambda m: m.weight.numel())
    rows = torch.randn(2 * frames, linear.in_features)
    with torch.inference_mode():
        best = best_s(lambda: linear(rows), rounds)
    return 2 * rows.shape[0] * linear.weight.numel() / best / 1e9


def best_s(call: Callable[[], object], rounds: int) -> float:
    """The shortest of ``rounds`` timed calls of ``call``, after one untimed call (first-run costs)."""
    call()
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return min(times)


def ceiling(model_dir: Path, codes: int, transformers_rate: float) -> dict[str, Any]:
    """GFLOP per audio second of a whole and a streamed decode of ``codes`` codes, the matmul peak, and the
    audio per wall second that ``os.cpu_count()`` cores at that peak would allow (module docstring)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = Token2Wav.from_checkpoint(model_dir)
    voices = speakers(model_dir)
    condition = model.condition(voices.lookup(voices.names[0]))
    audio_s = codes * SAMPLES_PER_CODE / SAMPLE_RATE
    peak = matmul_peak_gflop_s(model, 2 * codes)
    cores = os.cpu_count() or 1
    work: dict[str, float] = {}
    bound: dict[str, float] = {}
    for name, whole in (("whole", True), ("streamed", False)):
        schedule = Schedule(model.block_size, model.repeats)
        stream = SpeechStream(schedule, condition, NoiseStream(0, model.mel_dim), model.points, whole=whole)
        counter = FlopCounterMode(display=False)
        with counter:
            decode(model, stream, random_codes(codes, 0))
        work[name] = counter.get_total_flops() / 1e9 / audio_s
        bound[name] = cores * peak / work[name]
    return {
        "codes": codes,
        "gflop_per_audio_s": work,
        "matmul_peak_gflop_s": peak,
        "cores": cores,
        "audio_per_wall_s_at_most": bound,
        "at_most_vs_transformers": {name: rate / transformers_rate for name, rate in bound.items()},
    }


def measure(size: str, directory: Path, args: argparse.Namespace) -> dict[str, Any]:
    model_dir = write_checkpoint(directory / size, size=size)  # type: ignore[arg-type]
    dit = Token2Wav.from_checkpoint(model_dir).dit
    print(f"\n{size}: DiT {sum(p.numel() for p in dit.parameters()) / 1e6:.2f} M parameters")
    table = snr_table(model_dir, args.lengths)
    for name, by_length in table.items():
        print(f"  {name:<40} " + "  ".join(f"{length} codes {snr:6.1f} dB" for length, snr in by_length.items()))
    first = first_audio_ms(model_dir, args.rounds)
    print(f"  first audio after {first:.0f} ms of decode (the first window: 24 codes)")
    per_wall: dict[int, dict[str, float]] = {}
    per_cpu: dict[int, dict[str, float]] = {}
    for concurrency in args.concurrency:
        # alternating, so that a change of load touches all three alike
        streamed = audio_rates(model_dir, concurrency, args.codes, stream=True)
        theirs = transformers_audio_rates(model_dir, concurrency, args.codes)
        whole = audio_rates(model_dir, concurrency, args.codes, stream=False)
        for clock, rates in ((0, per_wall), (1, per_cpu)):
            rates[concurrency] = {
                "streamed": streamed[clock],
                "whole": whole[clock],
                "transformers": theirs[clock],
                "ratio_streamed": streamed[clock] / theirs[clock],
                "ratio_whole": whole[clock] / theirs[clock],
            }
        for name, rates in (("wall", per_wall), ("CPU", per_cpu)):
            r = rates[concurrency]
            print(
                f"  {concurrency} requests of {args.codes} codes, s of audio per {name} s: streamed "
                f"{r['streamed']:.2f} ({r['ratio_streamed']:.2f}x), whole {r['whole']:.2f} "
                f"({r['ratio_whole']:.2f}x), transformers {r['transformers']:.2f}"
            )
    bound = ceiling(model_dir, args.codes, per_wall[1]["transformers"])
    print(
        f"  ceiling: {bound['gflop_per_audio_s']['whole']:.1f} GFLOP per audio s whole, "
        f"{bound['gflop_per_audio_s']['streamed']:.1f} streamed; matmul peak {bound['matmul_peak_gflop_s']:.1f} "
        f"GFLOP/s per core; {bound['cores']} cores at that peak: at most "
        + ", ".join(f"{rate:.2f}x {name}" for name, rate in bound["at_most_vs_transformers"].items())
        + " transformers' rate"
    )
    gains = {frames: dit_batch_gain(model_dir, frames) for frames in (48, 192)}
    print(
        "  DiT: 8 windows in one forward against 8 forwards: "
        + ", ".join(f"{frames} frames {gain:.2f}x" for frames, gain in gains.items())
    )
    return {
        "snr_db": table,
        "first_audio_ms": first,
        "audio_per_wall_s": per_wall,
        "audio_per_cpu_s": per_cpu,
        "ceiling": bound,
        "dit_batch_gain": gains,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny only, fewer rounds and lengths")
    parser.add_argument("--sizes", nargs="+", choices=["tiny", "medium"], help="default: both (tiny with --quick)")
    args = parser.parse_args()
    args.sizes = args.sizes or (["tiny"] if args.quick else ["tiny", "medium"])
    args.lengths = [60] if args.quick else [60, 200]
    args.codes = 60 if args.quick else 200
    args.rounds = 1 if args.quick else 5
    args.concurrency = [1, 8]
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    print(f"load average before: {load:.1f} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as directory:
        sizes = {size: measure(size, Path(directory), args) for size in args.sizes}
    note = "quiet" if load < 1.5 else f"loaded (load average {load:.1f} before): not quiet figures"
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average": load,
        "cpus": os.cpu_count(),
        "quick": args.quick,
        "note": note,
        "sizes": sizes,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"\nwrote {RESULTS.relative_to(ROOT)} ({note})")


if __name__ == "__main__":
    main()
