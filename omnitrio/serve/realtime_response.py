"""One realtime response, from its preparation to ``response.done``.

A :class:`Response` is prepared first and released later: :func:`respond` starts the pipeline work
at once but says nothing to the client until ``released`` is set (a speculative answer that is
never released leaves no trace). Once released, the client gets, in this order and each once::

    response.created → response.output_item.added → conversation.item.added →
    response.content_part.added → (response.output_audio_transcript.delta, response.output_audio.delta)*
    → response.output_audio.done → response.output_audio_transcript.done → response.content_part.done
    → response.output_item.done → conversation.item.done → response.done

(``response.output_text.*`` instead of the audio pair for a text-only session). The ``.done`` events
come for a cancelled or failed response too; ``response.done`` then says ``cancelled`` (with the
reason: ``turn_detected`` or ``client_cancelled``) or ``failed`` (with the error). An out-of-band
response (``in_conversation`` false) sends no ``conversation.item.*`` event: its item is never added.

The work: when the response answers a user audio turn, it waits for that turn's transcript (see
:mod:`.realtime_transcribe`); then one pipeline request, task ``chat``, with the conversation (or
the response's own ``context``) as messages (:func:`messages_of`), ``max_tokens``, and the
``session_id`` when it answers the session's own conversation. Its audio is paced
(:mod:`.realtime_pacing`); the assistant item keeps the audio actually sent, with the text of each
sentence against its samples, so a later ``conversation.item.truncate`` can cut both.
Everything runs in ``response.scope``: cancelling it aborts the request at every stage.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import attrs
import trio

from omnitrio.serve.api_errors import as_api_error
from omnitrio.serve.api_metrics import api_metrics, response_outcome
from omnitrio.serve.audio import REALTIME_RATE, b64
from omnitrio.serve.context import ServeContext, new_id
from omnitrio.serve.output import Delta, Output
from omnitrio.serve.realtime_conversation import (
    Conversation,
    Item,
    Spoken,
    assistant_item,
    heard_text,
    messages_of,
)
from omnitrio.serve.realtime_metrics import RealtimeMetrics
from omnitrio.serve.realtime_pacing import Pacer, pieces
from omnitrio.serve.realtime_session import max_tokens, wants_audio


@attrs.define(eq=False)
class Response:
    """One response and what the connection and its writer need to know about it."""

    session: dict[str, Any]
    turn: Item | None  # the user audio turn it answers, if any
    lead: float
    in_conversation: bool = True  # False: out of band (``conversation: "none"``), its item is never added
    context: list[Item] | None = None  # what the responder sees instead of the conversation (``input``)
    metadata: dict[str, str] | None = None
    id: str = attrs.field(factory=lambda: new_id("resp"))
    item: Item = attrs.field(factory=lambda: assistant_item(new_id("item")))
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    released: trio.Event = attrs.field(factory=trio.Event)
    announced: bool = False
    request_id: str | None = None  # the pipeline request now running
    pacer: Pacer = attrs.field(init=False)
    released_at: float = 0.0
    interrupted_at: float | None = None
    cancel_reason: str = "client_cancelled"
    silenced: bool = False  # audio still queued for the socket is dropped
    first_audio_sent: float | None = None
    last_audio_sent: float | None = None

    def __attrs_post_init__(self) -> None:
        self.pacer = Pacer(self.lead)

    @property
    def audio(self) -> bool:
        return wants_audio(self.session)

    def interrupt(self, reason: str) -> None:
        """Cancel: stop sending now, abort the request, report ``cancelled`` with ``reason``."""
        if self.interrupted_at is None:
            self.interrupted_at = trio.current_time()
            self.cancel_reason = reason
        self.silenced = True
        self.scope.cancel()


class Host(Protocol):
    """What a response needs from its connection."""

    ctx: ServeContext
    conversation: Conversation
    metrics: RealtimeMetrics

    async def emit(self, event: dict[str, Any], response: Response | None = None) -> None: ...

    def finished(self, response: Response) -> None: ...


async def respond(host: Host, response: Response) -> None:
    """Run ``response`` to its end (see the module docstring)."""
    output = Output(audio_rate=REALTIME_RATE, want_audio=response.audio)
    failure: dict[str, Any] | None = None
    previous: str | None = None
    with response.scope:
        deltas_in, deltas = trio.open_memory_channel[Delta | Exception](math.inf)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_produce, host, response, output, deltas_in)
            await response.released.wait()
            response.announced = True
            response.released_at = trio.current_time()
            previous = await _announce(host, response)
            async for delta in deltas:
                if isinstance(delta, Exception):
                    error = as_api_error(delta)
                    failure = {"type": error.type, "code": error.code, "message": error.message}
                    await host.emit({"type": "error", "error": {**failure, "param": error.param, "event_id": None}})
                    break
                await _send(host, response, delta)
    host.finished(response)
    if not response.announced:
        return  # a speculative answer that was never released: the client never heard of it
    details: dict[str, Any] | None
    if response.scope.cancelled_caught:
        status, details = "cancelled", {"type": "cancelled", "reason": response.cancel_reason}
    elif failure is not None:
        status, details = "failed", {"type": "failed", "error": failure}
    else:
        status, details = "completed", None
    api_metrics(host.ctx.pipeline.metrics_registry).count(
        "realtime_response", response_outcome(status, None if failure is None else failure["type"])
    )
    await _finish(host, response, output, status, details, previous)


async def _produce(host: Host, response: Response, output: Output, deltas: trio.MemorySendChannel[Any]) -> None:
    """The pipeline work; deltas (or the failure) go to ``deltas``, held there until the release."""
    ctx, session = host.ctx, response.session
    with deltas:
        try:
            own = response.context is None
            turn = response.turn
            context = [*(host.conversation.items if response.context is None else response.context)]
            if turn is not None and turn not in context:
                context.append(turn)
            for item in context:
                await item.transcribed.wait()
            if turn is not None and not turn.heard:
                return  # nothing was said (noise, a cough): an empty answer
            inputs = {
                "task": "chat",
                "messages": messages_of(context, session.get("instructions") or ""),
                # The responder may keep the session's conversation between turns; another context is not it.
                "session_id": session["id"] if own and response.in_conversation else None,
                "max_tokens": max_tokens(session),
                "modalities": ["text", "audio"] if response.audio else ["text"],
                "speed": session["audio"]["output"].get("speed", 1.0),
            }
            response.request_id = new_id("rtresp")
            started = trio.current_time()
            produced = started
            async with ctx.pipeline.stream(response.request_id, inputs, timeout=ctx.request_timeout) as messages:
                async for message in messages:
                    for delta in output.add(message):
                        deltas.send_nowait(delta)
                        produced = trio.current_time()
            for delta in output.finish():
                deltas.send_nowait(delta)
            seconds = len(output.pcm) / 2 / REALTIME_RATE
            if seconds:
                host.metrics.rtf.observe((produced - started) / seconds)
        except Exception as exc:
            deltas.send_nowait(exc)


def _ids(response: Response) -> dict[str, Any]:
    return {"response_id": response.id, "item_id": response.item.id, "output_index": 0, "content_index": 0}


def _part(response: Response) -> dict[str, Any]:
    return {"type": "audio", "transcript": ""} if response.audio else {"type": "text", "text": ""}


async def _announce(host: Host, response: Response) -> str | None:
    """``response.created`` and the assistant item's arrival; returns the id the item follows."""
    created = body(response, "in_progress", _conversation_id(host, response))
    await host.emit({"type": "response.created", "response": created})
    item = response.item
    previous = host.conversation.insert(item) if response.in_conversation else None
    await host.emit(
        {"type": "response.output_item.added", "response_id": response.id, "output_index": 0, "item": item.public()}
    )
    if response.in_conversation:
        await host.emit({"type": "conversation.item.added", "previous_item_id": previous, "item": item.public()})
    item.announced.set()
    content = {"type": "output_audio", "transcript": ""} if response.audio else {"type": "output_text", "text": ""}
    item.body["content"] = [content]
    await host.emit({"type": "response.content_part.added", **_ids(response), "part": _part(response)})
    return previous


async def _send(host: Host, response: Response, delta: Delta) -> None:
    item = response.item
    match delta.kind:
        case "audio":
            for piece in pieces(delta.value):
                await response.pacer.wait_to_send()
                await host.emit(
                    {"type": "response.output_audio.delta", **_ids(response), "delta": b64(piece)}, response
                )
                response.pacer.sent(len(piece))
                item.audio += piece
                if item.spoken:
                    item.spoken[-1].samples += len(piece) // 2
        case "transcript":
            item.spoken.append(Spoken(delta.value, len(item.audio) // 2, 0))
            await host.emit({"type": "response.output_audio_transcript.delta", **_ids(response), "delta": delta.value})
        case "text" if not response.audio:
            item.body["content"][0]["text"] += delta.value
            await host.emit({"type": "response.output_text.delta", **_ids(response), "delta": delta.value})


async def _finish(
    host: Host, response: Response, output: Output, status: str, details: Any, previous: str | None
) -> None:
    item = response.item
    ids = _ids(response)
    item.body["status"] = "completed" if status == "completed" else "incomplete"
    content = item.body["content"][0]
    if response.audio:
        content["transcript"] = (
            output.transcript if status == "completed" else heard_text(item.spoken, len(item.audio) // 2)
        )
        await host.emit({"type": "response.output_audio.done", **ids})
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
    host.metrics.underruns.inc(response.pacer.underruns)
    done = body(response, status, _conversation_id(host, response), details, output)
    await host.emit({"type": "response.done", "response": done}, response)


def _conversation_id(host: Host, response: Response) -> str | None:
    return host.conversation.id if response.in_conversation else None


def body(
    response: Response, status: str, conversation_id: str | None, details: Any = None, output: Output | None = None
) -> dict[str, Any]:
    """The ``response`` object of ``response.created`` / ``response.done``."""
    session = response.session
    return {
        "id": response.id,
        "object": "realtime.response",
        "status": status,
        "status_details": details,
        "output": [response.item.public()] if output is not None else [],
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
