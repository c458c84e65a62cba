"""Which llama.cpp sequence holds which conversation, and the shared prompt prefixes.

Every running request decodes in its own sequence id.  When a request with a ``session_id`` leaves
(finished or aborted), its sequence is *parked*: the keys/values of every token it saw stay in the
KV cache, and the conversation's next turn keeps the longest common prefix of those tokens and its
new prompt (the rest is removed with ``seq_rm``) and prefills only what follows.  At most
``max_sessions`` are parked; parking one more, or needing their cells for a running request,
evicts the least recently used, whose next turn then prefills from the start (slower, never
wrong: a sequence's tokens are compared, not trusted).

A shared prefix (the system prompt every conversation opens with) is computed once: the first
request that carries it gives its cells to a prefix sequence (``seq_cp``, which in a unified KV
cache shares the cells rather than copying them), and a later request that starts with the same
tokens gets them the same way.  At most ``max_prefixes`` are kept (least recently used first).

``cells`` bounds the KV cells held by parked sessions and prefixes (a session's cells shared with a
prefix are counted twice: a bound, not a count); the engine adds what its running requests may still use and evicts
here until a new request fits.  Not thread-safe: the engine's thread owns it.
"""

from __future__ import annotations

import collections
from typing import Any

import attrs

from schedulers.ar.kv_sessions import common_prefix


@attrs.define(eq=False)
class _Parked:
    seq: int
    tokens: list[int]  # the tokens whose keys/values the sequence holds, in order


class Sequences:
    """Sequence ids ``[0, n_seq)`` of one llama.cpp context: running, parked, prefix or free."""

    def __init__(self, llama: Any, memory: Any, n_seq: int, *, max_sessions: int, max_prefixes: int) -> None:
        if max_sessions < 0 or max_prefixes < 0:
            raise ValueError(f"Sequences: max_sessions={max_sessions} and max_prefixes={max_prefixes} must be >= 0")
        self._llama = llama
        self._memory = memory
        self.max_sessions = max_sessions
        self.max_prefixes = max_prefixes
        self._free = list(range(n_seq - 1, -1, -1))
        self._parked: collections.OrderedDict[str, _Parked] = collections.OrderedDict()
        self._prefixes: collections.OrderedDict[tuple[int, ...], int] = collections.OrderedDict()

    @property
    def sessions(self) -> list[str]:
        """Parked conversations, least recently used first."""
        return list(self._parked)

    @property
    def cells(self) -> int:
        return sum(len(p.tokens) for p in self._parked.values()) + sum(map(len, self._prefixes))

    def held(self, session_id: str | None) -> int:
        """The cells ``session_id``'s parked sequence holds (0 when it has none)."""
        parked = self._parked.get(session_id) if session_id is not None else None
        return len(parked.tokens) if parked is not None else 0

    def claim(self, session_id: str | None, prompt: list[int], shared_prefix_len: int) -> tuple[int, int]:
        """A sequence for ``prompt`` and how many of its first tokens already have keys/values there.

        At least the prompt's last token is left to compute (its logits give the first output)."""
        limit = len(prompt) - 1
        parked = self._parked.pop(session_id, None) if session_id is not None else None
        if parked is not None:
            reused = min(common_prefix(parked.tokens, prompt), limit)
            if reused > 0:
                self._llama.llama_memory_seq_rm(self._memory, parked.seq, reused, -1)
                return parked.seq, reused
            self._drop(parked.seq)
        seq = self._free.pop()
        key = tuple(prompt[:shared_prefix_len])
        source = self._prefixes.get(key) if 0 < shared_prefix_len <= limit else None
        if source is not None:
            self._prefixes.move_to_end(key)
            self._llama.llama_memory_seq_cp(self._memory, source, seq, 0, shared_prefix_len)
            return seq, shared_prefix_len
        return seq, 0

    def needs_prefix(self, prefix: list[int]) -> bool:
        """Whether ``prefix`` would be worth remembering (not kept yet, and room for prefixes)."""
        return self.max_prefixes > 0 and bool(prefix) and tuple(prefix) not in self._prefixes

    def remember_prefix(self, seq: int, prefix: list[int]) -> bool:
        """Share the cells of ``prefix`` (just computed in ``seq``) with later requests; True if kept."""
        if not self.needs_prefix(prefix):
            return False
        if len(self._prefixes) >= self.max_prefixes:  # a sequence id is then free for the new one
            _, old = self._prefixes.popitem(last=False)
            self._drop(old)
        keep = self._free.pop()
        self._llama.llama_memory_seq_cp(self._memory, seq, keep, 0, len(prefix))
        self._prefixes[tuple(prefix)] = keep
        return True

    def release(self, seq: int, session_id: str | None, tokens: list[int]) -> None:
        """A request left ``seq``: park it for ``session_id`` (holding ``tokens``) or free it."""
        if session_id is None or self.max_sessions == 0 or not tokens:
            self._drop(seq)
            return
        older = self._parked.pop(session_id, None)
        if older is not None:  # two overlapping turns of one conversation: the later one is kept
            self._drop(older.seq)
        self._parked[session_id] = _Parked(seq, tokens)
        while len(self._parked) > self.max_sessions:
            self.evict_one()

    def evict_one(self) -> bool:
        """Free the least recently used parked session, else the oldest prefix; False when none is left."""
        if self._parked:
            _, evicted = self._parked.popitem(last=False)
            self._drop(evicted.seq)
            return True
        if self._prefixes:
            _, old = self._prefixes.popitem(last=False)
            self._drop(old)
            return True
        return False

    def forget(self, session_id: str) -> None:
        parked = self._parked.pop(session_id, None)
        if parked is not None:
            self._drop(parked.seq)

    def _drop(self, seq: int) -> None:
        self._llama.llama_memory_seq_rm(self._memory, seq, -1, -1)
        self._free.append(seq)
