"""Semantic end of turn on synthesized speech: Smart Turn v3.2 fed by our features, and the combined decision."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from schedulers.speech.audio import ASR_SAMPLE_RATE, float_to_pcm16, resample
from schedulers.speech.turn_end import SemanticTurnDetector
from schedulers.speech.turn_model import WINDOW_SAMPLES, last_window
from toys.debian import ensure

PAUSE = np.zeros(ASR_SAMPLE_RATE // 5, dtype=np.float32)  # the 200 ms pause a decision is taken at

pytestmark = pytest.mark.timeout(300)  # loads Smart Turn and Piper: past the global 120 s when busy


@pytest.fixture(scope="module")
def model() -> Any:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("faster_whisper", reason="the speech extra is not installed")
    from schedulers.speech.turn_model import shared_turn_model

    return shared_turn_model()


@pytest.fixture(scope="module")
def speak() -> Any:
    pytest.importorskip("piper", reason="the speech extra (piper-tts) is not installed")
    from schedulers.speech.tts import PiperSynthesizer

    tts = PiperSynthesizer(threads=1, variation=0.0)
    return lambda text: np.concatenate([resample(tts.synthesize(text), tts.sample_rate, ASR_SAMPLE_RATE), PAUSE])


def test_the_model_sees_the_last_eight_seconds_left_padded() -> None:
    short = np.ones(ASR_SAMPLE_RATE, dtype=np.float32)
    window = last_window(short)
    assert window.size == WINDOW_SAMPLES and not window[:-ASR_SAMPLE_RATE].any() and window[-1] == 1.0
    long = np.arange(10 * ASR_SAMPLE_RATE, dtype=np.float32)
    assert np.array_equal(last_window(long), long[-WINDOW_SAMPLES:])


def test_a_complete_sentence_sounds_complete(model: Any, speak: Any) -> None:
    audio = speak("What is the capital of France?")
    probability = model.probability_complete(audio)
    assert probability > 0.8
    pcm16 = float_to_pcm16(audio)
    assert model.probability_complete(pcm16) == pytest.approx(probability, abs=0.02)
    assert model.features(audio).shape == (1, 80, 800)


def test_a_complete_turn_ends_after_a_short_silence(model: Any, speak: Any) -> None:
    detector = SemanticTurnDetector("medium", model=model)
    audio = speak("Can you tell me about the weather in Paris?")
    decision = detector.decide(audio, "Can you tell me about the weather in Paris?", silence_ms=200)
    assert decision.judgement.complete and decision.judgement.probability is not None
    assert not decision.end and decision.wait_ms == 50
    assert detector.decide(audio, "Can you tell me about the weather in Paris?", silence_ms=250).end


def test_a_turn_cut_on_a_preposition_waits_without_running_the_model(speak: Any) -> None:
    from schedulers.speech.asr import shared_recognizer

    audio = speak("I would like to book a table for")
    transcript = shared_recognizer("faster-whisper").transcribe(audio, quick=True)
    unused = object()  # the words veto first: the audio model is never asked
    decision = SemanticTurnDetector("high", model=unused).decide(audio, transcript, silence_ms=200)  # type: ignore[arg-type]
    assert not decision.end and decision.wait_ms == 1800
    assert decision.judgement.probability is None and "'for'" in str(decision.judgement.unfinished)


def test_espeak_voice_complete_sentence(model: Any) -> None:
    if (missing := ensure("espeak-ng", "espeak-ng")) is not None:
        pytest.skip(missing)
    from schedulers.speech.tts import EspeakSynthesizer

    tts = EspeakSynthesizer()
    audio = np.concatenate(
        [resample(tts.synthesize("Please send the report to my manager."), tts.sample_rate, ASR_SAMPLE_RATE), PAUSE]
    )
    decision = SemanticTurnDetector("auto", model=model).decide(audio, "Please send the report to my manager.", 300)
    assert decision.end and decision.judgement.complete


def test_bad_arguments_are_named(model: Any) -> None:
    detector = SemanticTurnDetector("low", model=model)
    with pytest.raises(ValueError, match="silence_ms"):
        detector.decide(np.zeros(100, dtype=np.float32), "", -1)
    with pytest.raises(ValueError, match="eagerness"):
        SemanticTurnDetector("fast", model=model)  # type: ignore[arg-type]
