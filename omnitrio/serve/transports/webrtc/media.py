"""A WebRTC call's audio, on the aiortc loop: the answer's outgoing track and the microphone's reader.

Both run on the asyncio thread of :mod:`.loop` and are touched only there.

:class:`AnswerTrack` is the server's audio track. It plays what :meth:`~AnswerTrack.push` queues
(PCM16 mono 24 kHz, tagged with its response and item) in real time, 20 ms a frame, silence when
nothing is queued; aiortc encodes it as Opus. What it has played is the truth about what the peer
heard: :meth:`~AnswerTrack.clear` drops what is queued and says how far into its item playback got,
and the track tells the session (``say``) what OpenAI's WebRTC server does: ``output_audio_buffer.
started`` when a response's audio starts playing, ``.stopped`` when all of it has played, and
``.cleared`` after a clear.

:func:`read_microphone` turns the peer's track (Opus, decoded by aiortc at 48 kHz) into PCM16 mono
24 kHz and hands each frame on, in order, until the track ends.
"""

from __future__ import annotations

import asyncio
import collections
import fractions
import time
from collections.abc import Callable
from typing import Any

import attrs
import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from omnitrio.serve.audio import REALTIME_RATE

FRAME_SAMPLES = REALTIME_RATE // 50  # 20 ms, Opus's usual frame


@attrs.define
class _Chunk:
    response_id: str
    item_id: str
    pcm: bytes  # PCM16 mono 24 kHz


@attrs.frozen
class Cleared:
    """What a clear cut short: the item that was playing and how much of it had played."""

    response_id: str
    item_id: str
    audio_end_ms: int


class AnswerTrack(MediaStreamTrack):
    """The server's audio track (see the module docstring); ``say`` sends one server event to the peer."""

    kind = "audio"

    def __init__(self, say: Callable[[dict[str, Any]], None]) -> None:
        super().__init__()
        self._say = say
        self._queue: collections.deque[_Chunk] = collections.deque()
        self._done: set[str] = set()  # responses whose audio has all been queued
        self._start: float | None = None
        self._pts = 0
        self._response: str | None = None  # the response whose audio is playing
        self._item: str | None = None
        self._played = 0  # samples of self._item played

    def push(self, response_id: str, item_id: str, pcm16: bytes) -> None:
        if pcm16:
            self._queue.append(_Chunk(response_id, item_id, pcm16))

    def end(self, response_id: str) -> None:
        """All of ``response_id``'s audio is queued: once it has played, ``output_audio_buffer.stopped``."""
        self._done.add(response_id)
        if self._response == response_id and not self._queue:
            self._stopped()

    def clear(self) -> Cleared | None:
        """Drop what is queued; what was playing, and how far, or None when nothing was."""
        self._queue.clear()
        if self._response is None or self._item is None:
            return None
        cleared = Cleared(self._response, self._item, self._played * 1000 // REALTIME_RATE)
        self._say({"type": "output_audio_buffer.cleared", "response_id": self._response})
        self._response = self._item = None
        return cleared

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        else:
            self._pts += FRAME_SAMPLES
            await asyncio.sleep(max(0.0, self._start + self._pts / REALTIME_RATE - now))
        samples = np.frombuffer(self._take(), np.int16).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = REALTIME_RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, REALTIME_RATE)
        return frame

    def _take(self) -> bytes:
        """The next frame's samples: queued audio, then silence."""
        out = bytearray()
        while len(out) < 2 * FRAME_SAMPLES and self._queue:
            head = self._queue[0]
            if head.response_id != self._response:
                if self._response is not None:
                    self._stopped()
                self._response = head.response_id
                self._say({"type": "output_audio_buffer.started", "response_id": head.response_id})
            if head.item_id != self._item:
                self._item, self._played = head.item_id, 0
            take = min(2 * FRAME_SAMPLES - len(out), len(head.pcm))
            out += head.pcm[:take]
            head.pcm = head.pcm[take:]
            self._played += take // 2
            if not head.pcm:
                self._queue.popleft()
        if not self._queue and self._response in self._done:
            self._stopped()
        return bytes(out) + bytes(2 * FRAME_SAMPLES - len(out))

    def _stopped(self) -> None:
        assert self._response is not None
        self._say({"type": "output_audio_buffer.stopped", "response_id": self._response})
        self._done.discard(self._response)
        self._response = self._item = None


async def read_microphone(track: MediaStreamTrack, deliver: Callable[[bytes], None]) -> None:
    """Hand each of ``track``'s frames to ``deliver`` as PCM16 mono 24 kHz, until the track ends."""
    resampler = av.AudioResampler(format="s16", layout="mono", rate=REALTIME_RATE)
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        if not isinstance(frame, av.AudioFrame):
            continue
        for out in resampler.resample(frame):
            deliver(bytes(out.planes[0])[: 2 * out.samples])
