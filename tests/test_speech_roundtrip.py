"""TTS → ASR round trip: what Piper says, Whisper hears (word error rate ≤ 0.1 over 10 sentences)."""

from __future__ import annotations

import numpy as np
import pytest

from toys.speech_text import SENTENCES, heard_as, normalize, word_error_rate

pytestmark = pytest.mark.timeout(600)  # runs the speech models: past the global 120 s when busy


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
