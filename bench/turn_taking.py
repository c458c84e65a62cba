"""Turn-taking: semantic end of turn against silence-only VAD, on a labelled set of synthesized utterances.

The set: complete sentences, and the same sentences cut mid-phrase (after an article, a
preposition, a conjunction, a filler, or a content word) followed by a 1 s hesitation; each
spoken by Piper (the project's voice, three speeds) and by espeak-ng (three voices), generated
here at run time.  Every utterance is 0.3 s of silence, the speech, then silence.

Each one is streamed through the server's VAD (Silero, ``pause_ms=200``).  At every pause of
200 ms the semantic detectors judge the turn from the audio so far and its transcript so far
(Whisper tiny.en, ``quick``, as the realtime speculation decodes it) and wait the silence their
judgement asks for (:mod:`schedulers.speech.turn_end`).  Silence-only VAD ends a turn at the
first pause of ``silence_duration_ms``.  Outcomes, per detector:

* true end: a complete utterance whose turn ends at its final pause within 1 s of the end of speech;
* false end: a turn ended during a pause inside the speech (a comma) or during a cut utterance's
  hesitation (the speaker was cut off);
* precision = true / (true + false), recall = true / complete utterances;
* turn latency on complete utterances: end of speech (the last sample above -40 dBFS) to the
  decision, the decision's compute included (a complete utterance judged incomplete waits the
  eagerness's timeout: that wait is the latency).

Detectors: ``server_vad`` (500 ms, OpenAI's default; and 200 ms), the audio model alone and the
words alone (both with the ``medium`` silences), and ``semantic_vad`` at each eagerness.  Per
decision: the words' check, the audio model, and (separately) the transcript's ASR.

Run: ``.venv/bin/python bench/turn_taking.py [--quick]``; figures go to ``bench/results/turn_taking.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from schedulers.speech.audio import ASR_SAMPLE_RATE, FloatAudio, resample  # noqa: E402
from schedulers.speech.turn_end import EagernessPolicy, judge, policy_for  # noqa: E402
from schedulers.speech.turn_words import unfinished_because  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "turn_taking.json"
PAUSE_MS = 200
LEAD_S = 0.3
HESITATION_MS = 1000  # a cut utterance's pause before the speaker would go on
PROMPT_MS = 1000  # a true end must be answered within this long after the end of speech
SERVER_VAD_MS = (500, 200)
MS = ASR_SAMPLE_RATE // 1000

# (complete sentence, the same sentence cut mid-phrase)
SENTENCES: list[tuple[str, str]] = [
    ("I would like to book a table for four people tonight.", "I would like to book a table for"),
    ("Can you tell me about the weather in Paris?", "Can you tell me about the"),
    ("What is the capital of France?", "What is the capital of"),
    ("My phone number is five five five, one two three four.", "My phone number is five five five"),
    ("Please send the report to my manager.", "Please send the report to my"),
    ("I need to buy some milk and bread.", "I need to buy some milk and"),
    ("Could you turn off the lights in the kitchen?", "Could you turn off the lights in the"),
    ("Set an alarm for seven in the morning.", "Set an alarm for seven in the, um"),
    ("How long does it take to drive to the airport?", "How long does it take to drive to"),
    ("Remind me to call my mother tomorrow.", "Remind me to call my"),
    ("Play some relaxing music.", "Play some, uh"),
    ("What time does the pharmacy close today?", "What time does the"),
    ("I want to cancel my subscription because it is too expensive.", "I want to cancel my subscription because"),
    ("Thank you very much, goodbye.", "Thank you very much, and"),
    ("Book me a flight from London to New York.", "Book me a flight from London to"),
    ("Is it going to rain this afternoon?", "Is it going to rain this"),
    ("Add eggs, butter and flour to my shopping list.", "Add eggs, butter and"),
    ("Tell me a joke.", "Tell me a"),
    ("Where is the nearest train station?", "Where is the nearest"),
    ("I think we should leave at eight o'clock.", "I think we should leave at"),
    ("Send a message to Anna saying I will be late.", "Send a message to Anna saying"),
    ("How do I get from the hotel to the museum?", "How do I get from the hotel to the, uh"),
]
PIPER_SPEEDS = (0.85, 1.0, 1.2)
ESPEAK_VOICES = ("en-us", "en-gb", "en-us+f3")


@attrs.frozen
class Voice:
    name: str
    synthesize: Callable[[str], FloatAudio]  # 16 kHz


@attrs.frozen
class Pause:
    """One pause of at least 200 ms: where speech last was, the judging point, and how long it lasted."""

    speech_end: int  # sample
    length_ms: float  # math.inf for a complete utterance's final pause
    final: bool
    transcript: str
    unfinished: str | None
    probability: float
    asr_ms: float
    words_ms: float
    model_ms: float


@attrs.frozen
class Utterance:
    text: str
    complete: bool
    voice: str
    end_of_speech: int  # sample
    pauses: list[Pause]


def voices(quick: bool) -> list[Voice]:
    from schedulers.speech.tts import EspeakSynthesizer, PiperSynthesizer

    found: list[Voice] = []
    piper = PiperSynthesizer(threads=1)
    for speed in (1.0,) if quick else PIPER_SPEEDS:
        found.append(Voice(f"piper@{speed}", _at_16k(lambda text, s=speed: piper.synthesize(text, s), piper)))
    try:
        espeak_voices = ESPEAK_VOICES[:1] if quick else ESPEAK_VOICES
        for name in espeak_voices:
            espeak = EspeakSynthesizer(voice=name)
            found.append(Voice(f"espeak-ng:{name}", _at_16k(espeak.synthesize, espeak)))
    except FileNotFoundError as missing:
        print(f"espeak-ng voices skipped: {missing}")
    return found


def _at_16k(synthesize: Callable[[str], FloatAudio], synthesizer: Any) -> Callable[[str], FloatAudio]:
    return lambda text: resample(synthesize(text), synthesizer.sample_rate, ASR_SAMPLE_RATE)


def end_of_speech(speech: FloatAudio) -> int:
    """The end of the last 10 ms frame louder than -40 dBFS RMS."""
    frames = speech[: speech.size - speech.size % (10 * MS)].reshape(-1, 10 * MS)
    loud = np.flatnonzero(np.sqrt(np.mean(np.square(frames, dtype=np.float64), axis=1)) > 0.01)
    return int((loud[-1] + 1) * 10 * MS) if loud.size else 0


def measure(text: str, complete: bool, voice: Voice, recognizer: Any, model: Any) -> Utterance:
    """Stream one utterance through the VAD and judge every pause of 200 ms."""
    from schedulers.speech.vad import VoiceActivityDetector

    speech = voice.synthesize(text)
    end = end_of_speech(speech)
    tail_ms = 2 * PROMPT_MS if complete else HESITATION_MS
    lead = np.zeros(int(LEAD_S * ASR_SAMPLE_RATE), dtype=np.float32)
    audio = np.concatenate([lead, speech[:end], np.zeros(tail_ms * MS, dtype=np.float32)])
    vad = VoiceActivityDetector(pause_ms=PAUSE_MS, silence_duration_ms=60_000, backend="silero")
    events = vad.feed(audio)
    start = next((e.sample for e in events if e.type == "speech_started"), 0)
    pauses: list[Pause] = []
    for index, event in enumerate(events):
        if event.type != "speech_paused":
            continue
        resumed = next((e.sample for e in events[index + 1 :] if e.type == "speech_resumed"), None)
        speech_end = event.sample - PAUSE_MS * MS
        final = resumed is None
        if final and complete:
            length = float("inf")
        else:
            stop = audio.size if resumed is None else resumed
            length = (stop - speech_end) / MS
        turn = audio[start : event.sample]
        began = time.perf_counter()
        transcript = recognizer.transcribe(turn, quick=True)
        asr_done = time.perf_counter()
        unfinished = unfinished_because(transcript)
        words_done = time.perf_counter()
        probability = model.probability_complete(turn)
        model_done = time.perf_counter()
        pauses.append(
            Pause(
                speech_end,
                length,
                final,
                transcript,
                unfinished,
                probability,
                (asr_done - began) * 1000,
                (words_done - asr_done) * 1000,
                (model_done - words_done) * 1000,
            )
        )
    return Utterance(text, complete, voice.name, lead.size + end, pauses)


# A detector: the silence (ms) it waits at a pause, and the compute (ms) its decision costs.
Detector = Callable[[Pause], tuple[float, float]]


def server_vad(silence_ms: int) -> Detector:
    return lambda pause: (silence_ms, 0.0)


def semantic(policy: EagernessPolicy, *, audio: bool = True, words: bool = True) -> Detector:
    def wait(pause: Pause) -> tuple[float, float]:
        unfinished = pause.unfinished if words else None
        runs_model = audio and unfinished is None
        judgement = judge(policy, pause.probability if runs_model else None, unfinished)
        compute = (pause.words_ms if words else 0.0) + (pause.model_ms if runs_model else 0.0)
        return judgement.end_after_ms, compute

    return wait


def outcome(utterance: Utterance, detector: Detector) -> tuple[str, float | None]:
    """``("true" | "missed" | "false" | "held", latency_ms)`` of one utterance under one detector."""
    for pause in utterance.pauses:
        silence, compute = detector(pause)
        if silence > pause.length_ms:
            continue
        if not (pause.final and utterance.complete):
            return "false", None
        decided = max(silence, PAUSE_MS + compute)
        latency = (pause.speech_end - utterance.end_of_speech) / MS + decided
        return ("true" if latency <= PROMPT_MS else "missed"), latency
    return ("missed", None) if utterance.complete else ("held", None)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def score(utterances: list[Utterance], detector: Detector) -> dict[str, Any]:
    results = [outcome(u, detector) for u in utterances]
    true = sum(kind == "true" for kind, _ in results)
    false = sum(kind == "false" for kind, _ in results)
    complete = sum(u.complete for u in utterances)
    latencies = [latency for (_kind, latency), u in zip(results, utterances, strict=True) if u.complete and latency]
    return {
        "precision": round(true / (true + false), 3) if true + false else None,
        "recall": round(true / complete, 3) if complete else None,
        "false_ends": false,
        "complete_turn_latency_ms": {
            "p50": percentile(latencies, 0.5),
            "p90": percentile(latencies, 0.9),
            "mean": round(statistics.fmean(latencies), 1) if latencies else None,
            "ended": len(latencies),
        },
    }


def detectors() -> dict[str, Detector]:
    medium = policy_for("medium")
    found: dict[str, Detector] = {f"server_vad_{ms}ms": server_vad(ms) for ms in SERVER_VAD_MS}
    found["audio_model_alone"] = semantic(medium, words=False)
    found["words_alone"] = semantic(medium, audio=False)
    for eagerness in ("low", "medium", "high"):
        found[f"semantic_vad_{eagerness}"] = semantic(policy_for(eagerness))
    return found


def per_decision(utterances: list[Utterance]) -> dict[str, Any]:
    pauses = [pause for u in utterances for pause in u.pauses]
    figures: dict[str, Any] = {"decisions": len(pauses)}
    for name in ("words_ms", "model_ms", "asr_ms"):
        values = [getattr(pause, name) for pause in pauses]
        figures[name] = {"p50": percentile(values, 0.5), "p90": percentile(values, 0.9)}
    return figures


def main(quick: bool) -> dict[str, Any]:
    from schedulers.speech.asr import shared_recognizer
    from schedulers.speech.turn_model import TurnModel

    recognizer = shared_recognizer("faster-whisper")
    model = TurnModel(threads=1)
    load_before = os.getloadavg()[0]
    utterances = [
        measure(text, complete, voice, recognizer, model)
        for voice in voices(quick)
        for pair in (SENTENCES[:8] if quick else SENTENCES)
        for text, complete in ((pair[0], True), (pair[1], False))
    ]
    scores = {name: score(utterances, detector) for name, detector in detectors().items()}
    by_voice = {
        voice: score([u for u in utterances if u.voice == voice], semantic(policy_for("medium")))
        for voice in sorted({u.voice for u in utterances})
    }
    return {
        "cpus": os.cpu_count(),
        "load_avg_before": load_before,
        "utterances": {"complete": sum(u.complete for u in utterances), "cut": sum(not u.complete for u in utterances)},
        "voices": sorted({u.voice for u in utterances}),
        "per_decision_ms": per_decision(utterances),
        "detectors": scores,
        "semantic_vad_medium_by_voice": by_voice,
        "judged_pauses": [
            {
                "voice": u.voice,
                "text": u.text,
                "complete": u.complete,
                "final": p.final,
                "transcript": p.transcript,
                "unfinished": p.unfinished,
                "probability": round(p.probability, 3),
            }
            for u in utterances
            for p in u.pauses
        ],
        "load_avg_after": os.getloadavg()[0],
    }


def report(figures: dict[str, Any]) -> None:
    print(f"utterances: {figures['utterances']}  voices: {', '.join(figures['voices'])}")
    decision = figures["per_decision_ms"]
    print(
        f"per decision ({decision['decisions']}): words p50 {decision['words_ms']['p50']} ms,"
        f" audio model p50 {decision['model_ms']['p50']} ms (p90 {decision['model_ms']['p90']}),"
        f" transcript ASR p50 {decision['asr_ms']['p50']} ms"
    )
    print(f"{'detector':<22} {'precision':>9} {'recall':>7} {'false':>6} {'p50 ms':>8} {'p90 ms':>8}")
    for name, row in figures["detectors"].items():
        latency = row["complete_turn_latency_ms"]
        print(
            f"{name:<22} {row['precision']!s:>9} {row['recall']!s:>7} {row['false_ends']:>6}"
            f" {latency['p50']!s:>8} {latency['p90']!s:>8}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two voices and eight sentence pairs")
    args = parser.parse_args()
    results = main(args.quick)
    report(results)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
