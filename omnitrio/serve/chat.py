"""``POST /v1/chat/completions``: text and audio output, whole or streamed as SSE.

Streaming follows OpenAI's audio chat streaming: a first chunk with ``delta.role``, then
``delta.content`` for text, ``delta.audio.data`` (base64 PCM16 mono 24 kHz, whatever
``audio.format`` says) and ``delta.audio.transcript`` for speech, a last chunk with
``finish_reason: "stop"``, an optional usage chunk (``stream_options.include_usage``) and
``data: [DONE]``. A whole answer carries ``message.audio.data`` encoded as ``audio.format``
(``wav`` or ``pcm16``, 24 kHz) and ``message.audio.transcript``.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request

from omnitrio.serve.api_errors import ApiError
from omnitrio.serve.audio import REALTIME_RATE, b64, encode_wav
from omnitrio.serve.context import ServeContext, new_id, read_body
from omnitrio.serve.openai_types import ChatRequest, check_chat, check_model, decode_json
from omnitrio.serve.output import Delta, Output
from omnitrio.serve.sse import SSE_DONE, SSE_MEDIA_TYPE, Emitter, WatchedResponse, json_bytes, sse_event


async def chat_completions(ctx: ServeContext, request: Request) -> WatchedResponse:
    body = decode_json(await read_body(request, ctx.max_body_bytes), ChatRequest)
    check_model(body.model, ctx.pipeline.name)
    modalities = check_chat(body)
    audio = body.audio
    inputs = {
        "task": "chat",
        "messages": body.messages,
        "modalities": modalities,
        "audio": None if audio is None else {"voice": audio.voice, "format": audio.format},
        "max_tokens": body.max_completion_tokens or body.max_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "seed": body.seed,
        "stop": body.stop,
    }
    chat = _Chat(ctx, new_id("chatcmpl"), body, inputs, "audio" in modalities)
    if body.stream:
        return WatchedResponse(chat.stream, media_type=SSE_MEDIA_TYPE, stream_error=_stream_error)
    return WatchedResponse(chat.complete, media_type="application/json")


def _stream_error(error: ApiError) -> bytes:
    return sse_event(error.body()) + SSE_DONE


class _Chat:
    """One chat completion request, served whole or streamed."""

    def __init__(self, ctx: ServeContext, cid: str, body: ChatRequest, inputs: dict[str, Any], audio: bool) -> None:
        self.ctx = ctx
        self.id = cid
        self.body = body
        self.inputs = inputs
        self.audio = audio
        self.audio_id = new_id("audio")
        self.created = int(time.time())

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.ctx.pipeline.name}

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return sse_event({**self._envelope("chat.completion.chunk"), "choices": [choice]})

    def _delta(self, delta: Delta) -> bytes:
        match delta.kind:
            case "audio":
                return self._chunk({"audio": {"id": self.audio_id, "data": b64(delta.value)}})
            case "transcript":
                return self._chunk({"audio": {"id": self.audio_id, "transcript": delta.value}})
            case _:
                return self._chunk({"content": delta.value})

    async def _forward(self, emitter: Emitter, deltas: list[Delta]) -> None:
        """Send ``deltas``; a transcript belongs to audio output, so text-only answers drop it."""
        for delta in deltas:
            if delta.kind != "transcript" or self.audio:
                await emitter.write(self._delta(delta))

    async def stream(self, emitter: Emitter) -> None:
        output = Output(audio_rate=REALTIME_RATE, want_audio=self.audio)
        stream = self.ctx.pipeline.stream(self.id, self.inputs, timeout=self.ctx.request_timeout)
        async with stream as messages:
            await emitter.write(self._chunk({"role": "assistant", "content": ""}))
            async for message in messages:
                await self._forward(emitter, output.add(message))
        await self._forward(emitter, output.finish())
        await emitter.write(self._chunk({}, output.finish_reason))
        options = self.body.stream_options
        if options is not None and options.include_usage:
            usage_chunk = {**self._envelope("chat.completion.chunk"), "choices": [], "usage": _usage(output)}
            await emitter.write(sse_event(usage_chunk))
        await emitter.write(SSE_DONE)

    async def complete(self, emitter: Emitter) -> None:
        output = Output(audio_rate=REALTIME_RATE, want_audio=self.audio)
        async with self.ctx.pipeline.stream(self.id, self.inputs, timeout=self.ctx.request_timeout) as messages:
            async for item in messages:
                output.add(item)
        output.finish()
        message: dict[str, Any] = {"role": "assistant", "content": output.text or None}
        if self.audio:
            fmt = "wav" if self.body.audio is None else self.body.audio.format
            pcm = bytes(output.pcm)
            data = encode_wav(pcm, REALTIME_RATE) if fmt == "wav" else pcm
            message["audio"] = {
                "id": self.audio_id,
                "data": b64(data),
                "expires_at": self.created + 3600,
                "transcript": output.transcript,
            }
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": output.finish_reason}
        answer = {**self._envelope("chat.completion"), "choices": [choice], "usage": _usage(output)}
        await emitter.respond(200, json_bytes(answer), "application/json")


def _usage(output: Output) -> dict[str, Any]:
    usage = output.usage or {}
    prompt = int(usage.get("prompt_tokens", 0))
    completion = int(usage.get("completion_tokens", 0))
    return {**usage, "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
