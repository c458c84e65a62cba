"""Voice activity detection: speech start/stop in a synthesized clip padded with silence."""

from __future__ import annotations

import numpy as np
import pytest

from schedulers.speech.audio import resample
from schedulers.speech.vad import EnergyScorer, VadEvent, VoiceActivityDetector

LEAD, TAIL = 16_000, 24_000  # 1 s of silence before, 1.5 s after

pytestmark = pytest.mark.timeout(300)  # loads Silero VAD and Piper: past the global 120 s when busy


@pytest.fixture(scope="module")
def padded_speech() -> tuple[np.ndarray, int]:
    """A TTS sentence at 16 kHz between silences (and where the silence before it ends)."""
    pytest.importorskip("piper", reason="the speech extra (piper-tts) is not installed")
    from schedulers.speech.tts import shared_synthesizer

    tts = shared_synthesizer()
    speech = resample(tts.synthesize("Hello there, how are you today?"), tts.sample_rate, 16_000)
    return np.concatenate([np.zeros(LEAD, np.float32), speech, np.zeros(TAIL, np.float32)]), LEAD


def feed_in_pieces(detector: VoiceActivityDetector, clip: np.ndarray, piece: int = 1600) -> list[VadEvent]:
    events: list[VadEvent] = []
    for start in range(0, clip.size, piece):
        events += detector.feed(clip[start : start + piece])
    return events


@pytest.mark.parametrize("backend", ["silero", "energy"])
def test_vad_reports_speech_start_and_stop_around_the_sentence(
    backend: str, padded_speech: tuple[np.ndarray, int]
) -> None:
    if backend == "silero":
        pytest.importorskip("onnxruntime")
    clip, _ = padded_speech
    detector = VoiceActivityDetector(backend=backend, prefix_padding_ms=300, silence_duration_ms=500)  # type: ignore[arg-type]
    started, stopped = feed_in_pieces(detector, clip)
    loud = np.flatnonzero(np.abs(clip) > 0.01)
    assert (started.type, stopped.type) == ("speech_started", "speech_stopped")
    # Start: the first audible sample minus the 300 ms prefix padding, within a few frames.
    assert abs(started.sample - (loud[0] - 4800)) <= 3 * 512
    # Stop: the last audible sample plus the 500 ms of silence that confirms the turn ended.
    assert abs(stopped.sample - (loud[-1] + 8000)) <= 3 * 512


ENDINGS = [
    "Please send the report before Friday.",
    "Turn left at the second traffic light.",
    "What is the weather in Paris?",
]


def voices() -> list[object]:
    """Piper (deterministic) and espeak-ng (installed with apt if missing), whichever can be had."""
    from schedulers.speech.tts import EspeakSynthesizer, PiperSynthesizer
    from toys.debian import ensure

    ensure("espeak-ng", "espeak-ng")

    found: list[object] = []
    for make in (lambda: PiperSynthesizer(variation=0.0), EspeakSynthesizer):
        try:
            found.append(make())
        except (ImportError, FileNotFoundError):
            continue
    return found


@pytest.mark.parametrize("text", ENDINGS)
def test_the_end_of_speech_is_the_last_voiced_sample_not_the_scores_decay(text: str) -> None:
    pytest.importorskip("onnxruntime")
    synthesizers = voices()
    if not synthesizers:
        pytest.skip("neither piper-tts nor espeak-ng is installed")
    for tts in synthesizers:
        speech = resample(tts.synthesize(text), tts.sample_rate, 16_000)  # type: ignore[attr-defined]
        clip = np.concatenate([np.zeros(LEAD, np.float32), speech, np.zeros(TAIL, np.float32)])
        loud = np.abs(clip)
        last_voiced = int(np.flatnonzero(loud > loud.max() / 20)[-1]) + 1
        detector = VoiceActivityDetector(backend="silero", silence_duration_ms=500)
        (stopped,) = [event for event in feed_in_pieces(detector, clip) if event.type == "speech_stopped"]
        speech_end = stopped.sample - detector.silence_samples
        assert abs(speech_end - last_voiced) <= 1.5 * 512, tts.name  # type: ignore[attr-defined]


def test_silence_alone_produces_no_events() -> None:
    detector = VoiceActivityDetector(backend="energy")
    assert feed_in_pieces(detector, np.zeros(48_000, np.float32)) == []


def test_event_offsets_do_not_depend_on_piece_size(padded_speech: tuple[np.ndarray, int]) -> None:
    clip, _ = padded_speech
    small = feed_in_pieces(VoiceActivityDetector(scorer=EnergyScorer()), clip, piece=333)
    large = feed_in_pieces(VoiceActivityDetector(scorer=EnergyScorer()), clip, piece=16_000)
    assert small == large


def test_event_ms_follows_openai_fields() -> None:
    assert VadEvent("speech_started", 24_000).ms == 1500


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"threshold": 1.5}, "threshold"),
        ({"prefix_padding_ms": -1}, "prefix_padding_ms"),
        ({"silence_duration_ms": 0.5}, "silence_duration_ms"),
    ],
)
def test_bad_server_vad_parameters_are_named(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        VoiceActivityDetector(backend="energy", **kwargs)  # type: ignore[arg-type]


def tone(seconds: float) -> np.ndarray:
    return (0.3 * np.sin(np.arange(int(16_000 * seconds)) * 0.2)).astype(np.float32)


def quiet(seconds: float) -> np.ndarray:
    return np.zeros(int(16_000 * seconds), np.float32)


def judged_events(detector: VoiceActivityDetector, clip: np.ndarray, verdicts: list[int]) -> list[VadEvent]:
    """Feed ``clip`` (in one piece): each ``speech_paused`` is judged with the next verdict before
    the detector goes on."""
    judged = iter(verdicts)
    events: list[VadEvent] = []
    for event in detector.events(clip):
        events.append(event)
        if event.type == "speech_paused":
            detector.judge(next(judged))
    return events


def test_a_judged_pause_sets_the_silence_that_ends_the_turn() -> None:
    # "not over" at the first pause, "complete" at the second
    detector = VoiceActivityDetector(scorer=EnergyScorer(), prefix_padding_ms=0, silence_duration_ms=4000, pause_ms=200)
    clip = np.concatenate([quiet(0.5), tone(1.0), quiet(0.5), tone(0.5), quiet(2.0)])
    events = judged_events(detector, clip, [1000, 250])
    assert [e.type for e in events] == [
        "speech_started",
        "speech_paused",
        "speech_resumed",
        "speech_paused",
        "speech_stopped",
    ]
    started, _, _, second_pause, stopped = events
    assert detector.turn_start == started.sample
    assert stopped.sample - (second_pause.sample - 3200) == 4000  # 250 ms after the speech, not 4 s


def test_a_pause_judged_complete_at_once_stops_the_turn_there() -> None:
    detector = VoiceActivityDetector(scorer=EnergyScorer(), pause_ms=200)
    events = judged_events(detector, np.concatenate([quiet(0.5), tone(1.0), quiet(1.0)]), [0])
    assert [e.type for e in events] == ["speech_started", "speech_paused", "speech_stopped"]
    assert events[1].sample == events[2].sample


def test_an_unjudged_pause_waits_the_configured_silence() -> None:
    detector = VoiceActivityDetector(scorer=EnergyScorer(), silence_duration_ms=500, pause_ms=200)
    events = detector.feed(np.concatenate([quiet(0.5), tone(1.0), quiet(1.0)]))
    assert [e.type for e in events] == ["speech_started", "speech_paused", "speech_stopped"]
    assert events[2].sample - events[1].sample == 300 * 16


def test_a_verdict_must_be_a_non_negative_integer_of_milliseconds() -> None:
    detector = VoiceActivityDetector(scorer=EnergyScorer(), pause_ms=200)
    events = detector.events(np.concatenate([quiet(0.5), tone(1.0), quiet(0.3)]))
    assert [next(events).type, next(events).type] == ["speech_started", "speech_paused"]
    with pytest.raises(ValueError, match="silence_ms"):
        detector.judge(-1)


@pytest.mark.parametrize("gap", [0.2, 0.3, 0.45])
def test_speech_soon_after_a_turn_starts_a_turn_of_its_own_where_the_last_one_stopped(gap: float) -> None:
    # Speech `gap` s after a turn ended: its prefix padding (300 ms) would reach into that turn.
    detector = VoiceActivityDetector(scorer=EnergyScorer(), prefix_padding_ms=300, silence_duration_ms=500)
    clip = np.concatenate([quiet(0.5), tone(1.0), quiet(0.5 + gap), tone(0.5), quiet(1.0)])
    events = detector.feed(clip)
    assert [e.type for e in events] == ["speech_started", "speech_stopped"] * 2
    _, stopped, again, _ = events
    assert stopped.sample <= again.sample <= 16_000 * (2 + gap)  # not inside the last turn, nor after the voice
