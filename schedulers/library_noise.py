"""Known-harmless messages of the libraries the schedulers use, silenced where they are known.

:func:`silence` puts a filter on one library logger: a record that a model family's predicate says is
known-harmless (a library check that does not know a key that family's model code reads, say) is
dropped; every other record goes through, the first time it is logged in this process — a real
warning that several stages of one process meet (each loading the same configuration) is shown once.
Nothing else changes: the logger's level, its handlers and every other logger stay as they are.
Installing the same predicate twice installs it once, so a module may call it when imported.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

Harmless = Callable[[str], bool]
"""Whether a record's message (``record.getMessage()``) is known-harmless."""

_lock = threading.Lock()


class _KnownNoise(logging.Filter):
    """Drops what a predicate calls harmless, and repeats of what it has let through."""

    def __init__(self) -> None:
        super().__init__()
        self.harmless: list[Harmless] = []
        self._shown: set[tuple[int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(harmless(message) for harmless in self.harmless):
            return False
        key = (record.levelno, message)
        with _lock:
            if key in self._shown:
                return False
            self._shown.add(key)
        return True


def silence(logger_name: str, harmless: Harmless) -> None:
    """Drop the records of ``logger_name`` that ``harmless`` picks; show the others once (module docstring)."""
    logger = logging.getLogger(logger_name)
    with _lock:
        noise = next((f for f in logger.filters if isinstance(f, _KnownNoise)), None)
        if noise is None:
            noise = _KnownNoise()
            logger.addFilter(noise)
        if harmless not in noise.harmless:
            noise.harmless.append(harmless)
