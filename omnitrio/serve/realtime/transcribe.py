"""Transcribing a committed user audio item, for the conversation and (when asked) for the client.

A committed audio item is transcribed by one pipeline request (task ``transcription``, quick
decoding) when the session's answering needs it (the cascade: the responder needs the text of what
the user said, this turn and every later one; a speech-native model hears the audio itself) or the
client asked for it and the pipeline serves ``transcription`` (the session decides: see
``RealtimeSession._transcribe``). An item whose transcript is known already (``semantic_vad``
transcribed the turn to judge it) is not transcribed again.
When the session has ``audio.input.transcription`` set, the client also gets, after the item's
``conversation.item.added``, ``conversation.item.input_audio_transcription.delta`` then
``.completed`` with the final transcript, or ``.failed`` with the error.

What a caller may rely on: ``item.transcribed`` is set whatever happens, with the transcript in
``item.heard`` (None after a failure); the item's public ``content[0].transcript`` is filled in once
the client has seen the item added, just before ``.completed``; cancelling ``item.transcription``
(the item was deleted, or a speculative turn dropped) aborts the request and sends nothing.
"""

from __future__ import annotations

from typing import Any, Protocol

from omnitrio.serve.api_errors import as_api_error
from omnitrio.serve.audio import REALTIME_RATE, TRANSCRIBE_RATE, pcm16_to_float, resample
from omnitrio.serve.context import ServeContext, new_id
from omnitrio.serve.output import Output
from omnitrio.serve.realtime.conversation import Item


class Host(Protocol):
    ctx: ServeContext

    async def emit(self, event: dict[str, Any]) -> None: ...


async def transcribe(host: Host, item: Item, *, report: bool) -> None:
    """Transcribe ``item``'s audio into its transcript; with ``report``, tell the client (see above)."""
    ids = {"item_id": item.id, "content_index": 0}
    with item.transcription:
        try:
            text = item.heard = item.heard if item.heard is not None else await transcript_of(host.ctx, item.audio)
        except Exception as exc:
            item.transcribed.set()
            if report:
                error = as_api_error(exc)
                failure = {"type": error.type, "code": error.code, "message": error.message, "param": None}
                await item.announced.wait()
                await host.emit({"type": "conversation.item.input_audio_transcription.failed", **ids, "error": failure})
            return
        finally:
            item.transcribed.set()  # also when cancelled: nothing waits for a transcript that will not come
        await item.announced.wait()
        item.body["content"][0]["transcript"] = text
        if report:
            await host.emit({"type": "conversation.item.input_audio_transcription.delta", **ids, "delta": text})
            usage = {"type": "duration", "seconds": round(len(item.audio) / 2 / REALTIME_RATE, 3)}
            completed = {"type": "conversation.item.input_audio_transcription.completed", **ids, "transcript": text}
            await host.emit({**completed, "usage": usage})


async def transcript_of(ctx: ServeContext, audio: bytes | bytearray) -> str:
    """What the pipeline's ASR hears in ``audio`` (PCM16 24 kHz), quick decoding; nothing in no audio."""
    if not audio:
        return ""  # an idle timeout's commit when the client sent no audio
    samples = resample(pcm16_to_float(bytes(audio)), REALTIME_RATE, TRANSCRIBE_RATE)
    inputs = {"task": "transcription", "audio": samples, "quick": True}
    output = Output(audio_rate=None, want_audio=False)
    async with ctx.pipeline.stream(new_id("rttr"), inputs, timeout=ctx.request_timeout) as messages:
        async for message in messages:
            output.add(message)
    output.finish()
    return output.text.strip()
