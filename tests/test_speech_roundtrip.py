"""TTS → ASR round trip: what Piper says, Whisper hears (word error rate ≤ 0.1 over 10 sentences)."""

from __future__ import annotations

import re

import numpy as np
import pytest

SENTENCES = [
    "The meeting starts at 10 in the morning.",
    "Please send the report to my office before Friday.",
    "She bought 3 apples and 2 oranges at the market.",
    "The train to Boston leaves from platform 7.",
    "Turn left at the second traffic light.",
    "My phone battery is almost empty.",
    "We need 25 chairs for the conference room.",
    "The weather will be sunny and warm tomorrow.",
    "Can you remind me to call my sister tonight?",
    "The library closes at 9 on weekdays.",
]

_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
_ONES += "seventeen eighteen nineteen"
ONES = _ONES.split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_words(n: int) -> str:
    """English words for 0 ≤ n < 10000 (enough for these sentences)."""
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else " " + ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + number_words(rest))
    rest = n % 1000
    return number_words(n // 1000) + " thousand" + ("" if rest == 0 else " " + number_words(rest))


def normalize(text: str) -> list[str]:
    """Lower case, digits spelled out, punctuation and hyphens dropped."""
    text = re.sub(r"\d+", lambda m: f" {number_words(int(m.group()))} ", text.lower())
    return re.sub(r"[^a-z' ]+", " ", text).split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    """(substitutions + deletions + insertions) / reference words, by edit distance over words."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    distance = list(range(len(hyp) + 1))
    for i, ref_word in enumerate(ref, 1):
        previous, distance[0] = distance[0], i
        for j, hyp_word in enumerate(hyp, 1):
            previous, distance[j] = (
                distance[j],
                min(distance[j] + 1, distance[j - 1] + 1, previous + (ref_word != hyp_word)),
            )
    return distance[len(hyp)] / max(len(ref), 1)


def heard_as(heard: str, said: str) -> bool:
    """Whisper heard what was said, up to one word in five, and two in a sentence of six words or
    more: synthesized speech differs run to run, and an odd word ("2nd" for "second") is not what
    these tests are about.  The first two words are misheard together now and then ("current
    left", "term looked" for "turn left" in fresh-clone CI runs)."""
    words = len(normalize(said))
    allowed = max(words // 5, 2 if words >= 6 else 0)
    return round(word_error_rate(said, heard) * words) <= allowed


def test_heard_as_allows_one_word_in_five_and_two_in_six_or_more() -> None:
    said = "Turn left at the second traffic light."
    assert heard_as("term looked at the second traffic light", said)
    assert not heard_as("term looked at the first traffic light", said)
    assert heard_as("gate seven please", "Gate 7, please.") and not heard_as("gate eleven please", "gate 7 please")


def test_word_error_rate_counts_edits_after_normalising() -> None:
    assert word_error_rate("Gate 7, please.", "gate seven please") == 0.0
    assert word_error_rate("a b c d", "a x c") == 0.5  # one substitution, one deletion


@pytest.mark.slow
def test_speech_round_trip_over_ten_sentences_has_low_word_error_rate() -> None:
    pytest.importorskip("piper", reason="the speech extra (piper-tts) is not installed")
    pytest.importorskip("faster_whisper", reason="the speech extra (faster-whisper) is not installed")
    from schedulers.speech.asr import shared_recognizer
    from schedulers.speech.audio import resample
    from schedulers.speech.tts import shared_synthesizer, synthesize_sentences

    tts, asr = shared_synthesizer(), shared_recognizer()
    text = " ".join(SENTENCES)
    clips = list(synthesize_sentences(tts, text))
    assert len(clips) == len(SENTENCES)
    audio = resample(np.concatenate(clips), tts.sample_rate, 16_000)
    heard = asr.transcribe(audio)
    wer = word_error_rate(text, heard)
    print(f"\nround trip WER {wer:.3f} over {len(normalize(text))} words; heard: {heard}")
    assert wer <= 0.1


@pytest.mark.slow
def test_quick_transcription_of_each_sentence_keeps_the_word_error_rate_low() -> None:
    """A realtime turn's transcript (``quick=True``: the short encoder window) is nearly as good."""
    pytest.importorskip("piper", reason="the speech extra (piper-tts) is not installed")
    pytest.importorskip("faster_whisper", reason="the speech extra (faster-whisper) is not installed")
    from schedulers.speech.asr import shared_recognizer
    from schedulers.speech.audio import resample
    from schedulers.speech.tts import shared_synthesizer

    tts, asr = shared_synthesizer(), shared_recognizer()
    heard = [asr.transcribe(resample(tts.synthesize(s), tts.sample_rate, 16_000), quick=True) for s in SENTENCES]
    wer = word_error_rate(" ".join(SENTENCES), " ".join(heard))
    print(f"\nquick WER {wer:.3f}; heard: {heard}")
    assert wer <= 0.1
