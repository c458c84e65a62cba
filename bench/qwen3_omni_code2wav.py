"""Time to first audio and real-time factor of the Qwen3-Omni code2wav stage, per chunk size.

Drives :class:`~schedulers.qwen3_omni.code2wav.stage.Qwen3OmniCode2WavScheduler` directly (its thread, inbox,
outbox) on random codes, with the models of :mod:`toys.qwen3_omni_code2wav` (``tiny``, ``medium``;
``--release`` adds the released model's shape, ~200 M parameters), one torch thread:

* **first audio**: ``F`` frames reach an idle stage at once; the time until its first pcm chunk (the
  first window's decode).  A user waits for the talker's ``F`` frames on top of it.
* **real-time factor**: ``c`` requests (1 and 8) of ``--frames`` frames each, all codes already there
  (a talker far ahead): wall time to the last result / seconds of audio, per ``chunk_frames`` ``C``.
  Each window re-reads ``conv_context_frames`` before its ``C`` new frames, so the convolutions do
  ``(C + context) / C`` of a whole decode's work, and each forward has a fixed cost: small ``C`` pays both.
* **paced**: the talker sends one frame every ``80 ms / --talker-speed`` to ``c`` requests (1 and 8);
  per first chunk size: the time from a request's first frame to its first audio, and the silence a
  listener playing each request's audio as it comes would hear after it started (gaps, summed).
* ``transformers``: ``chunked_decode`` of one request, batch 1 (what ``generate`` does), for scale;
  ``snr_db``: the stream's float samples against it.

Run: ``.venv/bin/python bench/qwen3_omni_code2wav.py [--quick] [--release]``.  Figures go to
``bench/results/qwen3_omni_code2wav.json``.  Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from omnitrio.contract import IncomingMessage, OmniRequest, StagePayload, StreamItem  # noqa: E402
from schedulers.qwen3_omni.code2wav.model import Code2WavRunner, decode_whole  # noqa: E402
from schedulers.qwen3_omni.code2wav.stage import Qwen3OmniCode2WavScheduler  # noqa: E402
from schedulers.qwen3_omni.code2wav.windows import Chunking  # noqa: E402
from schedulers.qwen3_omni.handoffs import Codes, TalkerResult  # noqa: E402
from toys.qwen3_omni_code2wav import build_code2wav, random_codes  # noqa: E402
from toys.stage_feed import put_atomically, running, wait_results  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "qwen3_omni_code2wav.json"
FRAME_S = 0.08
RAMP = [1.5]  # the windows' growth after the first chunk (--ramp-factor)
MESSAGE_FRAMES = 1  # the talker streams one frame per chunk


def talker_messages(rid: str, codes: torch.Tensor, *, end: bool = True) -> list[IncomingMessage]:
    frames = codes.shape[-1]
    messages = [
        IncomingMessage(rid, "stream_chunk", StreamItem(i, Codes(codes[:, s : s + MESSAGE_FRAMES]), "talker"))
        for i, s in enumerate(range(0, frames, MESSAGE_FRAMES))
    ]
    if end:
        payload = StagePayload(rid, OmniRequest(inputs=None), TalkerResult(frames))
        messages += [IncomingMessage(rid, "new_request", payload), IncomingMessage(rid, "stream_done", "talker")]
    return messages


def first_audio_ms(model: torch.nn.Module, first: int, rounds: int) -> float:
    """Median time from ``first`` frames arriving on an idle stage to the first pcm chunk."""
    times = []
    codes = random_codes(model, first, seed=first)
    with running(Qwen3OmniCode2WavScheduler(model, Chunking(first, max(first, 25), ramp_factor=RAMP[0]))) as scheduler:
        for round_ in range(rounds + 1):
            rid = f"r{round_}"
            start = time.perf_counter()
            put_atomically(scheduler.inbox, talker_messages(rid, codes, end=False))
            msg = scheduler.outbox.get(timeout=600)
            elapsed = time.perf_counter() - start
            assert msg.type == "stream", msg
            put_atomically(scheduler.inbox, talker_messages(rid, codes, end=True)[-2:])
            wait_results(scheduler, 1)
            if round_:  # the first round warms up
                times.append(elapsed)
    return 1000 * statistics.median(times)


def real_time_factor(model: torch.nn.Module, chunk: int, concurrency: int, frames: int, rounds: int) -> float:
    """Wall seconds per second of audio, ``concurrency`` requests of ``frames`` frames at once."""
    codes = [random_codes(model, frames, seed=i) for i in range(concurrency)]
    best = float("inf")
    with running(Qwen3OmniCode2WavScheduler(model, Chunking(min(5, chunk), chunk, ramp_factor=RAMP[0]))) as scheduler:
        for round_ in range(rounds + 1):
            messages = [m for i, c in enumerate(codes) for m in talker_messages(f"r{round_}-{i}", c)]
            start = time.perf_counter()
            put_atomically(scheduler.inbox, messages)
            wait_results(scheduler, concurrency)
            if round_:
                best = min(best, time.perf_counter() - start)
    return best / (concurrency * frames * FRAME_S)


def paced(model: torch.nn.Module, first: int, concurrency: int, frames: int, speed: float) -> tuple[float, float]:
    """Median first-audio latency and gap (ms) when the talker sends a frame every 80 ms / ``speed``."""
    codes = [random_codes(model, frames, seed=i) for i in range(concurrency)]
    period = FRAME_S / speed
    with running(Qwen3OmniCode2WavScheduler(model, Chunking(first, 25, ramp_factor=RAMP[0]))) as scheduler:

        def talker() -> None:
            start = time.perf_counter()
            for frame in range(frames):
                time.sleep(max(0.0, start + frame * period - time.perf_counter()))
                put_atomically(
                    scheduler.inbox,
                    [talker_messages(f"r{i}", c[:, frame : frame + 1], end=False)[0] for i, c in enumerate(codes)],
                )
            ends = [m for i, c in enumerate(codes) for m in talker_messages(f"r{i}", c)[-2:]]
            put_atomically(scheduler.inbox, ends)

        feeder = threading.Thread(target=talker, daemon=True)
        begun = time.perf_counter()
        feeder.start()
        arrivals: dict[str, list[tuple[float, int]]] = {f"r{i}": [] for i in range(concurrency)}
        ended = 0
        while ended < concurrency:
            msg = scheduler.outbox.get(timeout=600)
            if msg.type == "stream":
                arrivals[msg.request_id].append((time.perf_counter() - begun, len(msg.data["pcm"])))
            ended += msg.type == "result"
        feeder.join()
    firsts, gaps = [], []
    for chunks in arrivals.values():
        firsts.append(chunks[0][0])
        playing_until, silence = chunks[0][0], 0.0
        for at, samples in chunks:
            silence += max(0.0, at - playing_until)
            playing_until = max(playing_until, at) + samples / 24_000
        gaps.append(silence)
    return 1000 * statistics.median(firsts), 1000 * statistics.median(gaps)


def transformers_reference(model: torch.nn.Module, frames: int) -> tuple[float, float]:
    """``chunked_decode``'s real-time factor (batch 1) and the stream's float SNR against it."""
    codes = random_codes(model, frames, seed=99)
    with torch.inference_mode():
        model.chunked_decode(codes[None, :, :8])
        start = time.perf_counter()
        ref = model.chunked_decode(codes[None])[0, 0].double()
        rtf = (time.perf_counter() - start) / (frames * FRAME_S)
    streamed = decode_whole(Code2WavRunner(model), Chunking(5, 25), codes).double()
    snr = 10 * torch.log10((ref**2).sum() / ((ref - streamed) ** 2).sum().clamp_min(1e-30))
    return rtf, float(snr)


def measure(size: str, args: argparse.Namespace) -> dict[str, Any]:
    model = build_code2wav(size)
    context = Code2WavRunner(model).geometry.conv_context_frames
    print(
        f"\n{size}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, "
        f"convolution context {context} frames"
    )
    rtf_hf, snr = transformers_reference(model, args.frames)
    print(f"  transformers chunked_decode, batch 1: RTF {rtf_hf:.3f};  stream vs it: SNR {snr:.1f} dB (float)")
    first = {}
    for frames in args.first:
        first[frames] = first_audio_ms(model, frames, args.rounds)
        print(
            f"  first chunk {frames:>3} frames ({frames * 80:>4} ms of audio): first audio after "
            f"{first[frames]:7.1f} ms of decode"
        )
    rtf: dict[int, dict[int, float]] = {}
    for chunk in args.chunks:
        rtf[chunk] = {c: real_time_factor(model, chunk, c, args.frames, args.rounds) for c in args.concurrency}
        cells = "  ".join(f"c={c}: RTF {value:.3f}" for c, value in rtf[chunk].items())
        print(f"  chunk {chunk:>3} frames (+{context} context, {(chunk + context) / chunk:.2f}x conv work): {cells}")
    pacing: dict[int, dict[int, dict[str, float]]] = {}
    for frames in args.first:
        pacing[frames] = {}
        for c in args.concurrency:
            first_ms, gap_ms = paced(model, frames, c, args.frames, args.talker_speed)
            pacing[frames][c] = {"first_audio_ms": first_ms, "gap_ms": gap_ms}
            print(
                f"  paced talker x{args.talker_speed:g}, first chunk {frames:>3}, c={c}: first audio "
                f"{first_ms:7.1f} ms after the first frame, gaps {gap_ms:7.1f} ms"
            )
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "paced_talker_speed": args.talker_speed,
        "paced_by_first_chunk_and_concurrency": pacing,
        "conv_context_frames": context,
        "transformers_rtf_batch1": rtf_hf,
        "stream_snr_db_float": snr,
        "first_audio_decode_ms": first,
        "rtf_by_chunk_and_concurrency": rtf,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes, frames and rounds (proves it runs)")
    parser.add_argument("--release", action="store_true", help="also the released model's shape (slow on CPU)")
    parser.add_argument("--frames", type=int, default=50, help="frames per request for the RTF (50 = 4 s)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--talker-speed", type=float, default=2.0, help="paced talker, x real time")
    parser.add_argument("--ramp-factor", type=float, default=RAMP[0], help="window growth after the first")
    parser.add_argument("--sizes", nargs="+", default=["tiny", "medium"], choices=["tiny", "medium", "release"])
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the figures go")
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.first, args.chunks, args.concurrency = [1, 2, 5, 10, 25], [5, 10, 25, 50], [1, 8]
    sizes = args.sizes + (["release"] if args.release and "release" not in args.sizes else [])
    RAMP[0] = args.ramp_factor
    if args.quick:
        args.frames, args.rounds, args.first, args.chunks = 30, 1, [2, 5], [10, 25]
        sizes = ["tiny"]
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} on {os.cpu_count()} CPUs; one torch thread")
    results = {size: measure(size, args) for size in sizes}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if not args.quick:
        report = {
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_average": load[0],
            "cpus": os.cpu_count(),
            "frames_per_request": args.frames,
            "ramp_factor": args.ramp_factor,
            "sizes": results,
        }
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
