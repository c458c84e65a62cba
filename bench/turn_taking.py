"""Turn-taking: semantic end of turn against silence-only VAD, on a labelled set of synthesized utterances.

The set: complete sentences, and the same sentences cut mid-phrase (after an article, a
preposition, a conjunction, a filler, or a content word) followed by a 1 s hesitation, the cut
said with a final and with a continuing pitch (:func:`spoken`); each spoken by Piper (the
project's voice, two speeds) and by espeak-ng (two voices), generated here at run time.  Every
utterance is 0.3 s of silence, the speech, then silence.

Each one is streamed through the server's VAD as semantic_vad runs it (Silero, ``pause_ms=200``,
the scorer's own edge: ``refine_end=False``).  At every pause of
200 ms the semantic detectors judge the turn from the audio so far and its transcript so far
(Whisper tiny.en, ``quick``, as the realtime speculation decodes it) and wait the silence their
judgement asks for (:mod:`schedulers.speech.turn_end`).  Silence-only VAD ends a turn at the
first pause of ``silence_duration_ms``.  Outcomes, per detector:

* true end: a complete utterance whose turn ends at its final pause after a silence that ends
  within 1 s of the end of speech (the judgement, not this machine's load, decides it);
* false end: a turn ended during a pause inside the speech (a comma) or during a cut utterance's
  hesitation (the speaker was cut off);
* precision = true / (true + false), recall = true / complete utterances;
* turn latency on complete utterances: end of speech (the last sample above -40 dBFS) to the
  decision, the decision's compute included, serially as the streaming ASR stage runs it (the
  transcript's ASR for the words, then the audio model); a complete utterance judged incomplete
  waits the eagerness's timeout, and that wait is its latency.  ``wait`` is the silence alone.

Detectors: ``server_vad`` (500 ms, OpenAI's default; and 200 ms), the audio model alone and the
words alone (both with the ``medium`` silences), and ``semantic_vad`` at each eagerness, in two
forms measured in the same run: the model scoring the audio at the 200 ms pause after the words
(``semantic_vad_*``, before) and the model scoring it at ``EARLY_MS`` of silence beside the
transcript (``semantic_vad_*_beside``, as the streaming ASR stage now does it: a turn that sounds complete
there is decided at ``EARLY_MS`` plus the longer of the two, on two threads; any other is scored
again on the audio to the pause, after it).

The set: ``SENTENCES`` (the ones the rules were tuned on) and ``HELD_OUT`` (new sentences, cut at
other places: after a verb, an adjective, a number, mid-list; never used to tune anything), said
also by an extra espeak-ng voice; held-out figures are reported on their own (``held_out``).  Per
decision: the words' check, the audio model, and (separately) the transcript's ASR, each run
alone; and both side by side on two threads (``decision_ms``: what a concurrent stage would pay).

False interruptions: short backchannels ("uh-huh", "okay", …) and a cough-like noise burst should
let the assistant resume; real interruptions ("wait, stop", …) should cancel it.  Each is spoken
by every voice, transcribed (Whisper, ``quick``) and classified by
:class:`omnitrio.serve.realtime.backchannel.InterruptionPolicy` with its default list.

Other edges, to re-tune against (``--precise-end``: pauses and silences counted from the last voiced
sample, as ``server_vad`` counts them; ``--pause-ms``: the judging pause; ``--model-at-ms``: the
silence at which the model scores beside the transcript).

Run: ``.venv/bin/python bench/turn_taking.py [--quick] [--precise-end] [--pause-ms 200] [--model-at-ms 100]
[--out PATH]``; figures go to ``bench/results/turn_taking.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.turn_taking_report import report  # noqa: E402
from bench.turn_taking_set import HELD_OUT, HELD_OUT_ESPEAK_VOICES, SENTENCES  # noqa: E402
from omnitrio.serve.realtime.backchannel import InterruptionPolicy  # noqa: E402
from schedulers.speech.audio import ASR_SAMPLE_RATE, FloatAudio, resample  # noqa: E402
from schedulers.speech.turn_end import EagernessPolicy, judge, policy_for  # noqa: E402
from schedulers.speech.turn_words import unfinished_because  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "turn_taking.json"
SCORING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="turn-model")
PAUSE_MS = 200
EARLY_MS = 100  # the streaming ASR stage hears a pause (words and turn model) at this much silence
LEAD_S = 0.3
HESITATION_MS = 1000  # a cut utterance's pause before the speaker would go on
PROMPT_MS = 1000  # a true end must be answered within this long after the end of speech
SERVER_VAD_MS = (500, 200)
MS = ASR_SAMPLE_RATE // 1000

BACKCHANNELS = ["Uh-huh.", "Yeah.", "Okay.", "Mm-hmm.", "Right.", "I see.", "Oh, okay."]
INTERRUPTIONS = ["Wait, stop.", "No, I meant Tuesday.", "Can you repeat that?", "Sorry, what was the address?"]
PIPER_SPEEDS = (0.9, 1.15)
HOW = ("complete", "cut, final", "cut, continuing")
ESPEAK_VOICES = ("en-us", "en-gb+f3")


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
    early_probability: float  # the model on the audio up to ``model_at_ms`` of silence
    asr_ms: float
    words_ms: float
    model_ms: float
    decision_ms: float  # ASR and model side by side on two threads
    pause_ms: int = PAUSE_MS  # the silence after ``speech_end`` at which it was judged
    model_at_ms: int = EARLY_MS  # the silence at which the model scored it beside the transcript


@attrs.frozen
class Utterance:
    text: str
    complete: bool
    how: str  # one of HOW
    voice: str
    end_of_speech: int  # sample
    pauses: list[Pause]
    held_out: bool = False


def voices(quick: bool) -> list[Voice]:
    from schedulers.speech.tts import PiperSynthesizer

    found: list[Voice] = []
    piper = PiperSynthesizer(threads=1)

    def at_speed(speed: float) -> Callable[[str], FloatAudio]:
        return lambda text: piper.synthesize(text, speed)

    for speed in PIPER_SPEEDS[:1] if quick else PIPER_SPEEDS:
        found.append(Voice(f"piper@{speed}", _at_16k(at_speed(speed), piper)))
    return found + espeak_voices(ESPEAK_VOICES[:1] if quick else ESPEAK_VOICES)


def espeak_voices(names: tuple[str, ...]) -> list[Voice]:
    """espeak-ng speaking with each voice named; none when espeak-ng is not installed."""
    from schedulers.speech.tts import EspeakSynthesizer

    found: list[Voice] = []
    try:
        for name in names:
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


def spoken(voice: Voice, complete: str, cut: str) -> list[tuple[str, bool, str, FloatAudio]]:
    """(text, complete, how, 16 kHz speech): the sentence, and its cut said two ways.

    "cut, final": the fragment synthesized as it is, which voices end with a sentence's falling
    pitch (the hardest case for the audio model); "cut, continuing": the fragment synthesized
    with a trailing comma, which both voices say with the rising, unfinished pitch of a speaker
    who stops to think.
    """
    return [
        (complete, True, "complete", voice.synthesize(complete)),
        (cut, False, "cut, final", voice.synthesize(cut)),
        (cut, False, "cut, continuing", voice.synthesize(cut + ",")),
    ]


@attrs.frozen
class Edge:
    """Where the VAD puts the end of speech, and the pause (from there) at which a turn is judged."""

    refine_end: bool = False  # False: the scorer's decayed edge; True: the last voiced sample
    pause_ms: int = PAUSE_MS
    model_at_ms: int = EARLY_MS  # the turn model scores the audio to this much silence, beside the words

    @property
    def name(self) -> str:
        edge = "precise" if self.refine_end else "scorer"
        return f"{edge} edge, transcript at {EARLY_MS} ms, model at {self.model_at_ms} ms, judged at {self.pause_ms} ms"


def measure(
    text: str,
    complete: bool,
    how: str,
    speech: FloatAudio,
    voice: str,
    recognizer: Any,
    model: Any,
    edge: Edge = Edge(),
) -> Utterance:
    """Stream one utterance through the VAD and judge every pause of ``edge.pause_ms``."""
    from schedulers.speech.vad import VoiceActivityDetector

    end = end_of_speech(speech)
    tail_ms = 2 * PROMPT_MS if complete else HESITATION_MS
    lead = np.zeros(int(LEAD_S * ASR_SAMPLE_RATE), dtype=np.float32)
    audio = np.concatenate([lead, speech[:end], np.zeros(tail_ms * MS, dtype=np.float32)])
    vad = VoiceActivityDetector(
        pause_ms=edge.pause_ms, silence_duration_ms=60_000, backend="silero", refine_end=edge.refine_end
    )
    events = vad.feed(audio)
    start = next((e.sample for e in events if e.type == "speech_started"), 0)
    pauses: list[Pause] = []
    for index, event in enumerate(events):
        if event.type != "speech_paused":
            continue
        resumed = next((e.sample for e in events[index + 1 :] if e.type == "speech_resumed"), None)
        speech_end = event.sample - edge.pause_ms * MS
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
        early_probability = model.probability_complete(audio[start : speech_end + edge.model_at_ms * MS])
        scored = SCORING.submit(model.probability_complete, turn)
        recognizer.transcribe(turn, quick=True)
        scored.result()
        decided = time.perf_counter()
        pauses.append(
            Pause(
                speech_end,
                length,
                final,
                transcript,
                unfinished,
                probability,
                early_probability,
                (asr_done - began) * 1000,
                (words_done - asr_done) * 1000,
                (model_done - words_done) * 1000,
                (decided - model_done) * 1000,
                edge.pause_ms,
                edge.model_at_ms,
            )
        )
    return Utterance(text, complete, how, voice, lead.size + end, pauses)


# A detector: the silence (ms) it waits at a pause, and the compute (ms) its decision costs after the pause.
Detector = Callable[[Pause], tuple[float, float]]


def server_vad(silence_ms: int) -> Detector:
    return lambda pause: (silence_ms, 0.0)


def semantic(policy: EagernessPolicy, *, audio: bool = True, words: bool = True) -> Detector:
    def wait(pause: Pause) -> tuple[float, float]:
        unfinished = pause.unfinished if words else None
        runs_model = audio and unfinished is None
        judgement = judge(policy, pause.probability if runs_model else None, unfinished)
        compute = (pause.asr_ms + pause.words_ms if words else 0.0) + (pause.model_ms if runs_model else 0.0)
        return judgement.end_after_ms, compute

    return wait


def semantic_beside(policy: EagernessPolicy) -> Detector:
    """As the streaming ASR stage judges: the model scores the audio at ``EARLY_MS`` of silence beside
    the transcript; a turn that sounds complete there is judged at the pause at once, else the
    model scores the audio to the pause (after it)."""

    def wait(pause: Pause) -> tuple[float, float]:
        unfinished = pause.unfinished
        if pause.model_at_ms == EARLY_MS:  # transcript and model side by side
            ready = EARLY_MS + pause.decision_ms
        else:  # the transcript at EARLY_MS, the model later on its own thread
            ready = max(EARLY_MS + pause.asr_ms, pause.model_at_ms + pause.model_ms)
        early = max(0.0, ready - pause.pause_ms)
        if unfinished is None and pause.early_probability >= policy.threshold:
            return judge(policy, pause.early_probability, None).end_after_ms, early
        judgement = judge(policy, pause.probability if unfinished is None else None, unfinished)
        return judgement.end_after_ms, early + (pause.model_ms if unfinished is None else 0.0)

    return wait


@attrs.frozen
class Outcome:
    kind: str  # "true" | "missed" | "false" | "held"
    latency_ms: float | None = None  # end of speech to the decision, compute included
    silence_ms: float | None = None  # the same without the decision's compute


def outcome(utterance: Utterance, detector: Detector) -> Outcome:
    """What one detector does with one utterance: where it ends the turn, and how late."""
    for pause in utterance.pauses:
        silence, compute = detector(pause)
        if silence > pause.length_ms:
            continue
        if not (pause.final and utterance.complete):
            return Outcome("false")
        lag = (pause.speech_end - utterance.end_of_speech) / MS
        latency = lag + max(silence, pause.pause_ms + compute)
        return Outcome("true" if lag + silence <= PROMPT_MS else "missed", latency, lag + silence)
    return Outcome("missed" if utterance.complete else "held")


def spread(values: list[float]) -> dict[str, Any]:
    return {
        "p50": percentile(values, 0.5),
        "p90": percentile(values, 0.9),
        "mean": round(statistics.fmean(values), 1) if values else None,
    }


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def score(utterances: list[Utterance], detector: Detector) -> dict[str, Any]:
    results = [outcome(u, detector) for u in utterances]
    true = sum(r.kind == "true" for r in results)
    false = sum(r.kind == "false" for r in results)
    complete = sum(u.complete for u in utterances)
    ended = [r for r in results if r.latency_ms is not None]
    return {
        "precision": round(true / (true + false), 3) if true + false else None,
        "recall": round(true / complete, 3) if complete else None,
        "false_ends": false,
        "complete_turns_ended": len(ended),
        "complete_turn_latency_ms": spread([r.latency_ms for r in ended if r.latency_ms is not None]),
        "complete_turn_silence_ms": spread([r.silence_ms for r in ended if r.silence_ms is not None]),
    }


def detectors() -> dict[str, Detector]:
    medium = policy_for("medium")
    found: dict[str, Detector] = {f"server_vad_{ms}ms": server_vad(ms) for ms in SERVER_VAD_MS}
    found["audio_model_alone"] = semantic(medium, words=False)
    found["words_alone"] = semantic(medium, audio=False)
    for eagerness in ("low", "medium", "high"):
        found[f"semantic_vad_{eagerness}"] = semantic(policy_for(eagerness))
    for eagerness in ("low", "medium", "high"):
        found[f"semantic_vad_{eagerness}_beside"] = semantic_beside(policy_for(eagerness))
    return found


def per_decision(utterances: list[Utterance]) -> dict[str, Any]:
    pauses = [pause for u in utterances for pause in u.pauses]
    figures: dict[str, Any] = {"decisions": len(pauses)}
    for name in ("words_ms", "model_ms", "asr_ms", "decision_ms"):
        values = [getattr(pause, name) for pause in pauses]
        figures[name] = {"p50": percentile(values, 0.5), "p90": percentile(values, 0.9)}
    return figures


def cough(seconds: float = 0.25, seed: int = 0) -> FloatAudio:
    """A cough-like burst: band-limited noise under a fast attack, slow decay envelope."""
    rng = np.random.default_rng(seed)
    samples = int(seconds * ASR_SAMPLE_RATE)
    noise = np.convolve(rng.standard_normal(samples), np.ones(8) / 8, mode="same")
    envelope = np.minimum(np.linspace(0, 8, samples), 1) * np.exp(-np.linspace(0, 5, samples))
    return (0.4 * noise * envelope / np.abs(noise).max()).astype(np.float32)


def interruptions(all_voices: list[Voice], recognizer: Any) -> dict[str, Any]:
    """Resume / cancel outcomes for backchannels, a cough, and real interruptions."""
    policy = InterruptionPolicy()
    heard: list[dict[str, Any]] = []
    spoken = [(text, "resume") for text in BACKCHANNELS] + [(text, "cancel") for text in INTERRUPTIONS]
    for voice in all_voices:
        for text, expected in spoken:
            transcript = recognizer.transcribe(voice.synthesize(text), quick=True)
            heard.append({"voice": voice.name, "said": text, "transcript": transcript, "expected": expected})
    for seed in range(3):
        transcript = recognizer.transcribe(cough(seed=seed), quick=True)
        heard.append({"voice": "noise", "said": "(cough)", "transcript": transcript, "expected": "resume"})
    for row in heard:
        row["outcome"] = policy.decide(row["transcript"])
    right = {kind: [r for r in heard if r["expected"] == kind] for kind in ("resume", "cancel")}
    return {
        "backchannels_resumed": f"{sum(r['outcome'] == 'resume' for r in right['resume'])}/{len(right['resume'])}",
        "interruptions_cancelled": f"{sum(r['outcome'] == 'cancel' for r in right['cancel'])}/{len(right['cancel'])}",
        "wrong": [r for r in heard if r["outcome"] != r["expected"]],
    }


def scores_against_cuts(utterances: list[Utterance]) -> dict[str, Any]:
    """Every detector's score against each kind of cut on its own (each set holds as many cuts as
    complete turns)."""
    against = {cut: [u for u in utterances if u.how in ("complete", cut)] for cut in HOW[1:]}
    return {
        cut: {name: score(subset, detector) for name, detector in detectors().items()}
        for cut, subset in against.items()
    }


def main(quick: bool, edge: Edge) -> dict[str, Any]:
    from schedulers.speech.asr import shared_recognizer
    from schedulers.speech.turn_model import TurnModel

    recognizer = shared_recognizer("faster-whisper")
    model = TurnModel(threads=1)
    load_before = os.getloadavg()[0]
    all_voices = voices(quick)
    tuned = [
        measure(text, complete, how, speech, voice.name, recognizer, model, edge)
        for voice in all_voices
        for whole, cut in (SENTENCES[:8] if quick else SENTENCES)
        for text, complete, how, speech in spoken(voice, whole, cut)
    ]
    held_out = [
        attrs.evolve(measure(text, complete, how, speech, voice.name, recognizer, model, edge), held_out=True)
        for voice in [*all_voices, *espeak_voices(HELD_OUT_ESPEAK_VOICES)]
        for whole, cut in (HELD_OUT[:4] if quick else HELD_OUT)
        for text, complete, how, speech in spoken(voice, whole, cut)
    ]
    utterances = [*tuned, *held_out]
    scores = scores_against_cuts(tuned)
    continuing = [u for u in utterances if u.how in ("complete", "cut, continuing")]
    by_voice = {
        voice: score([u for u in continuing if u.voice == voice], semantic(policy_for("medium")))
        for voice in sorted({u.voice for u in utterances})
    }
    return {
        "cpus": os.cpu_count(),
        "load_avg_before": load_before,
        "vad_edge": edge.name,
        "utterances": {how: sum(u.how == how for u in utterances) for how in HOW},
        "voices": sorted({u.voice for u in utterances}),
        "per_decision_ms": per_decision(utterances),
        "detectors": scores,
        "held_out": {
            "utterances": {how: sum(u.how == how for u in held_out) for how in HOW},
            "voices": sorted({u.voice for u in held_out}),
            "detectors": scores_against_cuts(held_out),
        },
        "semantic_vad_medium_by_voice_cut_continuing": by_voice,
        "false_interruptions": interruptions(all_voices, recognizer),
        "judged_pauses": [
            {
                "voice": u.voice,
                "text": u.text,
                "how": u.how,
                "complete": u.complete,
                "final": p.final,
                "transcript": p.transcript,
                "unfinished": p.unfinished,
                "probability": round(p.probability, 3),
                "early_probability": round(p.early_probability, 3),
                "held_out": u.held_out,
            }
            for u in utterances
            for p in u.pauses
        ],
        "load_avg_after": os.getloadavg()[0],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two voices and eight sentence pairs")
    parser.add_argument(
        "--precise-end", action="store_true", help="count pauses from the last voiced sample, as server_vad does"
    )
    parser.add_argument("--pause-ms", type=int, default=PAUSE_MS, help=f"judge turns at this pause ({PAUSE_MS})")
    parser.add_argument("--model-at-ms", type=int, default=EARLY_MS, help="the turn model scores at this silence")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the figures go")
    args = parser.parse_args()
    results = main(args.quick, Edge(args.precise_end, args.pause_ms, args.model_at_ms))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    report(results)
    print(f"wrote {args.out}")
