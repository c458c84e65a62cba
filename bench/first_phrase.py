"""What saying an answer's first phrase on its own saves: Piper's time for the first piece ready
(``complete_sentences_end`` as the answer is written) against its time for the whole first sentence.

Run: ``.venv/bin/python bench/first_phrase.py [--repeat 3]``. The answers are typical openings of a
small assistant model's replies; the load average (1 min) is recorded. Figures go to
``bench/results/first_phrase.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from schedulers.speech.tts import complete_sentences_end, shared_synthesizer, split_sentences  # noqa: E402

ANSWERS = [
    "The weather tomorrow will be sunny and warm, with a light breeze in the afternoon.",
    "Turning left at the second traffic light, you will see the station on your right.",
    "I'm sorry to hear that your battery is low, so try plugging it in for a while.",
    "Sending the report before Friday is a good idea, because the team meets on Monday.",
    "That sounds like a great plan for the weekend.",
    "Here is what I found: the museum opens at nine and closes at five.",
]
RESULTS = ROOT / "bench" / "results" / "first_phrase.json"


def first_piece(answer: str) -> str:
    """The first piece a responder streams to TTS as the answer is written, character by character."""
    for n in range(1, len(answer) + 1):
        end = complete_sentences_end(answer[:n])
        if end:
            return answer[:end].strip()
    return answer


def main(repeat: int) -> dict[str, object]:
    tts = shared_synthesizer()
    tts.synthesize("Ready.")
    rows: list[dict[str, object]] = []
    saved: list[float] = []
    load_before = os.getloadavg()[0]
    for answer in ANSWERS:
        sentence, piece = split_sentences(answer)[0], first_piece(answer)
        timed = {}
        for name, text in (("sentence", sentence), ("first_piece", piece)):
            seconds = []
            for _ in range(repeat):
                began = time.perf_counter()
                tts.synthesize(text)
                seconds.append(time.perf_counter() - began)
            timed[name] = round(1000 * statistics.median(seconds), 1)
        rows.append({"first_piece": piece, "sentence_ms": timed["sentence"], "first_piece_ms": timed["first_piece"]})
        saved.append(timed["sentence"] - timed["first_piece"])
        print(json.dumps(rows[-1]), flush=True)
    return {
        "answers": rows,
        "saved_ms_p50": round(statistics.median(saved), 1),
        "loaded_machine": True,
        "load_avg_before": round(load_before, 2),
        "load_avg_after": round(os.getloadavg()[0], 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    figures = main(args.repeat)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps({k: v for k, v in figures.items() if k != "answers"}))
