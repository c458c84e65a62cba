"""Smart Turn v3.2: the probability that a speaker has finished their turn, from the audio alone.

The model (BSD-2-Clause, 8.7 MB ONNX) ships inside the ``pipecat-ai`` wheel, which is installed
``--no-deps`` from ``requirements/weights.txt`` only for that file: pipecat itself is never imported.
It was trained on Whisper-style log-mel features of the last 8 s of a turn, so
:meth:`TurnModel.probability_complete` feeds it exactly that:

* 16 kHz mono float audio (PCM16 is scaled), the end of the turn (its pause included) last;
* only the last 8 s are kept, a shorter turn is left-padded with zeros to 8 s;
* the waveform is normalised to zero mean and unit variance (Whisper's ``do_normalize``);
* 80 log-mel bins every 10 ms (faster-whisper's feature extractor, ``chunk_length=8``): 800 frames.

The answer is in [0, 1]; above 0.5 the model judges the turn complete.  The ONNX session runs
on one intra-op thread by default, so parallel callers (several realtime sessions) share cores
instead of oversubscribing them.  A :class:`TurnModel` is safe to call from several threads at once.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any

import numpy as np

from schedulers.speech.audio import ASR_SAMPLE_RATE, FloatAudio, as_float_audio
from schedulers.speech.packages import package_file

TURN_MODEL_PACKAGE = "pipecat"
TURN_MODEL_FILE = "audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
INSTALL_HINT = "pip install --no-deps --require-hashes -r requirements/weights.txt"
WINDOW_SECONDS = 8
WINDOW_SAMPLES = WINDOW_SECONDS * ASR_SAMPLE_RATE
_NORMALIZE_EPSILON = 1e-7  # Whisper's zero-mean unit-variance guard


def turn_model_path() -> Path:
    """The Smart Turn v3.2 ONNX file inside the installed ``pipecat-ai`` wheel (never imported)."""
    return package_file(TURN_MODEL_PACKAGE, TURN_MODEL_FILE, install_hint=INSTALL_HINT)


def last_window(audio: Any) -> FloatAudio:
    """The last 8 s of ``audio`` (16 kHz mono), left-padded with zeros to exactly 8 s."""
    samples = as_float_audio(audio)[-WINDOW_SAMPLES:]
    if samples.size == WINDOW_SAMPLES:
        return samples
    return np.concatenate([np.zeros(WINDOW_SAMPLES - samples.size, dtype=np.float32), samples])


class TurnModel:
    """The Smart Turn ONNX session and its feature extractor (load once, share across sessions)."""

    def __init__(self, model_path: str | Path | None = None, *, threads: int = 1) -> None:
        import onnxruntime
        from faster_whisper.feature_extractor import FeatureExtractor

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        path = turn_model_path() if model_path is None else Path(model_path)
        self._session = onnxruntime.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._input = self._session.get_inputs()[0].name
        self._features = FeatureExtractor(feature_size=80, sampling_rate=ASR_SAMPLE_RATE, chunk_length=WINDOW_SECONDS)

    def features(self, audio_16k: Any) -> np.ndarray:
        """The model's input for one turn: float32 log-mel features of shape (1, 80, 800)."""
        window = last_window(audio_16k)
        window = (window - window.mean()) / np.sqrt(window.var() + _NORMALIZE_EPSILON)
        log_mel = self._features(window.astype(np.float32), padding=0)
        return np.asarray(log_mel, dtype=np.float32)[np.newaxis, :, :]

    def probability_complete(self, audio_16k: Any) -> float:
        """How sure the model is that the turn in ``audio_16k`` (16 kHz mono, newest last) is over.

        Raises ``ValueError`` when the audio is not mono float or int16 samples.
        """
        (output,) = self._session.run(None, {self._input: self.features(audio_16k)})
        return float(np.clip(output.reshape(-1)[0], 0.0, 1.0))


_shared_lock = threading.Lock()


@functools.cache
def _shared(threads: int) -> TurnModel:
    return TurnModel(threads=threads)


def shared_turn_model(threads: int = 1) -> TurnModel:
    """One loaded model per process (per thread count), shared by every session that asks."""
    with _shared_lock:
        return _shared(threads)
