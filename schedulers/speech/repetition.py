"""Where an answer starts repeating itself: a small model's loop, cut before it reaches the token cap.

:func:`repeat_start` looks at an answer still being written and returns where its repetition
begins, or None:

* a finished sentence or line that says again what an earlier one said (compared on its letters
  only, case folded, so "2. The Lunacy Cat" repeats "1. The Lunacy Cat"); sentences with fewer than
  ``min_letters`` letters ("Yes.") never count;
* or an end made of the same piece of text written several times in a row (a loop with no
  sentence end): twice for a piece of 24 characters or more, three times from 8, four times below
  ("and and and and").

Cutting there keeps the first saying and drops the repeat (with its list number or bullet).
"""

from __future__ import annotations

import re
from typing import Final

_SEGMENT: Final = re.compile(r"[^.!?\n]*(?:[.!?]+|\n)")
_LETTERS: Final = re.compile(r"[^\w]|[\d_]")
_MARKER: Final = re.compile(r"[ \t]*(?:\d+[.)]|[-*•])?[ \t]*$")  # a list item's number or bullet


def repeat_start(text: str, *, min_letters: int = 8) -> int | None:
    """Where the repetition of ``text`` begins (see the module docstring), or None."""
    seen: set[str] = set()
    for match in _SEGMENT.finditer(text):
        key = _LETTERS.sub("", match.group()).casefold()
        if len(key) < min_letters:
            continue
        if key in seen:
            start = match.start() + len(match.group()) - len(match.group().lstrip())
            marker = _MARKER.search(text, 0, start)
            return marker.start() if marker is not None else start
        seen.add(key)
    return _looping_tail(text)


def _looping_tail(text: str) -> int | None:
    """Where a tail of equal pieces (1..80 characters, repeated as the module docstring says) starts
    after its first piece."""
    for period in range(2, min(80, len(text) // 2) + 1):
        times = 2 if period >= 24 else 3 if period >= 8 else 4
        piece = text[-period:]
        if piece.strip() and text.endswith(piece * times):
            return len(text) - period * (times - 1)
    return None
