"""Where an answer starts repeating itself: a small model's loop, cut before it reaches the token cap.

:func:`repeat_start` looks at an answer still being written and returns where its repetition
begins, or None:

* a finished sentence or line that says again what an earlier one said (compared on its letters
  only, case folded, so "2. The Lunacy Cat" repeats "1. The Lunacy Cat"); sentences with fewer than
  ``min_letters`` letters ("Yes.") never count;
* or an end made of the same piece of text written ``times`` times in a row (a loop with no
  sentence end, "and and and ..."), the piece at least ``min_period`` characters or repeated
  more.

Cutting there keeps the first saying and drops the repeat (with its list number or bullet).
"""

from __future__ import annotations

import re
from typing import Final

_SEGMENT: Final = re.compile(r"[^.!?\n]*(?:[.!?]+|\n)")
_LETTERS: Final = re.compile(r"[^\w]|[\d_]")
_MARKER: Final = re.compile(r"[ \t]*(?:\d+[.)]|[-*•])?[ \t]*$")  # a list item's number or bullet


def repeat_start(text: str, *, min_letters: int = 8, times: int = 4, min_period: int = 4) -> int | None:
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
    return _looping_tail(text, times, min_period)


def _looping_tail(text: str, times: int, min_period: int) -> int | None:
    """Where a tail of ``times`` equal pieces (period 1..80 characters) starts after its first piece."""
    longest = min(80, len(text) // times)
    for period in range(1, longest + 1):
        piece = text[-period:]
        if not piece.strip() or period * times < min_period * 2:
            continue
        if text.endswith(piece * times):
            return len(text) - period * (times - 1)
    return None
