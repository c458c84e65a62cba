"""False interruptions: was what the user said over the assistant a backchannel or a real turn?

While the assistant speaks, speech from the user first *pauses* the response; once what was
heard is transcribed, :meth:`InterruptionPolicy.decide` says whether to ``"resume"`` the response
where it stopped or ``"cancel"`` it:

* no words at all (a cough, a door, breathing: the recogniser heard nothing) → resume;
* only backchannels ("uh-huh", "yeah", "okay", "mm-hmm", "right", …), at most ``max_words``
  words in all → resume;
* anything else ("wait", "no, I meant Tuesday", "yeah but what about…") → cancel.

Matching ignores case, punctuation and the hyphen-or-space spelling of a backchannel
("Mm-hmm." = "mm hmm"); a multi-word backchannel ("got it", "i see") matches as a whole.  The
list is a setting: :meth:`InterruptionPolicy.from_settings` checks it and names what is wrong.

:class:`FalseInterruptions` is the whole setting of a realtime session (the omnitrio extension
``turn_detection.false_interruptions``): the policy, and ``decide_ms``, how long the user may
speak over the assistant before it is surely not a backchannel (milliseconds of their speech in
the input audio, however long the recogniser takes to hear it: :mod:`.interruption`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import attrs

InterruptionOutcome = Literal["resume", "cancel"]
DEFAULT_BACKCHANNELS: tuple[str, ...] = (
    "uh-huh", "uh huh", "mhm", "mm-hmm", "mm", "hmm", "mmm", "um", "uh", "ah", "oh", "aha",
    "yeah", "yes", "yep", "yup", "ok", "o.k.", "okay", "right", "sure", "alright", "all right",
    "i see", "got it", "cool", "nice", "wow", "great", "true", "exactly", "indeed", "thanks", "thank you",
)  # fmt: skip
DEFAULT_MAX_WORDS = 4
DEFAULT_DECIDE_MS = 1000
MAX_DECIDE_MS = 10_000
_TOKEN = re.compile(r"[a-z0-9']+")


def words_of(text: str) -> tuple[str, ...]:
    """Lower-case words, punctuation and hyphens dropped: ``"Mm-hmm, OK!"`` → ``("mm", "hmm", "ok")``."""
    return tuple(_TOKEN.findall(text.lower().replace("-", " ")))


def _phrases(backchannels: Iterable[Any]) -> frozenset[tuple[str, ...]]:
    phrases = set()
    for index, entry in enumerate(backchannels):
        if not isinstance(entry, str) or not words_of(entry):
            raise ValueError(f"backchannels[{index}] must be a non-empty phrase of words, got {entry!r}")
        phrases.add(words_of(entry))
    return frozenset(phrases)


@attrs.frozen
class InterruptionPolicy:
    """Which short utterances over the assistant's speech let the response resume."""

    backchannels: frozenset[tuple[str, ...]] = attrs.field(factory=lambda: _phrases(DEFAULT_BACKCHANNELS))
    max_words: int = DEFAULT_MAX_WORDS

    @classmethod
    def from_settings(cls, backchannels: Any = None, max_words: Any = DEFAULT_MAX_WORDS) -> InterruptionPolicy:
        """A policy from client settings: ``backchannels`` is a list of phrases (None: the default
        list; ``[]``: nothing is a backchannel, only wordless sounds resume)."""
        if isinstance(max_words, bool) or not isinstance(max_words, int) or max_words < 1:
            raise ValueError(f"max_words must be a positive integer, got {max_words!r}")
        if backchannels is None:
            return cls(_phrases(DEFAULT_BACKCHANNELS), max_words)
        if isinstance(backchannels, str) or not isinstance(backchannels, list | tuple):
            raise ValueError(f"backchannels must be a list of phrases, got {backchannels!r}")
        return cls(_phrases(backchannels), max_words)

    def is_backchannel(self, transcript: str) -> bool:
        """True when ``transcript`` is wordless or made only of backchannel phrases, short enough."""
        words = words_of(transcript)
        if len(words) > self.max_words:
            return False
        longest = max((len(phrase) for phrase in self.backchannels), default=0)
        position = 0
        while position < len(words):
            for size in range(min(longest, len(words) - position), 0, -1):
                if words[position : position + size] in self.backchannels:
                    position += size
                    break
            else:
                return False
        return True

    def decide(self, transcript: str | None) -> InterruptionOutcome:
        """``"resume"`` for no words (``None`` or empty) or a backchannel, else ``"cancel"``."""
        return "resume" if transcript is None or self.is_backchannel(transcript) else "cancel"


@attrs.frozen
class FalseInterruptions:
    """How a realtime session treats speech over the assistant: pause, then decide within ``decide_ms`` of speech."""

    decide_ms: int = DEFAULT_DECIDE_MS
    policy: InterruptionPolicy = attrs.field(factory=InterruptionPolicy)

    @classmethod
    def from_settings(cls, value: Any) -> FalseInterruptions:
        """From ``{"decide_ms", "backchannels", "max_words"}`` (each optional); a ValueError names the field."""
        if not isinstance(value, Mapping):
            raise ValueError(f"must be an object or null, got {value!r}")
        unknown = sorted(set(value) - {"decide_ms", "backchannels", "max_words"})
        if unknown:
            raise ValueError(f"{unknown[0]} is not a setting; use decide_ms, backchannels and max_words")
        decide_ms = value.get("decide_ms", DEFAULT_DECIDE_MS)
        if isinstance(decide_ms, bool) or not isinstance(decide_ms, int) or not 0 < decide_ms <= MAX_DECIDE_MS:
            raise ValueError(f"decide_ms must be an integer from 1 to {MAX_DECIDE_MS}, got {decide_ms!r}")
        policy = InterruptionPolicy.from_settings(value.get("backchannels"), value.get("max_words", DEFAULT_MAX_WORDS))
        return cls(decide_ms, policy)
