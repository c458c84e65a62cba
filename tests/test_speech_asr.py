"""ASR: batch transcription stage, the pocketsphinx fallback, streaming sessions with partials and VAD."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from omnitrio.contract import IncomingMessage, InvalidRequest, OmniRequest, OutgoingMessage, StagePayload

pytest.importorskip("piper", reason="the speech extra (piper-tts) is not installed")
pytest.importorskip("faster_whisper", reason="the speech extra (faster-whisper) is not installed")

from schedulers.speech.asr import language_name
from schedulers.speech.audio import resample
from schedulers.speech.stages import create_asr_stage, create_streaming_asr_stage
from schedulers.speech.streaming_asr import EARLY_MS
from schedulers.speech.tts import shared_synthesizer
from schedulers.speech.turn_end import JUDGE_AT_MS, policy_for
from schedulers.speech.vad import FRAME_SAMPLES, REFINE_MS
from tests.scheduler_harness import running
from toys.speech_text import heard_as

SENTENCE = "The quick brown fox jumps over the lazy dog."

pytestmark = pytest.mark.timeout(300)  # loads Whisper and Piper: past the global 120 s when busy


def words(text: str) -> list[str]:
    return "".join(c for c in text.lower() if c.isalnum() or c.isspace()).split()


@pytest.fixture(scope="module")
def speech_16k() -> np.ndarray:
    """About 3 s of synthesized speech at 16 kHz, the same samples on every run."""
    tts = shared_synthesizer(variation=0.0)
    return resample(tts.synthesize(SENTENCE), tts.sample_rate, 16_000)


@pytest.fixture(scope="module")
def asr_stage() -> Iterator[Any]:
    with running(create_asr_stage(), warm_up=True) as stage:
        yield stage


@pytest.fixture(scope="module")
def streaming_stage() -> Iterator[Any]:
    with running(create_streaming_asr_stage(partial_every_ms=700), warm_up=True) as stage:
        yield stage


def until_final(scheduler: Any, rid: str, timeout: float = 30) -> list[OutgoingMessage]:
    outputs: list[OutgoingMessage] = []
    deadline = time.monotonic() + timeout
    while not outputs or outputs[-1].type not in ("result", "error"):
        message = scheduler.outbox.get(timeout=max(0.0, deadline - time.monotonic()))
        assert message.request_id == rid
        outputs.append(message)
    return outputs


def transcription(rid: str, audio: Any, **extra: Any) -> IncomingMessage:
    inputs = {"task": "transcription", "audio": audio, "language": None, **extra}
    return IncomingMessage(rid, "new_request", StagePayload(rid, OmniRequest(), {"raw_inputs": inputs}))


def session(rid: str, op: str, sid: str, **extra: Any) -> IncomingMessage:
    metadata = {"session": {"op": op, "session_id": sid, **extra}}
    return IncomingMessage(rid, "new_request", StagePayload(rid, OmniRequest(metadata=metadata)))


def test_batch_asr_transcribes_synthesized_speech(asr_stage: Any, speech_16k: np.ndarray) -> None:
    asr_stage.inbox.put(transcription("t1", speech_16k))
    (result,) = until_final(asr_stage, "t1")
    assert heard_as(result.data.data["text"], SENTENCE)
    assert result.data.data["audio_ms"] == speech_16k.size * 1000 // 16_000


@pytest.mark.slow
def test_batch_asr_resamples_audio_given_with_its_rate(asr_stage: Any, speech_16k: np.ndarray) -> None:
    asr_stage.inbox.put(transcription("t24", resample(speech_16k, 16_000, 24_000), sample_rate=24_000))
    (result,) = until_final(asr_stage, "t24")
    assert heard_as(result.data.data["text"], SENTENCE)


def test_batch_asr_gives_timed_segments_and_words_when_asked(asr_stage: Any, speech_16k: np.ndarray) -> None:
    asr_stage.inbox.put(transcription("timed", speech_16k, timestamps="word"))
    (result,) = until_final(asr_stage, "timed")
    data = result.data.data
    seconds = speech_16k.size / 16_000
    assert data["language"] == "english" and heard_as(data["text"], SENTENCE)
    assert data["segments"] and all(0 <= s["start"] < s["end"] <= seconds + 0.5 for s in data["segments"])
    assert heard_as(" ".join(w["word"] for w in data["words"]), SENTENCE)
    assert [w["start"] for w in data["words"]] == sorted(w["start"] for w in data["words"])


def test_an_unsupported_language_is_the_callers_mistake_naming_the_ones_served(asr_stage: Any) -> None:
    asr_stage.inbox.put(transcription("fr", np.zeros(16_000, np.float32), language="fr"))
    (error,) = until_final(asr_stage, "fr")
    assert isinstance(error.data, InvalidRequest) and error.data.param == "language"
    assert "'fr' is not supported" in str(error.data) and "'en'" in str(error.data)


def test_batch_asr_rejects_missing_audio_by_name(asr_stage: Any) -> None:
    message = IncomingMessage("bad", "new_request", StagePayload("bad", OmniRequest(), {"raw_inputs": {"x": 1}}))
    asr_stage.inbox.put(message)
    (error,) = until_final(asr_stage, "bad")
    assert error.type == "error" and "'audio'" in str(error.data)


@pytest.mark.slow
def test_pocketsphinx_fallback_recognizes_most_words(speech_16k: np.ndarray) -> None:
    pytest.importorskip("pocketsphinx")
    from schedulers.speech.asr import shared_recognizer

    heard = words(shared_recognizer("pocketsphinx").transcribe(speech_16k))
    assert len(set(heard) & set(words(SENTENCE))) >= 6


@pytest.mark.slow
def test_streaming_asr_gives_partials_before_the_final_text(streaming_stage: Any, speech_16k: np.ndarray) -> None:
    streaming_stage.inbox.put(session("open", "open", "s1"))
    until_final(streaming_stage, "open")
    deltas: list[str] = []
    step = 4000  # 250 ms pieces, as a client streaming audio would send
    for index, start in enumerate(range(0, speech_16k.size, step)):
        rid = f"append{index}"
        streaming_stage.inbox.put(session(rid, "append", "s1", chunk=speech_16k[start : start + step]))
        outputs = until_final(streaming_stage, rid)  # one at a time: a real-time client waits between pieces
        deltas += [m.data for m in outputs if m.type == "stream" and (m.metadata or {}).get("modality") == "text"]
    streaming_stage.inbox.put(session("close", "close", "s1"))
    (result,) = until_final(streaming_stage, "close")
    assert deltas, "no partial transcript before the final one"
    assert heard_as(result.data.data["text"], SENTENCE)
    partial = words("".join(deltas))
    assert heard_as(" ".join(partial), " ".join(words(SENTENCE)[: len(partial)]))


def test_streaming_session_with_server_vad_reports_turn_boundaries(
    streaming_stage: Any, speech_16k: np.ndarray
) -> None:
    turn_detection = {"type": "server_vad", "silence_duration_ms": 300}
    config = {"sample_rate": 16_000, "partial_every_ms": None, "turn_detection": turn_detection}
    streaming_stage.inbox.put(session("vopen", "open", "v1", config=config))
    until_final(streaming_stage, "vopen")
    padded = np.concatenate([np.zeros(8000, np.float32), speech_16k, np.zeros(16000, np.float32)])
    streaming_stage.inbox.put(session("vappend", "append", "v1", chunk=padded))
    events = [m.data for m in until_final(streaming_stage, "vappend") if m.metadata and m.metadata["modality"] == "vad"]
    streaming_stage.inbox.put(session("vabort", "abort", "v1"))
    until_final(streaming_stage, "vabort")
    assert [event["type"] for event in events] == ["speech_started", "speech_stopped"]
    assert events[0]["audio_start_ms"] < 500 < events[1]["audio_end_ms"]


def semantic_session_events(streaming_stage: Any, sid: str, clip: np.ndarray) -> list[dict[str, Any]]:
    config = {"sample_rate": 16_000, "partial_every_ms": None, "turn_detection": {"type": "semantic_vad"}}
    streaming_stage.inbox.put(session(f"{sid}open", "open", sid, config=config))
    until_final(streaming_stage, f"{sid}open")
    streaming_stage.inbox.put(session(f"{sid}append", "append", sid, chunk=clip))
    outputs = until_final(streaming_stage, f"{sid}append")
    streaming_stage.inbox.put(session(f"{sid}abort", "abort", sid))
    until_final(streaming_stage, f"{sid}abort")
    return [m.data for m in outputs if m.metadata and m.metadata["modality"] == "vad"]


def test_semantic_vad_ends_a_complete_turn_after_a_short_silence(streaming_stage: Any) -> None:
    tts = shared_synthesizer(variation=0.0)
    speech = resample(tts.synthesize("What is the capital of France?"), tts.sample_rate, 16_000)
    clip = np.concatenate([np.zeros(4800, np.float32), speech, np.zeros(16_000, np.float32)])
    started, paused, judged, stopped = semantic_session_events(streaming_stage, "sem1", clip)
    types = (started["type"], paused["type"], judged["type"], stopped["type"])
    assert types == ("speech_started", "speech_paused", "turn_judged", "speech_stopped")
    # the transcript comes before the judgement, so an answer can be prepared while the model runs
    assert heard_as(paused["transcript"], "What is the capital of France?") and paused["unfinished"] is None
    assert judged["turn_complete"] and judged["probability"] >= 0.5 and judged["audio_ms"] == paused["audio_ms"]
    complete_silence = policy_for("auto").complete_silence_ms  # at most the pause: it ends at the judgement
    assert stopped["audio_end_ms"] - judged["audio_ms"] == max(0, complete_silence - JUDGE_AT_MS)


def test_semantic_vad_waits_when_the_words_are_unfinished(streaming_stage: Any) -> None:
    tts = shared_synthesizer(variation=0.0)
    speech = resample(tts.synthesize("I would like to book a table for"), tts.sample_rate, 16_000)
    clip = np.concatenate([np.zeros(4800, np.float32), speech, np.zeros(32_000, np.float32)])
    started, paused, judged = semantic_session_events(streaming_stage, "sem2", clip)  # 2 s of silence: not over yet
    assert (started["type"], paused["type"], judged["type"]) == ("speech_started", "speech_paused", "turn_judged")
    assert paused["unfinished"] == "ends on the preposition 'for'"
    assert not judged["turn_complete"] and judged["probability"] is None  # the words vetoed: no model


def streamed_semantic_events(streaming_stage: Any, sid: str, clip: np.ndarray) -> list[dict[str, Any]]:
    """The VAD events of a semantic_vad session fed ``clip`` in 40 ms pieces, as a microphone sends them."""
    config = {"sample_rate": 16_000, "partial_every_ms": None, "turn_detection": {"type": "semantic_vad"}}
    streaming_stage.inbox.put(session(f"{sid}open", "open", sid, config=config))
    until_final(streaming_stage, f"{sid}open")
    events = []
    for index, start in enumerate(range(0, clip.size, 640)):
        streaming_stage.inbox.put(session(f"{sid}a{index}", "append", sid, chunk=clip[start : start + 640]))
        outputs = until_final(streaming_stage, f"{sid}a{index}")
        events += [m.data for m in outputs if m.metadata and m.metadata["modality"] == "vad"]
    streaming_stage.inbox.put(session(f"{sid}abort", "abort", sid))
    until_final(streaming_stage, f"{sid}abort")
    return events


def test_semantic_vad_transcribes_a_turn_ahead_of_its_pause_and_judges_on_that_transcript(
    streaming_stage: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tts = shared_synthesizer(variation=0.0)
    speech = resample(tts.synthesize("What is the capital of France?"), tts.sample_rate, 16_000)
    clip = np.concatenate([np.zeros(4800, np.float32), speech, np.zeros(8_000, np.float32)])
    recognizer = streaming_stage.hooks.recognizer
    transcribe = recognizer.transcribe
    heard: list[int] = []

    def counted(audio: np.ndarray, *args: Any, **kwargs: Any) -> str:
        heard.append(audio.size)
        return transcribe(audio, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(recognizer, "transcribe", counted)
    started, paused, judged, _ = events = streamed_semantic_events(streaming_stage, "sem4", clip)
    assert [e["type"] for e in events] == ["speech_started", "speech_paused", "turn_judged", "speech_stopped"]
    assert heard_as(paused["transcript"], "What is the capital of France?") and paused["unfinished"] is None
    voiced = np.flatnonzero(np.abs(clip) > np.abs(clip).max() / 20)
    # silence counts from the last voiced sample, not from where the VAD's score decayed
    assert paused["audio_ms"] - (voiced[-1] + 1) / 16 < EARLY_MS + REFINE_MS
    assert len(heard) == 1  # one decode, made at 100 ms of silence, before the pause came:
    assert heard[0] == (paused["audio_ms"] - started["audio_start_ms"]) * 16
    assert paused["audio_ms"] <= judged["audio_ms"] - FRAME_SAMPLES // 16  # the words came frames ahead
    assert judged["turn_complete"] and judged["transcript"] == paused["transcript"]


def test_semantic_vad_takes_back_words_announced_ahead_of_a_pause_that_did_not_come(streaming_stage: Any) -> None:
    tts = shared_synthesizer(variation=0.0)
    said = [resample(tts.synthesize(text), tts.sample_rate, 16_000) for text in ("What is the capital", "of France?")]
    gap = np.zeros(1600, np.float32)  # 100 ms: silent long enough to be transcribed, too short to be a pause
    clip = np.concatenate([np.zeros(4800, np.float32), said[0], gap, said[1], np.zeros(8_000, np.float32)])
    events = streamed_semantic_events(streaming_stage, "sem5", clip)
    types = ["speech_started", "speech_paused", "speech_resumed", "speech_paused", "turn_judged"]
    assert [e["type"] for e in events][:5] == types, events
    assert heard_as(events[1]["transcript"], "What is the capital")
    assert events[1]["audio_ms"] <= events[2]["audio_ms"] < events[3]["audio_ms"] < events[4]["audio_ms"]
    assert "France" in events[3]["transcript"]  # the words announced again, all of them


def test_semantic_vad_names_a_bad_eagerness(streaming_stage: Any) -> None:
    config = {"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}
    streaming_stage.inbox.put(session("bad_open", "open", "sem3", config=config))
    (error,) = until_final(streaming_stage, "bad_open")
    assert error.type == "error" and "eagerness" in str(error.data)


def test_a_multilingual_models_language_is_named_from_whispers_own_table() -> None:
    pytest.importorskip("transformers", reason="Whisper's code-to-name table comes with transformers")
    assert [language_name(code) for code in ("en", "de", "zh", "haw")] == ["english", "german", "chinese", "hawaiian"]
