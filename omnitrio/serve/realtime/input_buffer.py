"""A realtime session's input audio buffer, addressed by offsets in the session's input.

Offsets count samples (PCM16 24 kHz) since the session opened, so VAD events, which arrive later
than the audio they are about, still name the audio they mean. What a caller may rely on:

* :meth:`InputBuffer.append` refuses, with an :class:`~.protocol.EventError` naming the
  limit, audio that would make the uncommitted buffer longer than ``max_seconds``; nothing is
  appended then.
* :meth:`InputBuffer.take` removes everything before its ``end`` and returns the part from
  ``start``; audio before ``end`` is *consumed*: it never starts a turn later (:attr:`consumed`).
* :meth:`InputBuffer.drop` forgets audio before an offset without consuming it (idle input that
  the VAD has judged silent).
"""

from __future__ import annotations

import attrs

from omnitrio.serve.audio import REALTIME_RATE
from omnitrio.serve.realtime.protocol import EventError


@attrs.define
class InputBuffer:
    """Appended, not yet committed input (PCM16 24 kHz) and where it lies in the session's input."""

    max_seconds: float
    audio: bytearray = attrs.field(factory=bytearray)
    start: int = 0  # input offset of audio[0]
    appended: int = 0  # samples appended since the session opened
    consumed: int = 0  # input before this offset was committed or cleared: it starts no turn

    @property
    def end(self) -> int:
        """The offset just past the last appended sample."""
        return self.start + len(self.audio) // 2

    def append(self, data: bytes) -> None:
        limit = int(self.max_seconds * REALTIME_RATE) * 2
        if len(self.audio) + len(data) > limit:
            raise EventError(
                f"the input audio buffer is full ({limit} bytes, max_audio_seconds = {self.max_seconds});"
                " commit or clear it",
                "audio",
                code="input_audio_buffer_full",
            )
        self.audio += data
        self.appended += len(data) // 2

    def span(self, start: int, end: int) -> bytes:
        """A copy of the buffered input from ``start`` to ``end`` (clipped to what is buffered)."""
        begin = max(0, start - self.start)
        stop = max(begin, end - self.start)
        return bytes(self.audio[2 * begin : 2 * stop])

    def take(self, end: int, start: int | None = None) -> bytes:
        """The input from ``start`` (default: the buffer's start) to ``end``, and all before ``end`` consumed."""
        audio = self.span(self.start if start is None else start, end)
        self.drop(end)
        self.consumed = max(self.consumed, end)
        return audio

    def drop(self, end: int) -> None:
        """Forget the input before ``end`` (it may still start a turn, if the VAD says so)."""
        drop = min(max(0, end - self.start), len(self.audio) // 2)
        del self.audio[: 2 * drop]
        self.start += drop
