"""Whisper on a short encoder window, checked, for utterances of a few seconds.

faster-whisper 1.2 always pads the log-mel features to Whisper's 30 s window before encoding
(``chunk_length`` changes the feature extractor, not the encoder input), so a 2 s utterance
pays for a 30 s encoder pass, several times what a 6 s window costs
(``bench/results/code_figures.md``).  Whisper was trained on 30 s windows, though: on a short
window it sometimes repeats itself ("Hello? Hello? Hello? …") or loops on a phrase, and speech
that starts at the window's first frame is misheard more often ("term looked at" for "turn left
at").  So :class:`ShortWindowDecoder` encodes :data:`LEAD_S` of silence, the clip, then zero
features up to :data:`TAIL_S` past its end (at least :data:`MIN_WINDOW_S` in all), decodes
greedily with a token budget proportional to the audio, and returns None when the text looks
degenerate (budget exhausted, a phrase repeated, or zlib compression above faster-whisper's own
2.4 threshold).  The caller then runs the full 30 s decode: a failed shortcut costs time, not
accuracy.

This reaches into faster-whisper's model, tokenizer and feature extractor: the package is pinned
(``faster-whisper==1.2.1`` in the ``speech`` extra), and the tests cover the round trip.
"""

from __future__ import annotations

import math
import re
import zlib
from typing import Any

import numpy as np

from schedulers.speech.audio import ASR_SAMPLE_RATE, FloatAudio

MIN_WINDOW_S = 6
LEAD_S = 0.5
TAIL_S = 2.0
MAX_WINDOW_S = 20  # beyond this the full window costs little more; let faster-whisper segment it
FRAMES_PER_S = 100
TOKENS_PER_S = 8  # a generous ceiling for speech (≈3 words/s); more means the decoder is looping
COMPRESSION_LIMIT = 2.4
MAX_TOKENS = 448  # Whisper's decoder context
RESTART_WORDS = 4
_WORD = re.compile(r"[a-z0-9']+")


def window_seconds(samples: int) -> int:
    return max(MIN_WINDOW_S, math.ceil(LEAD_S + samples / ASR_SAMPLE_RATE + TAIL_S))


def degenerate(text: str) -> bool:
    """True for the short-window failure modes: repetition, or highly compressible text.

    Repetition is a run of :data:`RESTART_WORDS` words said twice anywhere (the decoder starting
    the text over; this covers every longer phrase repeated back to back) or a shorter phrase said
    twice back to back ("hello hello").
    """
    words = _WORD.findall(text.lower())
    runs = [tuple(words[i : i + RESTART_WORDS]) for i in range(len(words) - RESTART_WORDS + 1)]
    if len(set(runs)) < len(runs):
        return True
    for size in range(1, RESTART_WORDS):
        for start in range(len(words) - 2 * size + 1):
            if words[start : start + size] == words[start + size : start + 2 * size]:
                return True
    encoded = text.encode()
    return bool(encoded) and len(encoded) / len(zlib.compress(encoded)) > COMPRESSION_LIMIT


class ShortWindowDecoder:
    """Greedy English decode of a clip of at most :data:`MAX_WINDOW_S` − :data:`TAIL_S` seconds."""

    def __init__(self, whisper: Any) -> None:
        import ctranslate2
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        self._storage = ctranslate2.StorageView.from_array
        self._model = whisper.model
        self._features = whisper.feature_extractor
        multilingual = whisper.model.is_multilingual  # its prompt names the language and the task
        self._tokenizer = Tokenizer(whisper.hf_tokenizer, multilingual, task="transcribe", language="en")
        self._prompt = [*self._tokenizer.sot_sequence, self._tokenizer.no_timestamps]
        self._suppress = get_suppressed_tokens(self._tokenizer, [-1])

    def fits(self, samples: int) -> bool:
        return window_seconds(samples) <= MAX_WINDOW_S

    def transcribe(self, audio: FloatAudio) -> str | None:
        """The text, or None when this decode cannot be trusted (the caller decodes the full window)."""
        frames = window_seconds(audio.size) * FRAMES_PER_S
        lead = np.zeros(int(LEAD_S * ASR_SAMPLE_RATE), np.float32)
        features = self._features(np.concatenate([lead, audio]))[:, :frames]
        features = np.pad(features, ((0, 0), (0, frames - features.shape[1])))
        encoded = self._model.encode(self._storage(np.ascontiguousarray(features[np.newaxis])), to_cpu=False)
        budget = 4 + math.ceil(TOKENS_PER_S * audio.size / ASR_SAMPLE_RATE)
        result = self._model.generate(
            encoded,
            [self._prompt],
            beam_size=1,
            # Room for more than the budget (CTranslate2 stops well short of max_length), so that
            # reaching the budget is seen, rather than a transcript cut short being trusted.
            max_length=min(MAX_TOKENS, 2 * (len(self._prompt) + budget + 1)),
            suppress_blank=True,
            suppress_tokens=self._suppress,
        )[0]
        tokens = result.sequences_ids[0]  # without the prompt and the end-of-text token
        if len(tokens) >= budget:
            return None  # more text than this much speech can hold: the decoder is looping
        text = self._tokenizer.decode([t for t in tokens if t < self._tokenizer.eot]).strip()
        return None if degenerate(text) else text
