"""Speed of the default pipeline's speech models on this CPU: TTS and ASR real-time factors, TTS first audio.

* **TTS real-time factor**: Piper synthesis time / audio duration, per sentence (10 sentences).
* **TTS time to first audio**: a three-sentence ``{"task": "speech"}`` request through the default
  pipeline (configs/speech.toml, stages in this process), from entering ``pipeline.stream`` to the
  first audio chunk — the TTS stage streams sentence by sentence — and to the last.
* **ASR real-time factor**: Whisper tiny.en time / audio duration on the same sentences, for the full
  30 s window (transcriptions) and for ``quick=True`` (realtime turns), with the word error rate of each.

Run: ``.venv/bin/python bench/speech.py [--rounds 3]``.  Figures go to ``bench/results/speech.json``.
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from omnitrio import StreamMessage, open_pipeline  # noqa: E402
from omnitrio.cli import DEFAULT_CONFIG  # noqa: E402
from omnitrio.config_loading import load  # noqa: E402
from toys.speech_text import SENTENCES, normalize, word_error_rate  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "speech.json"
PARAGRAPH = " ".join(SENTENCES[:3])


def _ms(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(values) * 1e3, 1), "max_ms": round(max(values) * 1e3, 1)}


def tts_and_asr(rounds: int) -> dict[str, Any]:
    from schedulers.speech.asr import shared_recognizer
    from schedulers.speech.audio import ASR_SAMPLE_RATE, resample
    from schedulers.speech.tts import shared_synthesizer

    tts = shared_synthesizer("auto", threads=2)
    asr = shared_recognizer("auto", compute_type="int8", cpu_threads=2, beam_size=1)
    asr.transcribe(np.zeros(ASR_SAMPLE_RATE, np.float32))  # the first decode is slower
    tts_rtf: list[float] = []
    asr_rtf: dict[str, list[float]] = {"full": [], "quick": []}
    errors = {"full": 0.0, "quick": 0.0}
    words = 0
    for _ in range(rounds):
        for sentence in SENTENCES:
            start = time.perf_counter()
            audio = tts.synthesize(sentence)
            seconds = audio.size / tts.sample_rate
            tts_rtf.append((time.perf_counter() - start) / seconds)
            clip = resample(audio, tts.sample_rate, ASR_SAMPLE_RATE)
            n = len(normalize(sentence))
            words += n
            for mode in ("full", "quick"):
                start = time.perf_counter()
                heard = asr.transcribe(clip, quick=mode == "quick")
                asr_rtf[mode].append((time.perf_counter() - start) / seconds)
                errors[mode] += word_error_rate(sentence, heard) * n
    return {
        "tts_backend": tts.name,
        "tts_real_time_factor_p50": round(statistics.median(tts_rtf), 3),
        "asr_backend": asr.name,
        "asr": {
            mode: {
                "real_time_factor_p50": round(statistics.median(asr_rtf[mode]), 3),
                "word_error_rate": round(errors[mode] / words, 3),
            }
            for mode in ("full", "quick")
        },
        "clips": rounds * len(SENTENCES),
    }


async def first_audio(rounds: int) -> dict[str, Any]:
    firsts: list[float] = []
    totals: list[float] = []
    async with open_pipeline(load(DEFAULT_CONFIG), inline=True) as pipeline:
        for i in range(rounds + 1):  # the first round warms up
            start = time.perf_counter()
            first = None
            async with pipeline.stream(f"tts-{i}", {"task": "speech", "input": PARAGRAPH}) as messages:
                async for message in messages:
                    if first is None and isinstance(message, StreamMessage) and message.modality == "audio":
                        first = time.perf_counter() - start
            if i and first is not None:
                firsts.append(first)
                totals.append(time.perf_counter() - start)
    return {"sentences": 3, "first_audio": _ms(firsts), "last_audio": _ms(totals), "requests": len(firsts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, Any] = {"cpus": os.cpu_count(), "load_avg_before": round(os.getloadavg()[0], 2)}
    results.update(tts_and_asr(args.rounds))
    results["tts_pipeline"] = trio.run(first_audio, args.rounds)
    results["load_avg_after"] = round(os.getloadavg()[0], 2)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
