"""Which short-window transcripts are distrusted (and decoded again on the full window)."""

from __future__ import annotations

import pytest

from schedulers.speech.short_window import degenerate, window_seconds

pytestmark = pytest.mark.timeout(300)  # loads Whisper: past the global 120 s when busy


@pytest.mark.parametrize(
    "text",
    [
        "Hello? Hello? Hello?",
        "Stop please stop please",
        "The train to Boston leaves from platform 7. The train to Boston leaves",
        "la la la la la la la la la la la la la la la la la la la la la la la la la la",
    ],
)
def test_repeated_or_restarted_text_is_degenerate(text: str) -> None:
    assert degenerate(text)


@pytest.mark.parametrize(
    "text",
    [
        "Turn left at the second traffic light.",
        "Stop, please stop.",
        "The train to Boston leaves from platform 7. The library closes at 9. We need chairs for the room.",
        "",
    ],
)
def test_ordinary_sentences_are_trusted(text: str) -> None:
    assert not degenerate(text)


def test_the_window_covers_the_clip_plus_a_tail_and_never_less_than_the_minimum() -> None:
    assert window_seconds(16_000) == 6
    assert window_seconds(16_000 * 9) == 12


@pytest.mark.slow
def test_a_transcript_longer_than_its_budget_is_not_trusted_and_the_full_window_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("piper", reason="the speech extra (piper-tts) is not installed")
    pytest.importorskip("faster_whisper", reason="the speech extra (faster-whisper) is not installed")
    from schedulers.speech import short_window
    from schedulers.speech.asr import shared_recognizer
    from schedulers.speech.audio import resample
    from schedulers.speech.tts import shared_synthesizer
    from toys.speech_text import heard_as

    sentence = "Turn left at the second traffic light."
    tts, asr = shared_synthesizer(), shared_recognizer()
    clip = resample(tts.synthesize(sentence), tts.sample_rate, 16_000)
    decoder = short_window.ShortWindowDecoder(asr._model)  # type: ignore[attr-defined]
    heard = decoder.transcribe(clip)
    assert heard is not None and heard_as(heard, sentence)
    monkeypatch.setattr(short_window, "TOKENS_PER_S", 1)  # a budget of ~7 tokens for ~10 tokens of text
    assert decoder.transcribe(clip) is None
    assert heard_as(asr.transcribe(clip, quick=True), sentence)
