"""What the words of a turn say about whether it is over.

A turn whose (streaming) transcript ends on a word that cannot end an English sentence is not
over, whatever the voice did: an article ("the"), a preposition that takes an object ("of",
"for"), a conjunction ("and", "because"), a possessive determiner ("my"), or a filler ("um").
A transcript that trails off ("...", "—", a final comma) is not over either.  Anything else is
*open*: the words do not object, and the audio decides.

Prepositions that double as verb particles ("turn it off", "log in", "hang on", "pick me up")
end sentences all the time, so they are not on the list.  Stranded prepositions in questions
("Where are you from?") are judged unfinished: a known, bounded cost (the turn waits for the
longer silence) that keeps "What is the capital of" from being answered.  The lists are English.
"""

from __future__ import annotations

import re

ARTICLES = frozenset({"a", "an", "the"})
PREPOSITIONS = frozenset(
    {
        "about", "against", "among", "amongst", "at", "between", "despite", "during", "for", "from",
        "into", "of", "onto", "per", "than", "to", "toward", "towards", "upon", "via", "with",
        "within", "without",
    }
)  # fmt: skip
CONJUNCTIONS = frozenset(
    {"and", "but", "or", "nor", "because", "cause", "although", "if", "unless", "whereas", "whether"}
)
DETERMINERS = frozenset({"my", "your", "our", "their", "its", "every", "each"})
FILLERS = frozenset({"um", "umm", "uh", "uhh", "uhm", "er", "erm"})
_TRAILING_OFF = re.compile(r"(\.\.\.|…|[-–—,;:])\s*$")
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")  # Whisper writes numbers as digits: "closes at 9."


def last_word(transcript: str) -> str | None:
    """The transcript's last word (a number counts), lower-cased, without punctuation; None when it has none."""
    words = _WORD.findall(transcript.lower())
    return words[-1] if words else None


def unfinished_because(transcript: str) -> str | None:
    """Why the words say the turn is not over (e.g. ``"ends on the preposition 'for'"``), or None.

    None means the words do not object: the turn may or may not be complete.  An empty
    transcript (nothing recognised yet) is None too.
    """
    word = last_word(transcript)
    if word is None:
        return None
    if _TRAILING_OFF.search(transcript):
        return "trails off"
    for kind, words in (
        ("filler", FILLERS),
        ("article", ARTICLES),
        ("preposition", PREPOSITIONS),
        ("conjunction", CONJUNCTIONS),
        ("determiner", DETERMINERS),
    ):
        if word in words:
            return f"ends on the {kind} {word!r}"
    return None
