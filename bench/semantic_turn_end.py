"""How long after the speech ``semantic_vad`` ends a short and a long turn, fed in real time.

The streaming ASR stage's hooks (:mod:`schedulers.speech.streaming_asr`) run in this process on
the default models (Whisper via faster-whisper, Silero VAD, Smart Turn), fed a synthesized turn in
100 ms pieces at the pace a microphone sends them (a piece goes when its last sample has been
"recorded"; the decoding blocks the feed, as it blocks the stage's session, so a slow decision
makes the VAD fall behind). Reported per utterance: the wall time from its last voiced sample to
the ``speech_stopped`` after it, the ASR and model time of each judged pause, and how many turns
it was cut into. The load average is
recorded before and after.

Run: ``.venv/bin/python bench/semantic_turn_end.py [--out bench/results/semantic_turn_end.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from omnitrio.contract import OmniRequest  # noqa: E402
from schedulers.session import SESSION_METADATA_KEY  # noqa: E402
from schedulers.speech.asr import shared_recognizer  # noqa: E402
from schedulers.speech.audio import resample  # noqa: E402
from schedulers.speech.streaming_asr import StreamingTranscriber  # noqa: E402
from schedulers.speech.tts import shared_synthesizer  # noqa: E402
from schedulers.speech.turn_model import shared_turn_model  # noqa: E402

RATE = 24_000
TURNS = {
    "short": "What is the capital of France?",
    "long": "I would like to book a table for four people on Friday evening at the Italian place near the"
    " station, and if they have one a table by the window, because my mother likes to watch the street.",
}


class Clock:
    """Collects the VAD events with the wall time they came."""

    pending = 0

    def __init__(self) -> None:
        self.events: list[tuple[float, dict[str, Any]]] = []

    def emit(self, chunk: Any, modality: str = "text") -> None:
        if modality == "vad":
            self.events.append((time.perf_counter(), chunk))


def measure(transcriber: StreamingTranscriber, speech: np.ndarray) -> dict[str, Any]:
    config = {"sample_rate": RATE, "partial_every_ms": None, "turn_detection": {"type": "semantic_vad"}}
    state = transcriber.open(None, OmniRequest(metadata={SESSION_METADATA_KEY: {"config": config}}))  # type: ignore[arg-type]
    loud = np.flatnonzero(np.abs(speech) > np.abs(speech).max() / 20)
    lead = RATE // 5
    clip = np.concatenate([np.zeros(lead, np.float32), speech, np.zeros(6 * RATE, np.float32)])
    voice_end = (lead + loud[-1] + 1) / RATE
    clock, step, start = Clock(), RATE // 10, time.perf_counter()
    for offset in range(0, clip.size, step):
        recorded = start + (offset + step) / RATE
        time.sleep(max(0.0, recorded - time.perf_counter()))
        transcriber.append(state, clip[offset : offset + step], None, clock)  # type: ignore[arg-type]
        if any(e["type"] == "speech_stopped" and e["audio_end_ms"] >= 1000 * voice_end for _, e in clock.events):
            break
    stops = [at for at, e in clock.events if e["type"] == "speech_stopped"]
    stopped = stops[-1]
    judged = [e for _, e in clock.events if e["type"] == "turn_judged"]
    pauses = sum(e["type"] == "speech_paused" for _, e in clock.events)
    return {
        "speech_s": round(speech.size / RATE, 2),
        "voice_end_to_speech_stopped_ms": round(1000 * (stopped - start - voice_end)),
        "paused_events": pauses,
        "turns_ended": len(stops),  # a pause inside the sentence judged complete ends a turn there
        "judged": [
            {
                "at_ms": e["audio_ms"],
                "complete": e["turn_complete"],
                "probability": e["probability"],
                "unfinished": e["unfinished"],
                "transcript": e["transcript"],
                "asr_ms": e["decision_ms"]["asr"],
                "model_ms": e["decision_ms"]["model"],
            }
            for e in judged
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "semantic_turn_end.json")
    args = parser.parse_args()
    tts = shared_synthesizer("auto", threads=1, variation=0.0)
    recognizer = shared_recognizer("auto", compute_type="int8", cpu_threads=2, beam_size=1)
    shared_turn_model()
    transcriber = StreamingTranscriber(recognizer)
    load_before = os.getloadavg()[0]
    results = {
        name: measure(transcriber, resample(tts.synthesize(text), tts.sample_rate, RATE))
        for name, text in TURNS.items()
    }
    report = {"load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)], "turns": results}
    print(json.dumps(report, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
