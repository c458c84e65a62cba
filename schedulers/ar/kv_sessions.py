"""Which rows of the engine's KV batch hold which conversation, and the keys/values of shared prompt prefixes.

Every running request has its row in the batch (:class:`~schedulers.engine.kv_batch.KVBatch`, keyed by
its request id).  A conversation (``session_id``) that finishes a turn keeps its row: the keys/values of
every token it has seen stay there (the row is *parked*, keyed by the session), and its next turn
prefills only the tokens past the longest common prefix of the cached tokens and the new prompt.  At
most ``max_sessions`` conversations are kept; parking one more evicts the least recently used, whose
next turn then prefills from the start (slower, never wrong: a row's cached tokens are compared, not
trusted).

A shared prefix (the system prompt every session starts with) is computed once: the first request
that carries it stores a copy of its keys/values here, and later requests that start with the same
tokens get a row holding that copy instead of recomputing it.  At most ``max_prefixes`` are kept (LRU).

The batch never holds more rows than running requests plus ``max_sessions``.  Not thread-safe: the
engine's thread owns it.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from typing import TYPE_CHECKING

import attrs
import torch

if TYPE_CHECKING:  # the engine's batch imports transformers, which llama.cpp's prefix matching never needs
    from schedulers.engine.kv_batch import KVBatch


@attrs.frozen
class _Session:
    """The key of a parked conversation's row (request ids key the running rows)."""

    session_id: str


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class SessionCache:
    """Parked conversations' rows and shared prefixes' keys/values (module docstring)."""

    def __init__(self, kv: KVBatch[Hashable], *, max_sessions: int, max_prefixes: int = 8) -> None:
        if max_sessions < 0 or max_prefixes < 0:
            raise ValueError(f"SessionCache: max_sessions={max_sessions} and max_prefixes={max_prefixes} must be >= 0")
        self.kv = kv
        self.max_sessions = max_sessions
        self.max_prefixes = max_prefixes
        self._parked: collections.OrderedDict[str, list[int]] = collections.OrderedDict()  # session: cached tokens
        self._prefixes: collections.OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = (
            collections.OrderedDict()
        )

    @property
    def sessions(self) -> list[str]:
        """Parked conversations, least recently used first."""
        return list(self._parked)

    def claim(self, request_id: str, session_id: str | None, prompt: list[int], shared_prefix_len: int) -> int:
        """Give ``request_id`` a row for ``prompt``; returns how many of its first tokens already have
        keys/values there.  At least the prompt's last token is left to compute (its logits are the first output)."""
        limit = len(prompt) - 1
        tokens = self._parked.pop(session_id, None) if session_id is not None else None
        if tokens is not None:
            assert session_id is not None
            reused = min(common_prefix(tokens, prompt), limit)
            if reused > 0:
                self.kv.rename(_Session(session_id), request_id)
                self.kv.truncate(request_id, reused)
                return reused
            self.kv.remove(_Session(session_id))
        key = tuple(prompt[:shared_prefix_len])
        prefix = self._prefixes.get(key) if 0 < shared_prefix_len <= limit else None
        if prefix is not None:
            self._prefixes.move_to_end(key)
            self.kv.add(request_id, prefix)
            return shared_prefix_len
        self.kv.add(request_id)
        return 0

    def remember_prefix(self, request_id: str, prefix: list[int]) -> None:
        """Keep a copy of the keys/values of ``prefix`` (just computed in ``request_id``'s row) for later requests."""
        key = tuple(prefix)
        if not key or key in self._prefixes or self.max_prefixes == 0:
            return
        self._prefixes[key] = self.kv.copy_out(request_id, len(key))
        if len(self._prefixes) > self.max_prefixes:
            self._prefixes.popitem(last=False)

    def has_prefix(self, prefix: list[int]) -> bool:
        return tuple(prefix) in self._prefixes

    def release(self, request_id: str, session_id: str | None, tokens: list[int]) -> None:
        """``request_id`` left: park its row for ``session_id`` (holding ``tokens``) or free it."""
        if session_id is None or self.max_sessions == 0:
            self.kv.remove(request_id)
            return
        if self._parked.pop(session_id, None) is not None:  # two overlapping turns: the later one is kept
            self.kv.remove(_Session(session_id))
        self.kv.rename(request_id, _Session(session_id))
        self.kv.truncate(_Session(session_id), len(tokens))
        self._parked[session_id] = tokens
        while len(self._parked) > self.max_sessions:
            evicted, _ = self._parked.popitem(last=False)
            self.kv.remove(_Session(evicted))

    def forget(self, session_id: str) -> None:
        if self._parked.pop(session_id, None) is not None:
            self.kv.remove(_Session(session_id))
