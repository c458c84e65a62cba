"""The one piece of a stage's per-request memory that outlives the request there.

After an abort or failure, a late payload or chunk from an upstream stage that had not
yet heard of it must be dropped rather than start a new request.  :class:`Tombstones`
remembers such ``(request id, incarnation)``s for :data:`TOMBSTONE_SECONDS`, at most
:data:`TOMBSTONE_LIMIT` of them (oldest forgotten first).
"""

from __future__ import annotations

from collections import OrderedDict

import trio

TOMBSTONE_SECONDS = 10.0
"""Longer than any message of a request spends in flight between two stages."""
TOMBSTONE_LIMIT = 20_000


class Tombstones:
    """Recently aborted or failed ``(request id, incarnation)``s; late messages for them are dropped."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def add(self, request_id: str, inc: int) -> None:
        now = trio.current_time()
        self._entries.pop(request_id, None)
        self._entries[request_id] = (inc, now + TOMBSTONE_SECONDS)
        while self._entries:
            _, (_, expiry) = next(iter(self._entries.items()))
            if expiry > now and len(self._entries) <= TOMBSTONE_LIMIT:
                break
            self._entries.popitem(last=False)

    def buries(self, request_id: str, inc: int) -> bool:
        """Whether a message for this incarnation (or an earlier one) must be dropped."""
        entry = self._entries.get(request_id)
        return entry is not None and inc <= entry[0] and entry[1] > trio.current_time()
