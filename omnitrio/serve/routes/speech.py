"""``POST /v1/audio/speech``: text to speech, as an audio body or as SSE events.

``response_format`` is OpenAI's, ``mp3`` by default. ``pcm`` is raw PCM16 mono at 24 kHz (OpenAI's
definition), streamed as the pipeline produces it. ``wav`` is PCM16 mono at the pipeline's own rate,
sent as one complete file whose RIFF and data sizes are exact (with a ``content-length``). ``mp3``,
``opus`` (Ogg), ``aac`` (ADTS) and ``flac`` are encoded by FFmpeg (:mod:`.audio_files`) once the
pipeline's audio is complete, and sent as one file. ``stream_format=sse`` sends the bytes
base64-encoded in ``speech.audio.delta`` events, then one ``speech.audio.done`` event: PCM as it is
produced; a WAV streamed that way starts with the "unknown length" header (0xFFFFFFFF sizes) that
players and ``wave`` accept; an encoded format as one delta holding the whole file. Input with
nothing to speak is refused before any header is sent, and so is a request for which the pipeline
produced no audio: a client never gets a cut body for either.
"""

from __future__ import annotations

from typing import Any

import trio
from starlette.requests import Request

from omnitrio.serve.api_errors import ApiError
from omnitrio.serve.audio import REALTIME_RATE, b64, encode_wav, wav_header
from omnitrio.serve.context import ServeContext, new_id, read_body
from omnitrio.serve.model_names import check_model
from omnitrio.serve.openai_types import SpeechRequest, check_speech, decode_json
from omnitrio.serve.output import Delta, Output
from omnitrio.serve.routes.audio_files import ENCODED, encode_audio, require_encoder
from omnitrio.serve.routes.sse import SSE_MEDIA_TYPE, Emitter, WatchedResponse, sse_event

_MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm"} | {name: spec.media_type for name, spec in ENCODED.items()}


async def create_speech(ctx: ServeContext, request: Request) -> WatchedResponse:
    ctx.require("speech")
    body = decode_json(await read_body(request, ctx.max_body_bytes), SpeechRequest)
    check_model(ctx, "speech", body.model)
    check_speech(body)
    require_encoder(body.response_format)
    speech = _Speech(ctx, body)
    if body.stream_format == "sse":
        produce = speech.encoded_events if body.response_format in ENCODED else speech.events
        return WatchedResponse(produce, media_type=SSE_MEDIA_TYPE, stream_error=_stream_error)
    if body.response_format == "pcm":
        return WatchedResponse(speech.audio, media_type=_MEDIA_TYPES["pcm"])
    return WatchedResponse(speech.file, media_type=_MEDIA_TYPES[body.response_format])


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
        self.output = Output(audio_rate=REALTIME_RATE if body.response_format == "pcm" else None)
        self._header_sent = False

    def _bytes(self, deltas: list[Delta], *, complete: bool) -> bytes:
        """The format's bytes for ``deltas``; ``complete`` means these are all the audio there is."""
        pcm = b"".join(delta.value for delta in deltas if delta.kind == "audio")
        if not self.wav or self._header_sent or not pcm:
            return pcm
        self._header_sent = True
        rate = self.output.sample_rate or REALTIME_RATE
        return wav_header(rate, len(pcm) if complete else None) + pcm

    def _check_audio(self) -> None:
        if not self.output.pcm:
            raise ApiError(500, "the pipeline produced no audio for this request", "server_error", code="no_audio")

    async def _produce(self, emit_bytes: Any) -> None:
        """Hand ``emit_bytes`` each non-empty piece of the body; nothing is emitted before the first audio."""
        async with self.ctx.pipeline.stream(self.id, self.inputs, timeout=self.ctx.request_timeout) as messages:
            async for message in messages:
                data = self._bytes(self.output.add(message), complete=False)
                if data:
                    await emit_bytes(data)
        final = self._bytes(self.output.finish(), complete=not self._header_sent)
        self._check_audio()
        if final:
            await emit_bytes(final)

    async def audio(self, emitter: Emitter) -> None:
        await self._produce(emitter.write)

    async def _whole_file(self) -> bytes:
        """All the audio first, then one file of it: WAV with its real sizes, or encoded."""
        async with self.ctx.pipeline.stream(self.id, self.inputs, timeout=self.ctx.request_timeout) as messages:
            async for message in messages:
                self.output.add(message)
        self.output.finish()
        self._check_audio()
        pcm, rate, fmt = bytes(self.output.pcm), self.output.sample_rate or REALTIME_RATE, self.body.response_format
        if fmt == "wav":
            return encode_wav(pcm, rate)
        return await trio.to_thread.run_sync(encode_audio, pcm, rate, fmt)

    async def file(self, emitter: Emitter) -> None:
        await emitter.respond(200, await self._whole_file(), _MEDIA_TYPES[self.body.response_format])

    async def encoded_events(self, emitter: Emitter) -> None:
        data = await self._whole_file()
        await emitter.write(sse_event({"type": "speech.audio.delta", "audio": b64(data)}))
        await self._done(emitter)

    async def events(self, emitter: Emitter) -> None:
        async def emit(data: bytes) -> None:
            await emitter.write(sse_event({"type": "speech.audio.delta", "audio": b64(data)}))

        await self._produce(emit)
        await self._done(emitter)

    async def _done(self, emitter: Emitter) -> None:
        usage = self.output.usage or {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        await emitter.write(sse_event({"type": "speech.audio.done", "usage": usage}))
