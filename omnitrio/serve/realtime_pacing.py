"""Sending a response's audio no faster than a client plays it, plus a fixed lead.

A :class:`Pacer` belongs to one response. The first audio goes at once (the lead never adds to the
time to first audio); after that, a piece of audio is sent once the client, playing in real time
from the first piece, is less than ``lead`` seconds from the end of what it holds. So at any
moment the client holds at most ``lead`` seconds of unplayed audio (plus one piece), and a
cancelled response leaves at most that much behind.

The pacer also keeps the audio figures of the response: when the first audio went, how much was
sent, and the underruns — sends that came after a client playing in real time had already run
out of audio (its playback then resumes from that moment).
"""

from __future__ import annotations

import attrs
import trio

from omnitrio.serve.audio import REALTIME_RATE

DEFAULT_LEAD = 1.0  # seconds of audio a client may hold ahead of playback
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

    def held(self, now: float) -> float:
        """Seconds of sent audio a real-time player has not played yet at ``now``."""
        if self.first_sent is None:
            return 0.0
        return max(0.0, self.sent_seconds - (now - self.played_from))

    async def wait_to_send(self) -> None:
        """Sleep until the next piece may go (not at all for the first one)."""
        if self.first_sent is not None:
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
