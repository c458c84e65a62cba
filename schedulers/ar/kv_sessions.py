"""Which KV-cache slots hold which conversation, and the keys/values of shared prompt prefixes.

A conversation (``session_id``) that finishes a turn keeps its slot: the keys/values of every token
it has seen stay in the cache, and its next turn prefills only the tokens past the longest common
prefix of the cached tokens and the new prompt.  At most ``max_sessions`` conversations are kept;
parking one more evicts the least recently used, whose next turn then prefills from the start
(slower, never wrong: a slot's cached tokens are compared, not trusted).

A shared prefix (the system prompt every session starts with) is computed once: the first request
that carries it stores its keys/values here, and later requests that start with the same tokens
copy them into their slot instead of recomputing them.  At most ``max_prefixes`` are kept (LRU).

Not thread-safe: the engine's thread owns it.
"""

from __future__ import annotations

import collections
import heapq

import attrs
import torch

from schedulers.ar.model import KVCache


@attrs.define(eq=False)
class _Parked:
    slot: int
    tokens: list[int]  # the tokens whose keys/values the slot holds, in order


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class SessionCache:
    """Slots ``[0, running_slots + max_sessions)`` of ``cache``: running, parked or free."""

    def __init__(self, cache: KVCache, *, max_sessions: int, max_prefixes: int = 8) -> None:
        if max_sessions < 0 or max_prefixes < 0:
            raise ValueError(f"SessionCache: max_sessions={max_sessions} and max_prefixes={max_prefixes} must be >= 0")
        self.cache = cache
        self.max_sessions = max_sessions
        self.max_prefixes = max_prefixes
        self._free = list(range(cache.slots))
        self._parked: collections.OrderedDict[str, _Parked] = collections.OrderedDict()
        self._prefixes: collections.OrderedDict[tuple[int, ...], torch.Tensor] = collections.OrderedDict()

    @property
    def sessions(self) -> list[str]:
        """Parked conversations, least recently used first."""
        return list(self._parked)

    def claim(self, session_id: str | None, prompt: list[int], shared_prefix_len: int) -> tuple[int, int]:
        """A slot for ``prompt`` and how many of its first tokens already have keys/values there.

        At least the prompt's last token is left to compute (its logits are the first output)."""
        limit = len(prompt) - 1
        parked = self._parked.pop(session_id, None) if session_id is not None else None
        if parked is not None:
            reused = min(common_prefix(parked.tokens, prompt), limit)
            if reused > 0:
                return parked.slot, reused
            heapq.heappush(self._free, parked.slot)
        slot = heapq.heappop(self._free)
        key = tuple(prompt[:shared_prefix_len])
        if 0 < shared_prefix_len <= limit and key in self._prefixes:
            self._prefixes.move_to_end(key)
            self.cache.tokens(slot, shared_prefix_len).copy_(self._prefixes[key])
            return slot, shared_prefix_len
        return slot, 0

    def remember_prefix(self, slot: int, prefix: list[int]) -> None:
        """Keep the keys/values of ``prefix`` (just computed in ``slot``) for later requests."""
        key = tuple(prefix)
        if not key or key in self._prefixes or self.max_prefixes == 0:
            return
        self._prefixes[key] = self.cache.tokens(slot, len(key)).clone()
        if len(self._prefixes) > self.max_prefixes:
            self._prefixes.popitem(last=False)

    def has_prefix(self, prefix: list[int]) -> bool:
        return tuple(prefix) in self._prefixes

    def release(self, slot: int, session_id: str | None, tokens: list[int]) -> None:
        """A request left ``slot``: park it for ``session_id`` (holding ``tokens``) or free it."""
        if session_id is None or self.max_sessions == 0:
            heapq.heappush(self._free, slot)
            return
        older = self._parked.pop(session_id, None)
        if older is not None:  # two overlapping turns of one conversation: the later one is kept
            heapq.heappush(self._free, older.slot)
        self._parked[session_id] = _Parked(slot, tokens)
        while len(self._parked) > self.max_sessions:
            _, evicted = self._parked.popitem(last=False)
            heapq.heappush(self._free, evicted.slot)

    def forget(self, session_id: str) -> None:
        parked = self._parked.pop(session_id, None)
        if parked is not None:
            heapq.heappush(self._free, parked.slot)
