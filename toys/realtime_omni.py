"""Realtime sessions with the omni models, for the tests and the benchmark: the served pipeline, spoken turns,
references.

:func:`serve_omni` runs ``python -m omnitrio serve --config CONFIG --model DIR`` (Qwen3-Omni's config unless
told another, e.g. :data:`QWEN2_5_CONFIG`; greedy talker, as the equality tests need); :func:`spoken` says a
sentence with the project's Piper voice, deterministic, as PCM16 24 kHz (a realtime client's audio);
:func:`as_heard` brings PCM16 24 kHz to the feature extractor's 16 kHz the way the server does
(``schedulers.media.decode_audio``), for the reference ``generate``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from omnitrio.serve.audio import REALTIME_RATE, float_to_pcm16, pcm16_to_float, resample
from toys.browser import ROOT, Server, served

CONFIG = ROOT / "configs" / "qwen3-omni.toml"
QWEN2_5_CONFIG = ROOT / "configs" / "qwen2.5-omni.toml"
QWEN2_5_GREEDY = ("talker.factory.do_sample=false",)  # its talker speaks until its codec's end, as generate's
TALKER_TOKENS = 24
GREEDY = (
    "talker.factory.do_sample=false",
    f"talker.factory.max_new_tokens={TALKER_TOKENS}",
    "talker.factory.min_new_tokens=2",  # what toys.qwen3_omni_reference passes generate
)
START_TIMEOUT = 600.0  # five stage processes import transformers: slow on a busy machine


@contextlib.contextmanager
def serve_omni(
    model_dir: Path, overrides: Sequence[str] = GREEDY, args: Sequence[str] = (), *, config: Path = CONFIG
) -> Iterator[Server]:
    """The pipeline of ``config`` on ``model_dir``, served on a free loopback port until the block ends."""
    command = ["--config", str(config), "--model", str(model_dir), *args]
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


QWEN2_5_CLIENT_OVERRIDES = (
    "talker.factory.do_sample=false",
    "thinker.factory.max_new_tokens=32",
    "talker.factory.min_new_tokens=320",  # 6.4 s at its 50 codes a second, as Qwen3-Omni's 80 frames
    "talker.factory.max_new_tokens=384",
)


@attrs.frozen
class Family:
    """An omni model family as the realtime tests serve it: its config, its tiny checkpoint, the overrides
    that make every client's answer long enough to speak over."""

    config: Path
    write_checkpoint: Callable[[Path], Path]
    client_overrides: tuple[str, ...]

    @contextlib.contextmanager
    def serve_for_clients(self, model_dir: Path) -> Iterator[Server]:
        with serve_omni(model_dir, self.client_overrides, config=self.config) as server:
            yield server


def _qwen3_omni(directory: Path) -> Path:
    from schedulers.qwen3_omni.tiny import write_checkpoint

    return write_checkpoint(directory, size="tiny")


def _qwen2_5_omni(directory: Path) -> Path:
    from schedulers.qwen2_5_omni.tiny import write_checkpoint

    return write_checkpoint(directory, size="tiny")


FAMILIES = {
    "qwen3-omni": Family(CONFIG, _qwen3_omni, CLIENT_OVERRIDES),
    "qwen2.5-omni": Family(QWEN2_5_CONFIG, _qwen2_5_omni, QWEN2_5_CLIENT_OVERRIDES),
}


def client_run(script: str, family: Family, model_dir: Path, folder: Path) -> list[dict[str, Any]]:
    """A realtime client script (``toys/realtime_clients/SCRIPT.py``) through its turns against ``family``'s
    pipeline on ``model_dir``, its speech said by :func:`spoken`; the JSON lines it printed."""
    from toys.realtime_clients.drive import run_client, write_settings

    with family.serve_for_clients(model_dir) as server:
        settings = write_settings(folder, server.url, say=lambda text: spoken(text, silence_before=0.0))
        return run_client(script, settings)
