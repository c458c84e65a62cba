"""Sending a response's audio no faster than a client plays it, plus a fixed lead.

A :class:`Pacer` belongs to one response. The first audio goes at once (the lead never adds to the
time to first audio); after that, a piece of audio is sent once the client, playing in real time
from the first piece, is less than ``lead`` seconds from the end of what it holds. So at any
moment the client holds at most ``lead`` seconds of unplayed audio (plus one piece), and a
cancelled response leaves at most that much behind.

A pacer may be paused (the user may be interrupting): no piece goes until it is resumed, and a
real-time player is taken to have paused too, so after the resume it still holds what it held.

The pacer also keeps the audio figures of the response: when the first audio went, how much was
sent, and the underruns — sends that came after a client playing in real time had already run
out of audio (its playback then resumes from that moment).
"""

from __future__ import annotations

import attrs
import trio

from omnitrio.serve.audio import REALTIME_RATE
from omnitrio.serve.context import DEFAULT_LEAD

PIECE_SECONDS = 0.2  # audio is sent in pieces of at most this length, so the lead holds


def pieces(pcm16: bytes, seconds: float = PIECE_SECONDS) -> list[bytes]:
    """``pcm16`` (24 kHz) split into pieces of at most ``seconds``; an empty input gives no piece."""
    step = 2 * max(1, int(seconds * REALTIME_RATE))
    return [pcm16[i : i + step] for i in range(0, len(pcm16), step)]


@attrs.define
class Pacer:
    """When each piece of one response's audio may go (see the module docstring)."""

    lead: float = DEFAULT_LEAD
    first_sent: float | None = None  # trio clock
    played_from: float = 0.0  # when a real-time player started (or resumed) playing what was sent
    sent_seconds: float = 0.0
    underruns: int = 0
    paused_at: float | None = None
    _resumed: trio.Event = attrs.field(factory=trio.Event)

    def held(self, now: float) -> float:
        """Seconds of sent audio a real-time player has not played yet at ``now``."""
        if self.first_sent is None:
            return 0.0
        if self.paused_at is not None:
            now = min(now, self.paused_at)
        return max(0.0, self.sent_seconds - (now - self.played_from))

    def pause(self) -> None:
        """Send nothing more until :meth:`resume` (pausing a paused pacer changes nothing)."""
        if self.paused_at is None:
            self.paused_at = trio.current_time()
            self._resumed = trio.Event()

    def resume(self) -> None:
        """Let pieces go again; the real-time player's clock skips the pause."""
        if self.paused_at is not None:
            self.played_from += trio.current_time() - self.paused_at
            self.paused_at = None
            self._resumed.set()

    async def wait_to_send(self) -> None:
        """Sleep until the next piece may go (at once for the first one, unless paused)."""
        while True:
            while self.paused_at is not None:
                await self._resumed.wait()
            if self.first_sent is None or trio.current_time() >= self.played_from + self.sent_seconds - self.lead:
                return
            await trio.sleep_until(self.played_from + self.sent_seconds - self.lead)

    def sent(self, num_bytes: int) -> None:
        """Account for a piece of ``num_bytes`` of PCM16 just sent."""
        now = trio.current_time()
        if self.first_sent is None:
            self.first_sent = self.played_from = now
        elif now - self.played_from > self.sent_seconds:
            self.underruns += 1
            self.played_from = now - self.sent_seconds
        self.sent_seconds += num_bytes / 2 / REALTIME_RATE
