"""Server-side voice activity detection with OpenAI ``server_vad`` semantics.

:class:`VoiceActivityDetector` is fed 16 kHz audio in pieces of any size and reports
``speech_started`` / ``speech_stopped`` events at absolute sample offsets in the stream:

* ``speech_started.sample`` is where speech was first detected, moved back by
  ``prefix_padding_ms``, but never before 0 nor before the previous turn's ``speech_stopped``
  (that audio belongs to the turn that ended): the start of the audio a model should hear, so
  speech that follows a turn closely starts a turn of its own;
* ``speech_stopped.sample`` is where ``silence_duration_ms`` of silence after the end of speech
  completed — the end of that audio, silence included.

The end of speech is not the end of the last frame scored as speech: a scorer's probability
decays over a few frames after the voice stops. When a turn's first silent frame comes, the end
is moved back to the last voiced sample of the ``REFINE_MS`` before it (:func:`last_voiced_sample`:
the last 5 ms window whose loudness is within ``VOICED_DB`` of the turn's loudest), so silences
(pauses, the stop) are counted from where the voice really stopped.  ``refine_end=False`` keeps the
scorer's edge for every silence (semantic end of turn: its pause length, silences and turn model
were tuned on that edge, and counted from the true end the same silences judge more mid-sentence
gaps and hesitations over); :attr:`~VoiceActivityDetector.voiced_silence` still says how long the
voice itself has been silent.

Events alternate, starting with ``speech_started``, and come in stream order.  With
``pause_ms`` set, a turn may also report ``speech_paused`` (``pause_ms`` of silence so far:
the turn *may* be ending, so a server can start preparing its answer) and ``speech_resumed``
(speech came back before ``speech_stopped``: whatever was prepared is stale).  A pause is
always followed by exactly one of ``speech_resumed`` or ``speech_stopped``.

With semantic end of turn the silence that ends a turn is decided at each pause: a caller
iterating :meth:`VoiceActivityDetector.events` gets ``speech_paused`` before any later frame is
scored, judges the turn (:attr:`~VoiceActivityDetector.turn_start` to the pause), and calls
:meth:`~VoiceActivityDetector.judge` with the silence in ms *this* pause needs to end the turn
(at most ``pause_ms`` ends it at once); speech coming back restores ``silence_duration_ms``.  The frame
scorer is Silero VAD (the ONNX model shipped in the ``silero-vad`` wheel, run by onnxruntime
with numpy: no torch, no download) or, when that is unavailable, a frame-energy detector.
A detector holds per-stream state: one per audio stream, used by one thread at a time.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from typing import Any, Literal, Protocol

import attrs
import numpy as np

from schedulers.speech.audio import ASR_SAMPLE_RATE, FloatAudio, as_float_audio
from schedulers.speech.packages import package_file

VadBackendName = Literal["auto", "silero", "energy"]
FRAME_SAMPLES = 512  # 32 ms at 16 kHz: the frame Silero VAD is trained on
_SILERO_CONTEXT = 64
_HYSTERESIS = 0.15  # speech continues while the score stays above threshold - 0.15 (Silero's own rule)
REFINE_MS = 160  # the end of speech is looked for this far back from the last frame scored as speech
REFINE_SAMPLES = REFINE_MS * ASR_SAMPLE_RATE // 1000
VOICED_DB = 30.0  # a window this far below the turn's loudest is not voice
VOICED_FLOOR = 10 ** (-55 / 20)  # RMS below -55 dBFS is never voice
WINDOW_SAMPLES = 80  # 5 ms


@attrs.frozen
class VadEvent:
    """A turn boundary: ``type`` and its absolute sample offset in the stream (16 kHz)."""

    type: Literal["speech_started", "speech_stopped", "speech_paused", "speech_resumed"]
    sample: int
    sample_rate: int = ASR_SAMPLE_RATE

    @property
    def ms(self) -> int:
        """The offset in milliseconds (OpenAI's ``audio_start_ms`` / ``audio_end_ms``)."""
        return self.sample * 1000 // self.sample_rate


class FrameScorer(Protocol):
    """Speech probability in [0, 1] for consecutive 512-sample frames of one stream."""

    def score(self, frame: FloatAudio) -> float: ...


class SileroModel:
    """The Silero VAD ONNX model shared by many streams; each stream gets a :meth:`scorer`."""

    def __init__(self) -> None:
        import onnxruntime

        path = package_file("silero_vad", "data/silero_vad.onnx", install_hint="pip install silero-vad")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = onnxruntime.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )

    def scorer(self) -> SileroScorer:
        return SileroScorer(self._session)


class SileroScorer:
    """Per-stream recurrent state of the Silero model (the LSTM state and 64 samples of context)."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros(_SILERO_CONTEXT, dtype=np.float32)
        self._rate = np.array(ASR_SAMPLE_RATE, dtype=np.int64)

    def score(self, frame: FloatAudio) -> float:
        window = np.concatenate([self._context, frame])[np.newaxis, :]
        probability, self._state = self._session.run(None, {"input": window, "state": self._state, "sr": self._rate})
        self._context = frame[-_SILERO_CONTEXT:].copy()
        return float(probability[0, 0])


class EnergyScorer:
    """Frame loudness mapped to [0, 1]: -60 dBFS RMS → 0, -20 dBFS → 1 (0.5 ≈ -40 dBFS).

    A fallback for quiet rooms; it cannot tell speech from other sounds.
    """

    def score(self, frame: FloatAudio) -> float:
        rms = float(np.sqrt(np.mean(np.square(frame, dtype=np.float64))))
        decibels = 20.0 * np.log10(max(rms, 1e-10))
        return float(np.clip((decibels + 60.0) / 40.0, 0.0, 1.0))


@functools.cache
def _silero_model() -> SileroModel:
    return SileroModel()


_model_lock = threading.Lock()


def new_scorer(backend: VadBackendName = "auto") -> FrameScorer:
    """A fresh per-stream scorer; ``auto`` is Silero when it loads, else energy."""
    match backend:
        case "energy":
            return EnergyScorer()
        case "silero":
            with _model_lock:
                return _silero_model().scorer()
        case "auto":
            try:
                return new_scorer("silero")
            except (ImportError, FileNotFoundError):
                return EnergyScorer()
        case _:
            raise ValueError(f"unknown VAD backend {backend!r}; expected auto, silero or energy")


def window_rms(audio: FloatAudio) -> np.ndarray:
    """RMS of each whole 5 ms window of ``audio``."""
    usable = audio.size - audio.size % WINDOW_SAMPLES
    windows = audio[:usable].reshape(-1, WINDOW_SAMPLES).astype(np.float64)
    return np.sqrt(np.mean(np.square(windows), axis=1))


def last_voiced_sample(tail: FloatAudio, loudest: float) -> int | None:
    """Where the voice in ``tail`` (audio ending at the last frame scored as speech) stops: the end
    of its last window whose RMS is within ``VOICED_DB`` of ``loudest`` (the turn's loudest window),
    as an offset into ``tail``; None when no window is (the scorer's end then stands).
    Windows are counted back from the end of ``tail``."""
    skip = tail.size % WINDOW_SAMPLES
    rms = window_rms(tail[skip:])
    voiced = np.flatnonzero(rms >= max(VOICED_FLOOR, loudest * 10 ** (-VOICED_DB / 20)))
    if voiced.size == 0:
        return None
    return skip + (int(voiced[-1]) + 1) * WINDOW_SAMPLES


def _check_unit(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number between 0 and 1, got {value!r}")
    return float(value)


def _check_ms(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer of milliseconds, got {value!r}")
    return value


class VoiceActivityDetector:
    """Streaming turn detection with OpenAI's ``server_vad`` parameters (defaults are OpenAI's)."""

    def __init__(
        self,
        *,
        threshold: float = 0.5,
        prefix_padding_ms: int = 300,
        silence_duration_ms: int = 500,
        backend: VadBackendName = "auto",
        scorer: FrameScorer | None = None,
        pause_ms: int | None = None,
        refine_end: bool = True,
    ) -> None:
        self.threshold = _check_unit("threshold", threshold)
        self.prefix_padding = _check_ms("prefix_padding_ms", prefix_padding_ms) * ASR_SAMPLE_RATE // 1000
        self.silence_samples = _check_ms("silence_duration_ms", silence_duration_ms) * ASR_SAMPLE_RATE // 1000
        self.pause_ms = None if pause_ms is None else _check_ms("pause_ms", pause_ms)
        self.pause_samples = None if self.pause_ms is None else self.pause_ms * ASR_SAMPLE_RATE // 1000
        self.scorer = scorer if scorer is not None else new_scorer(backend)
        self.refine_end = refine_end
        self._judged_silence: int | None = None  # samples: this pause's verdict, until speech resumes
        self._turn_start = 0
        self._paused = False
        self._pending = np.zeros(0, dtype=np.float32)
        self._consumed = 0  # samples scored so far
        self._speaking = False
        self._last_speech_end = 0
        self._voiced_end: int | None = None  # the last voiced sample, once the turn is silent
        self._last_stop = 0  # the previous turn's speech_stopped sample: no later turn starts before it
        self._recent = np.zeros(0, dtype=np.float32)  # the last frame scored and the REFINE_SAMPLES before it
        self._loudest = 0.0  # the turn's loudest 5 ms window (RMS)

    @property
    def speaking(self) -> bool:
        """True between a ``speech_started`` and the next ``speech_stopped``."""
        return self._speaking

    @property
    def turn_start(self) -> int:
        """Where the current (or last) turn starts: its ``speech_started`` sample."""
        return self._turn_start

    @property
    def silence(self) -> tuple[int, int]:
        """``(last_speech_end, samples of silence since)`` of the turn in progress; ``(0, 0)`` outside one."""
        if not self._speaking:
            return 0, 0
        return self._last_speech_end, self._consumed - self._last_speech_end

    @property
    def voiced_silence(self) -> int:
        """Samples since the last voiced sample of the turn in progress (0 while it is voiced, or
        outside a turn): :attr:`silence` as ``refine_end=True`` counts it, whatever ``refine_end`` is."""
        if not self._speaking or self._voiced_end is None:
            return 0
        return self._consumed - self._voiced_end

    def feed(self, audio: Any) -> list[VadEvent]:
        """Score the new audio (16 kHz mono) and return the events it completes, in order."""
        return list(self.events(audio))

    def events(self, audio: Any) -> Iterator[VadEvent]:
        """:meth:`feed`, one event at a time: the frames after an event are scored only when the
        next event is asked for, so a ``speech_paused`` can be judged (:meth:`judge`) before the
        detector goes on.  Iterate it to the end (the audio not scored yet is lost otherwise)."""
        samples = as_float_audio(audio)
        buffered = np.concatenate([self._pending, samples]) if self._pending.size else samples
        usable = buffered.size - buffered.size % FRAME_SAMPLES
        self._pending = buffered[usable:].copy()
        for start in range(0, usable, FRAME_SAMPLES):
            frame = buffered[start : start + FRAME_SAMPLES]
            probability = self.scorer.score(frame)
            frame_start = self._consumed
            self._consumed += FRAME_SAMPLES
            self._recent = np.concatenate([self._recent, frame])[-(REFINE_SAMPLES + FRAME_SAMPLES) :]
            if not self._speaking and probability >= self.threshold:
                self._speaking = True
                self._last_speech_end = self._consumed
                self._voiced_end = None
                self._loudest = float(window_rms(frame).max())
                self._turn_start = max(self._last_stop, frame_start - self.prefix_padding)
                yield VadEvent("speech_started", self._turn_start)
            elif self._speaking and probability >= self.threshold - _HYSTERESIS:
                self._last_speech_end = self._consumed
                self._voiced_end = None
                self._loudest = max(self._loudest, float(window_rms(frame).max()))
                if self._paused:
                    self._paused = False
                    self._judged_silence = None
                    yield VadEvent("speech_resumed", frame_start)
            elif self._speaking:
                yield from self._silent_frame()

    def judge(self, silence_ms: int) -> None:
        """The current pause needs ``silence_ms`` of silence (from the last speech) to end the turn;
        at most ``pause_ms`` ends it at the pause.  Holds until speech resumes; no pause, no effect."""
        if self._paused and self.pause_samples is not None:
            needed = _check_ms("silence_ms", silence_ms) * ASR_SAMPLE_RATE // 1000
            self._judged_silence = max(self.pause_samples, needed)

    def _silent_frame(self) -> Iterator[VadEvent]:
        """The turn's silence grew by a frame: maybe a pause, maybe the end of the turn."""
        if self._consumed - self._last_speech_end == FRAME_SAMPLES:  # the first silent frame
            self._voiced_end = self._find_voiced_end()
            if self.refine_end:
                self._last_speech_end = self._voiced_end
        silent = self._consumed - self._last_speech_end
        if silent >= self._needed_silence():
            yield self._stop()
        elif self.pause_samples is not None and not self._paused and silent >= self.pause_samples:
            self._paused = True
            yield VadEvent("speech_paused", self._last_speech_end + self.pause_samples)
            if silent >= self._needed_silence():  # judged complete at the pause
                yield self._stop()

    def _find_voiced_end(self) -> int:
        """The last voiced sample before this silent frame, within ``REFINE_MS``, never before the turn."""
        tail = self._recent[: self._recent.size - FRAME_SAMPLES]  # the audio up to the last speech frame
        found = last_voiced_sample(tail, self._loudest)
        if found is None:
            return self._last_speech_end
        return max(self._turn_start, self._last_speech_end - tail.size + found)

    def _needed_silence(self) -> int:
        return self.silence_samples if self._judged_silence is None else self._judged_silence

    def _stop(self) -> VadEvent:
        stopped = VadEvent("speech_stopped", self._last_speech_end + self._needed_silence())
        self._last_stop = stopped.sample
        self._speaking = self._paused = False
        self._judged_silence = None
        return stopped
