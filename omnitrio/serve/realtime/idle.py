"""Server VAD's idle timeout: when the user says nothing after an answer, the server answers again.

With ``turn_detection.idle_timeout_ms`` set, a response that ends arms an :class:`IdleTimeout`.
It counts from the moment the client has finished playing that response's audio (the response's
end plus the audio the client still held then: the paced lead), not from ``response.done``. If
``idle_timeout_ms`` passes from there without being disarmed, ``on_timeout(start)`` runs, ``start``
being the input offset (samples since the connection opened) when the playback ended; the connection
then sends ``input_audio_buffer.timeout_triggered``, commits the silent input and responds.

What a caller may rely on: at most one timeout is armed (arming again replaces it); :meth:`disarm`
(the user started speaking, another response was released, turn detection changed) cancels the
wait at once, and once ``on_timeout`` has begun it is no longer disarmed; closing the connection's
nursery cancels everything.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio


class IdleTimeout:
    """One connection's idle timeout (see the module docstring)."""

    def __init__(self, position: Callable[[], int], on_timeout: Callable[[int], Awaitable[None]]) -> None:
        self._position = position  # the input offset now, in samples
        self._on_timeout = on_timeout
        self._armed: trio.CancelScope | None = None

    def arm(self, nursery: trio.Nursery, played_out: float, seconds: float) -> None:
        """Fire ``seconds`` after ``played_out`` (trio clock) unless disarmed first."""
        self.disarm()
        scope = self._armed = trio.CancelScope()
        nursery.start_soon(self._wait, scope, played_out, seconds)

    def disarm(self) -> None:
        if self._armed is not None:
            self._armed.cancel()
            self._armed = None

    async def _wait(self, scope: trio.CancelScope, played_out: float, seconds: float) -> None:
        start = 0
        with scope:
            await trio.sleep_until(played_out)
            start = self._position()
            await trio.sleep(seconds)
        if scope.cancel_called:
            return  # disarmed, if only just as the wait ended
        self._armed = None  # it fires: from here on nothing disarms it
        await self._on_timeout(start)
