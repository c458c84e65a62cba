"""One realtime response, from its preparation to ``response.done``.

A :class:`Response` is prepared first and released later: :func:`respond` starts the pipeline work
at once but says nothing to the client until :meth:`Response.release` (a speculative answer that
is never released leaves no trace). Once released, the client gets, in this order and each once::

    response.created → response.output_item.added → conversation.item.added →
    response.content_part.added → (response.output_audio_transcript.delta, response.output_audio.delta)*
    → response.output_audio.done → response.output_audio_transcript.done → response.content_part.done
    → response.output_item.done → conversation.item.done → (function calls) → response.done

(``response.output_text.*`` instead of the audio pair for a text-only session). The message item
is added with the answer's first delta, or at the end; an answer that is only tool calls has none.
Each tool call of a completed answer is a ``function_call`` item (:mod:`.tools`). The
``.done`` events come for a cancelled or failed response too; ``response.done`` then says
``cancelled`` (with the reason: ``turn_detected`` or ``client_cancelled``) or ``failed`` (with the
error). An out-of-band response (``in_conversation`` false) sends no ``conversation.item.*`` event:
its items are never added.

The work: the session's answering pipeline (:mod:`.answering`; the cascade, :mod:`.cascade`, waits
for the transcripts, then makes one ``chat`` request) answers the conversation (or the response's own
``context``) with the turn last. Its audio is paced
(:mod:`.pacing`); the assistant item keeps the audio actually sent, with the text of each
sentence against its samples, so a later ``conversation.item.truncate`` can cut both.
Everything runs in the response's cancel scope: :meth:`Response.interrupt` (or ``drop``) aborts the
request at every stage.
"""

from __future__ import annotations

import enum
import math
from typing import Any, Protocol

import attrs
import trio

from omnitrio.serve.api_errors import as_api_error
from omnitrio.serve.api_metrics import api_metrics, response_outcome
from omnitrio.serve.audio import REALTIME_RATE, b64
from omnitrio.serve.context import ServeContext, new_id
from omnitrio.serve.output import Delta, Output
from omnitrio.serve.realtime.answering import Answering, AnswerRequest
from omnitrio.serve.realtime.conversation import (
    Conversation,
    Item,
    Spoken,
    assistant_item,
    heard_text,
)
from omnitrio.serve.realtime.metrics import RealtimeMetrics
from omnitrio.serve.realtime.pacing import Pacer, pieces
from omnitrio.serve.realtime.session_config import wants_audio
from omnitrio.serve.realtime.tools import send_function_calls


class ResponseState(enum.Enum):
    """Where a response is in its life: it moves down this list (PLAYING and PAUSED alternate);
    SILENCED and DONE are final."""

    PREPARED = "prepared"  # working; the client has heard nothing of it
    PLAYING = "playing"  # released: the client gets its events and its audio
    PAUSED = "paused"  # released, its audio held while speech over it is judged
    SILENCED = "silenced"  # interrupted, truncated or dropped: no more of its audio, ever
    DONE = "done"  # its work is over, not silenced (``response.done`` follows for a released one)


@attrs.define(eq=False)
class Response:
    """A handle on one response: the session prepares, releases, pauses and interrupts it through
    its methods; the writer asks it whether an event still plays and tells it what was sent.

    Its data (``session``, ``turn``, ``item``, ...) is fixed at creation; its progress is
    :attr:`state`. Every method may be called in any state: one that no longer applies does nothing.
    """

    session: dict[str, Any]
    turn: Item | None  # the user audio turn it answers, if any
    lead: float
    in_conversation: bool = True  # False: out of band (``conversation: "none"``), its item is never added
    context: list[Item] | None = None  # what the responder sees instead of the conversation (``input``)
    metadata: dict[str, str] | None = None
    id: str = attrs.field(factory=lambda: new_id("resp"))
    item: Item = attrs.field(factory=lambda: assistant_item(new_id("item")))
    _state: ResponseState = attrs.field(default=ResponseState.PREPARED, init=False)
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope, init=False)
    _released: trio.Event = attrs.field(factory=trio.Event, init=False)
    _done: trio.Event = attrs.field(factory=trio.Event, init=False)
    _pacer: Pacer = attrs.field(init=False)
    _request_id: str | None = attrs.field(default=None, init=False)
    _released_at: float = attrs.field(default=0.0, init=False)
    _interrupted_at: float | None = attrs.field(default=None, init=False)
    _unplayed_at_interruption: float | None = attrs.field(default=None, init=False)
    _cancel_reason: str = attrs.field(default="client_cancelled", init=False)
    _first_audio_sent: float | None = attrs.field(default=None, init=False)
    _last_audio_sent: float | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._pacer = Pacer(self.lead)

    @property
    def state(self) -> ResponseState:
        return self._state

    @property
    def audio(self) -> bool:
        """Whether it answers with audio (else text only)."""
        return wants_audio(self.session)

    @property
    def request_id(self) -> str | None:
        """The pipeline request it runs (None before it started one)."""
        return self._request_id

    @property
    def interrupted_at(self) -> float | None:
        return self._interrupted_at

    @property
    def sent_seconds(self) -> float:
        """Seconds of its audio sent to the client so far."""
        return self._pacer.sent_seconds

    def held(self, now: float) -> float:
        """Seconds of sent audio a real-time player still had to play at ``now``."""
        return self._pacer.held(now)

    def release(self) -> None:
        """Let the client have it: ``response.created`` and the rest follow (a prepared one only)."""
        if self._state is ResponseState.PREPARED:
            self._state = ResponseState.PLAYING
            self._released_at = trio.current_time()
            self._released.set()

    def drop(self) -> None:
        """A prepared response that will not be released: its work stops, the client never hears of it."""
        if self._state is ResponseState.PREPARED:
            self._state = ResponseState.SILENCED
            self._scope.cancel()

    def interrupt(self, reason: str) -> None:
        """Cancel: stop sending its audio now, abort its request, report ``cancelled`` with ``reason``."""
        if self._interrupted_at is None and self._state is not ResponseState.DONE:
            self._interrupted_at = now = trio.current_time()
            self._cancel_reason = reason
            if self._first_audio_sent is not None:
                self._unplayed_at_interruption = self._pacer.held(now)
            self._state = ResponseState.SILENCED
        self._scope.cancel()

    def truncate(self) -> None:
        """The client cut its item's audio: none of it is sent or kept after this, and a response
        still running is cancelled (it would speak past what the client keeps)."""
        self.interrupt("client_cancelled")

    def pause(self) -> None:
        """Hold its audio (speech over it is being judged); nothing more is sent until :meth:`resume`."""
        if self._state is ResponseState.PLAYING:
            self._state = ResponseState.PAUSED
            self._pacer.pause()

    def resume(self) -> None:
        """Send its audio again from where it stopped (a paused response only)."""
        if self._state is ResponseState.PAUSED:
            self._state = ResponseState.PLAYING
            self._pacer.resume()

    async def wait_done(self) -> None:
        """Return once its work is over (for a released one, just before its ``.done`` events)."""
        await self._done.wait()

    def plays(self, kind: str) -> bool:
        """Whether an event of type ``kind`` of this response, queued earlier, still goes to the client."""
        return kind != "response.output_audio.delta" or self._state is not ResponseState.SILENCED

    def on_sent(self, kind: str, metrics: RealtimeMetrics) -> None:
        """The writer handed an event of type ``kind`` of this response to the client."""
        now = trio.current_time()
        match kind:
            case "response.output_audio.delta":
                if self._first_audio_sent is None:
                    self._first_audio_sent = now
                    metrics.time_to_first_audio.observe(now - self._released_at)
                self._last_audio_sent = now
            case "response.done" if self._interrupted_at is not None:
                last = self._last_audio_sent or self._interrupted_at
                metrics.to_last_audio.observe(max(0.0, last - self._interrupted_at))


class Host(Protocol):
    """What a response needs from its connection."""

    ctx: ServeContext
    answering: Answering
    conversation: Conversation
    metrics: RealtimeMetrics
    voice_asked: Any  # the voice name the client last set

    async def emit(self, event: dict[str, Any], response: Response | None = None) -> None: ...

    def finished(self, response: Response) -> None: ...


@attrs.define
class _Progress:
    """What the client has been told of a released response so far."""

    created: bool = False  # response.created went out
    message: bool = False  # its message item was added (its .done events are owed)
    previous: str | None = None  # the id the message item follows in the conversation


async def respond(host: Host, response: Response) -> None:
    """Run ``response`` to its end (see the module docstring)."""
    output = Output(audio_rate=REALTIME_RATE, want_audio=response.audio)
    failure: dict[str, Any] | None = None
    progress = _Progress()
    with response._scope:
        deltas_in, deltas = trio.open_memory_channel[Delta | Exception](math.inf)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_produce, host, response, output, deltas_in)
            await response._released.wait()
            created = body(response, "in_progress", _conversation_id(host, response))
            await host.emit({"type": "response.created", "response": created})
            progress.created = True
            async for delta in deltas:
                if isinstance(delta, Exception):
                    error = as_api_error(delta)
                    failure = {"type": error.type, "code": error.code, "message": error.message}
                    await host.emit({"type": "error", "error": {**failure, "param": error.param, "event_id": None}})
                    break
                if not progress.message:
                    await _add_message(host, response, progress)
                await _send(host, response, delta)
    if response._state is not ResponseState.SILENCED:
        response._state = ResponseState.DONE
    response._done.set()
    if response._unplayed_at_interruption is not None:
        host.metrics.unplayed.observe(response._unplayed_at_interruption)
    host.finished(response)
    if not progress.created:
        return  # a speculative answer that was never released: the client never heard of it
    details: dict[str, Any] | None
    if response._scope.cancelled_caught:
        status, details = "cancelled", {"type": "cancelled", "reason": response._cancel_reason}
    elif failure is not None:
        status, details = "failed", {"type": "failed", "error": failure}
    else:
        status, details = "completed", None
    api_metrics(host.ctx.pipeline.metrics_registry).count(
        "realtime_response", response_outcome(status, None if failure is None else failure["type"])
    )
    calls = output.tool_calls if status == "completed" else []
    if not progress.message and not calls:
        await _add_message(host, response, progress)  # an answer that said nothing still has its item
    items = [response.item] if progress.message else []
    if progress.message:
        await _finish_message(host, response, output, status, progress.previous)
    items += await send_function_calls(host, response, calls, first_index=len(items))
    host.metrics.underruns.inc(response._pacer.underruns)
    done = body(response, status, _conversation_id(host, response), details, output, items)
    await host.emit({"type": "response.done", "response": done}, response)


async def _produce(host: Host, response: Response, output: Output, deltas: trio.MemorySendChannel[Any]) -> None:
    """The answering pipeline's work; deltas (or the failure) go to ``deltas``, held there until the release."""
    session = response.session
    with deltas:
        try:
            own = response.context is None
            turn = response.turn
            context = [*(host.conversation.items if response.context is None else response.context)]
            if turn is not None and turn not in context:
                context.append(turn)
            request = AnswerRequest(
                request_id=new_id("rtresp"),
                session=session,
                context=context,
                turn=turn,
                session_id=session["id"] if own and response.in_conversation else None,
                audio=response.audio,
                voice=host.voice_asked,
            )
            if not await host.answering.ready(request):
                return  # nothing was said (noise, a cough): an empty answer
            response._request_id = request.request_id
            started = trio.current_time()
            produced = started

            def send(delta: Delta) -> None:
                nonlocal produced
                deltas.send_nowait(delta)
                produced = trio.current_time()

            await host.answering.answer(request, output, send)
            seconds = len(output.pcm) / 2 / REALTIME_RATE
            if seconds:
                host.metrics.rtf.observe((produced - started) / seconds)
        except Exception as exc:
            deltas.send_nowait(exc)


def _ids(response: Response) -> dict[str, Any]:
    return {"response_id": response.id, "item_id": response.item.id, "output_index": 0, "content_index": 0}


def _part(response: Response) -> dict[str, Any]:
    return {"type": "audio", "transcript": ""} if response.audio else {"type": "text", "text": ""}


async def _add_message(host: Host, response: Response, progress: _Progress) -> None:
    """The assistant message item's arrival (once its first delta is there, or at the end)."""
    item = response.item
    content = {"type": "output_audio", "transcript": ""} if response.audio else {"type": "output_text", "text": ""}
    item.body["content"] = [content]
    progress.previous = host.conversation.insert(item) if response.in_conversation else None
    progress.message = True
    await host.emit(
        {"type": "response.output_item.added", "response_id": response.id, "output_index": 0, "item": item.public()}
    )
    if response.in_conversation:
        added = {"type": "conversation.item.added", "previous_item_id": progress.previous, "item": item.public()}
        await host.emit(added)
    item.announced.set()
    await host.emit({"type": "response.content_part.added", **_ids(response), "part": _part(response)})


async def _send(host: Host, response: Response, delta: Delta) -> None:
    item = response.item
    match delta.kind:
        case "audio":
            for piece in pieces(delta.value):
                await response._pacer.wait_to_send()
                await host.emit(
                    {"type": "response.output_audio.delta", **_ids(response), "delta": b64(piece)}, response
                )
                response._pacer.sent(len(piece))
                item.audio += piece
                if item.spoken:
                    item.spoken[-1].samples += len(piece) // 2
        case "transcript":
            item.spoken.append(Spoken(delta.value, len(item.audio) // 2, 0))
            await host.emit({"type": "response.output_audio_transcript.delta", **_ids(response), "delta": delta.value})
        case "text" if not response.audio:
            item.body["content"][0]["text"] += delta.value
            await host.emit({"type": "response.output_text.delta", **_ids(response), "delta": delta.value})


async def _finish_message(host: Host, response: Response, output: Output, status: str, previous: str | None) -> None:
    item = response.item
    ids = _ids(response)
    item.body["status"] = "completed" if status == "completed" else "incomplete"
    content = item.body["content"][0]
    if response.audio:
        content["transcript"] = (
            output.transcript if status == "completed" else heard_text(item.spoken, len(item.audio) // 2)
        )
        await host.emit({"type": "response.output_audio.done", **ids}, response)  # its G.711 tail plays or not
        await host.emit({"type": "response.output_audio_transcript.done", **ids, "transcript": content["transcript"]})
        part = {"type": "audio", "transcript": content["transcript"]}
    else:
        await host.emit({"type": "response.output_text.done", **ids, "text": content["text"]})
        part = {"type": "text", "text": content["text"]}
    await host.emit({"type": "response.content_part.done", **ids, "part": part})
    await host.emit(
        {"type": "response.output_item.done", "response_id": response.id, "output_index": 0, "item": item.public()}
    )
    if response.in_conversation:
        await host.emit({"type": "conversation.item.done", "previous_item_id": previous, "item": item.public()})


def _conversation_id(host: Host, response: Response) -> str | None:
    return host.conversation.id if response.in_conversation else None


def body(
    response: Response,
    status: str,
    conversation_id: str | None,
    details: Any = None,
    output: Output | None = None,
    items: list[Item] | None = None,
) -> dict[str, Any]:
    """The ``response`` object of ``response.created`` / ``response.done``."""
    session = response.session
    return {
        "id": response.id,
        "object": "realtime.response",
        "status": status,
        "status_details": details,
        "output": [item.public() for item in items or ()],
        "conversation_id": conversation_id,
        "output_modalities": session.get("output_modalities", ["audio"]),
        "max_output_tokens": session.get("max_output_tokens", "inf"),
        "audio": {"output": {"format": session["audio"]["output"]["format"], "voice": session.get("voice")}},
        "usage": _usage(output.usage if output is not None else None),
        "metadata": response.metadata,
    }


def _usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    inputs = int(usage.get("prompt_tokens", usage.get("input_tokens", 0)) or 0)
    outputs = int(usage.get("completion_tokens", usage.get("output_tokens", 0)) or 0)
    return {
        "total_tokens": inputs + outputs,
        "input_tokens": inputs,
        "output_tokens": outputs,
        "input_token_details": {"text_tokens": inputs, "audio_tokens": 0, "cached_tokens": 0},
        "output_token_details": {"text_tokens": outputs, "audio_tokens": 0},
    }
