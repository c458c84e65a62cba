"""Speech over a response: pause it, then decide whether the user really interrupted.

By default speech over a response cancels it at once, as OpenAI's server does. A session that opts
in with ``turn_detection.false_interruptions`` (an object; see
:class:`~omnitrio.serve.realtime.backchannel.FalseInterruptions`) gets this instead: when the user starts
speaking while a released audio response plays (and ``interrupt_response`` is true), the response
is *paused*: no more of its audio is sent (its pacer holds), and the client is told with
``omnitrio.output_audio_buffer.paused``. The response keeps being produced meanwhile. Then:

* when the user pauses (the VAD's ``speech_paused``) within ``decide_ms`` of speech, what they
  said since they started is transcribed (``semantic_vad`` brings the transcript with the pause)
  and judged by the session's :class:`~omnitrio.serve.realtime.backchannel.InterruptionPolicy`: no
  words, or only backchannels ("uh-huh", "okay"), **resume**: the audio goes on from where it
  stopped, ``omnitrio.output_audio_buffer.resumed`` says so with what was heard, and that speech
  never becomes a turn (it is dropped from the input buffer: no commit, no answer); anything else
  **cancels** the response as a barge-in does (``response.done`` with ``cancelled`` /
  ``turn_detected``) and the speech goes on as a turn;
* when the VAD has heard the user still speaking ``decide_ms`` after they started, or pausing only
  later, it is no backchannel: the response is cancelled.

``decide_ms`` is audio: it counts the user's speech in the input stream, from where the VAD heard
it begin (``speech_started``'s ``audio_start_ms`` plus its ``prefix_padding_ms``), never the wall
time the recogniser took to hear it, so a slow or busy CPU judges the same speech the same way.
Only a judgement still missing ``decide_ms`` plus ``JUDGE_TIMEOUT`` seconds after the speech
began (a stalled recogniser) cancels by the clock.

``omnitrio.output_audio_buffer.paused`` and ``.resumed`` are omnitrio extensions, named after the GA
protocol's ``output_audio_buffer.*`` family (``started`` / ``stopped`` / ``cleared``, which OpenAI
sends to WebRTC clients), and sent only to a session with ``"omnitrio_events": true``
(:mod:`.protocol`). A response whose item the client truncated is never resumed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

import attrs
import trio

from omnitrio.serve.audio import REALTIME_RATE
from omnitrio.serve.realtime.backchannel import FalseInterruptions, words_of
from omnitrio.serve.realtime.response import Response, ResponseState

Outcome = Literal["resume", "cancel"]
JUDGE_TIMEOUT = 10.0  # seconds past decide_ms after speech began over a response: still undecided, it is cancelled
_MS = REALTIME_RATE // 1000  # input samples per millisecond


@attrs.define(eq=False)
class Overheard:
    """User speech over ``response``, which stays paused until the speech is judged."""

    response: Response
    settings: FalseInterruptions
    onset: int  # input offset (samples) where the speech began
    timeout: trio.CancelScope = attrs.field(factory=trio.CancelScope)

    @property
    def window_end(self) -> int:
        """The input offset ``decide_ms`` of speech after the onset: speech heard past it is no backchannel."""
        return self.onset + self.settings.decide_ms * _MS

    def paused_event(self) -> dict[str, Any]:
        sent_ms = int(1000 * self.response.sent_seconds)
        return {
            "type": "omnitrio.output_audio_buffer.paused",
            "response_id": self.response.id,
            "audio_end_ms": sent_ms,
            "decide_ms": self.settings.decide_ms,
        }

    def resumed_event(self, transcript: str) -> dict[str, Any]:
        return {
            "type": "omnitrio.output_audio_buffer.resumed",
            "response_id": self.response.id,
            "reason": "backchannel" if words_of(transcript) else "no_words",
            "transcript": transcript,
        }


class Interruptions:
    """One connection's judge of the speech over its response (at most one is pending).

    ``emit`` sends a server event; ``cancel`` cancels a response as a barge-in does.
    """

    def __init__(
        self,
        transcribe: Callable[[bytes], Awaitable[str]],
        emit: Callable[[dict[str, Any]], Awaitable[None]],
        cancel: Callable[[Response], None],
    ) -> None:
        self.transcribe = transcribe
        self.emit = emit
        self.cancel = cancel
        self.pending: Overheard | None = None

    def overhear(
        self, response: Response, settings: FalseInterruptions, onset: int, nursery: trio.Nursery
    ) -> Overheard:
        """Pause ``response``: speech began over it at input offset ``onset``."""
        self.forget()
        self.pending = overheard = Overheard(response, settings, onset)
        response.pause()
        nursery.start_soon(self._cancel_after_timeout, overheard)
        return overheard

    def heard(self, offset: int) -> None:
        """The VAD has judged the input up to ``offset`` and reported no pause of the pending speech
        before it: past the window, the user is still speaking, and the response is cancelled."""
        overheard = self.pending
        if overheard is not None and offset > overheard.window_end:
            self.forget()
            self.cancel(overheard.response)

    async def judge(self, audio: bytes, transcript: str | None, paused_at: int) -> bool:
        """The user paused at input offset ``paused_at``: judge what they said since they began
        (``audio``, PCM16 24 kHz; transcribed here unless ``transcript`` is given). True: the response
        resumed, and the speech is no turn."""
        overheard = self.pending
        assert overheard is not None
        if paused_at > overheard.window_end:
            self.forget()  # spoken longer than a backchannel, whatever the words
            self.cancel(overheard.response)
            return False
        if transcript is None:
            try:
                transcript = await self.transcribe(audio)
            except Exception:
                transcript = None  # judged as a real interruption: the safe side
        if self.pending is not overheard or overheard.response.state is not ResponseState.PAUSED:
            return False  # timed out meanwhile, or the response ended or was truncated
        self.forget()
        if transcript is None or overheard.settings.policy.decide(transcript) == "cancel":
            self.cancel(overheard.response)
            return False
        await self.emit(overheard.resumed_event(transcript))
        overheard.response.resume()
        return True

    def forget(self, response: Response | None = None) -> None:
        """Nothing is pending any more (only if it was about ``response``, when given)."""
        if self.pending is not None and response in (None, self.pending.response):
            self.pending.timeout.cancel()
            self.pending = None

    async def _cancel_after_timeout(self, overheard: Overheard) -> None:
        with overheard.timeout:
            await trio.sleep(overheard.settings.decide_ms / 1000 + JUDGE_TIMEOUT)
            if self.pending is overheard:
                self.forget()
                self.cancel(overheard.response)
