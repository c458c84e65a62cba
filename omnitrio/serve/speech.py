"""``POST /v1/audio/speech``: text to speech, as an audio body or as SSE events.

``response_format=pcm`` is raw PCM16 mono at 24 kHz (OpenAI's definition); ``wav`` is PCM16 mono at
the pipeline's own rate. The body streams as the pipeline produces audio: a WAV that streams has
the "unknown length" size fields (0xFFFFFFFF) that players and ``wave`` accept; when the pipeline
hands over all its audio at once the sizes are exact. ``stream_format=sse`` sends the same bytes
base64-encoded in ``speech.audio.delta`` events, then one ``speech.audio.done`` event.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from omnitrio.serve.api_errors import ApiError
from omnitrio.serve.audio import REALTIME_RATE, b64, wav_header
from omnitrio.serve.context import ServeContext, new_id, read_body
from omnitrio.serve.openai_types import SpeechRequest, check_model, check_speech, decode_json
from omnitrio.serve.output import Delta, Output
from omnitrio.serve.sse import SSE_MEDIA_TYPE, Emitter, WatchedResponse, sse_event

_MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm"}


async def create_speech(ctx: ServeContext, request: Request) -> WatchedResponse:
    body = decode_json(await read_body(request, ctx.max_body_bytes), SpeechRequest)
    check_model(body.model, ctx.pipeline.name)
    check_speech(body)
    speech = _Speech(ctx, body)
    if body.stream_format == "sse":
        return WatchedResponse(speech.events, media_type=SSE_MEDIA_TYPE, stream_error=_stream_error)
    return WatchedResponse(speech.audio, media_type=_MEDIA_TYPES[body.response_format])


def _stream_error(error: ApiError) -> bytes:
    return sse_event({"type": "error", **error.body()})


class _Speech:
    """One speech request: pipeline audio deltas → bytes in the requested format."""

    def __init__(self, ctx: ServeContext, body: SpeechRequest) -> None:
        self.ctx = ctx
        self.body = body
        self.id = new_id("speech")
        self.inputs: dict[str, Any] = {"task": "speech", "input": body.input, "voice": body.voice, "speed": body.speed}
        self.wav = body.response_format == "wav"
        self.output = Output(audio_rate=None if self.wav else REALTIME_RATE)
        self._header_sent = False

    def _bytes(self, deltas: list[Delta], *, complete: bool) -> bytes:
        """The format's bytes for ``deltas``; ``complete`` means these are all the audio there is."""
        pcm = b"".join(delta.value for delta in deltas if delta.kind == "audio")
        if not self.wav or self._header_sent or not pcm:
            return pcm
        self._header_sent = True
        rate = self.output.sample_rate or REALTIME_RATE
        return wav_header(rate, len(pcm) if complete else None) + pcm

    async def _produce(self, emit_bytes: Any) -> None:
        async with self.ctx.pipeline.stream(self.id, self.inputs, timeout=self.ctx.request_timeout) as messages:
            async for message in messages:
                await emit_bytes(self._bytes(self.output.add(message), complete=False))
        final = self._bytes(self.output.finish(), complete=not self._header_sent)
        if not self.output.pcm:
            raise ApiError(500, "the pipeline produced no audio for this request", "server_error", code="no_audio")
        await emit_bytes(final)

    async def audio(self, emitter: Emitter) -> None:
        await self._produce(emitter.write)

    async def events(self, emitter: Emitter) -> None:
        async def emit(data: bytes) -> None:
            if data:
                await emitter.write(sse_event({"type": "speech.audio.delta", "audio": b64(data)}))

        await self._produce(emit)
        usage = self.output.usage or {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        await emitter.write(sse_event({"type": "speech.audio.done", "usage": usage}))
