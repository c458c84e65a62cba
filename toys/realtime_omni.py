"""Realtime sessions with Qwen3-Omni, for the tests and the benchmark: the served pipeline, spoken turns, references.

:func:`serve_qwen3_omni` runs ``python -m omnitrio serve --config configs/qwen3-omni.toml --model DIR``
(greedy talker, as the equality tests need); :func:`spoken` says a sentence with the project's Piper
voice, deterministic, as PCM16 24 kHz (a realtime client's audio); :func:`as_heard` brings PCM16
24 kHz to the feature extractor's 16 kHz the way the server does (``schedulers.media.decode_audio``),
for the reference ``generate``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from omnitrio.serve.audio import REALTIME_RATE, float_to_pcm16, pcm16_to_float, resample
from toys.browser import ROOT, Server, served

CONFIG = ROOT / "configs" / "qwen3-omni.toml"
TALKER_TOKENS = 24
GREEDY = (
    "talker.factory.do_sample=false",
    f"talker.factory.max_new_tokens={TALKER_TOKENS}",
    "talker.factory.min_new_tokens=2",  # what toys.qwen3_omni_reference passes generate
)
START_TIMEOUT = 600.0  # five stage processes import transformers: slow on a busy machine


@contextlib.contextmanager
def serve_qwen3_omni(model_dir: Path, overrides: Sequence[str] = GREEDY, args: Sequence[str] = ()) -> Iterator[Server]:
    """The Qwen3-Omni pipeline on ``model_dir``, served on a free loopback port until the block ends."""
    command = ["--config", str(CONFIG), "--model", str(model_dir), *args]
    for override in overrides:
        command += ["--set", override]
    with served(command, timeout=START_TIMEOUT) as server:
        yield server


@functools.cache
def _voice() -> object:
    from schedulers.speech.tts import PiperSynthesizer

    return PiperSynthesizer(threads=1, variation=0.0)


def spoken(text: str, *, silence_before: float = 0.2, silence_after: float = 0.0) -> bytes:
    """``text`` said by the project's Piper voice (the same samples every time), PCM16 24 kHz, with silence around."""
    voice = _voice()
    samples = resample(voice.synthesize(text), voice.sample_rate, REALTIME_RATE)  # type: ignore[attr-defined]
    before, after = bytes(2 * int(silence_before * REALTIME_RATE)), bytes(2 * int(silence_after * REALTIME_RATE))
    return before + float_to_pcm16(np.asarray(samples, dtype=np.float32)) + after


def as_heard(pcm16: bytes) -> np.ndarray:
    """PCM16 24 kHz as the model's preprocessing hears it: float samples at 16 kHz, resampled as the server does."""
    from schedulers.media import AUDIO_RATE
    from schedulers.media import resample as model_resample

    return model_resample(pcm16_to_float(pcm16), REALTIME_RATE, AUDIO_RATE)


NO_ASR = 'serves=["chat", "realtime"]'  # the pipeline without input transcription
CLIENT_OVERRIDES = (
    "talker.factory.do_sample=false",
    "thinker.factory.max_new_tokens=32",
    "talker.factory.min_new_tokens=80",  # every answer long enough (6.4 s) to speak over, short enough a turn
    "talker.factory.max_new_tokens=96",
)


def client_run(script: str, model_dir: Path, folder: Path) -> list[dict[str, Any]]:
    """A realtime client script (``toys/realtime_clients/SCRIPT.py``) through its turns against Qwen3-Omni
    on ``model_dir``, its speech said by :func:`spoken`; the JSON lines it printed."""
    from toys.realtime_clients.drive import run_client, write_settings

    with serve_qwen3_omni(model_dir, CLIENT_OVERRIDES) as server:
        settings = write_settings(folder, server.url, say=lambda text: spoken(text, silence_before=0.0))
        return run_client(script, settings)
