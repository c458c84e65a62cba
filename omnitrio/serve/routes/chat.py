"""``POST /v1/chat/completions``: text and audio output, whole or streamed as SSE.

Streaming follows OpenAI's audio chat streaming: a first chunk with ``delta.role`` (sent once the
pipeline's first output arrived, so a request a stage refuses, e.g. one that cannot fit the model's
context, is still an error answer with its 4xx status, not a 200 and an error event), then
``delta.content`` for text, ``delta.audio.data`` (base64 PCM16 mono 24 kHz, whatever
``audio.format`` says) and ``delta.audio.transcript`` for speech, the model's tool calls whole in one
``delta.tool_calls`` chunk (each with its ``index``), a last chunk with ``finish_reason`` (``"stop"``,
``"length"`` or ``"tool_calls"``), an optional usage chunk (``stream_options.include_usage``) and
``data: [DONE]``. A whole answer carries ``message.audio.data`` encoded as ``audio.format``
(``wav`` or ``pcm16``, 24 kHz), ``message.audio.transcript`` and the model's ``message.tool_calls``.
``tools`` and ``tool_choice`` reach the responder as the client sent them.

Messages reach the pipeline as the client sent them. An ``input_audio`` part must carry base64
``data`` in ``format`` ``wav`` (any rate, a file ``soundfile`` reads) or ``pcm16`` (raw PCM16 mono
at 24 kHz); one that does not decode is a 400 naming the part, before the pipeline sees it.
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any

import trio
from starlette.requests import Request

from omnitrio.serve.api_errors import ApiError, bad_request
from omnitrio.serve.audio import REALTIME_RATE, AudioFormatError, b64, decode_audio_file, encode_wav
from omnitrio.serve.context import ServeContext, new_id, read_body
from omnitrio.serve.model_names import check_model
from omnitrio.serve.openai_types import ChatRequest, check_chat, decode_json, logit_bias
from omnitrio.serve.output import Delta, Output
from omnitrio.serve.routes.sse import SSE_DONE, SSE_MEDIA_TYPE, Emitter, WatchedResponse, json_bytes, sse_event


async def chat_completions(ctx: ServeContext, request: Request) -> WatchedResponse:
    ctx.require("chat")
    body = decode_json(await read_body(request, ctx.max_body_bytes), ChatRequest)
    check_model(ctx, "chat", body.model)
    # A pipeline whose stages know their voices (PipelineConfig.stage_voices) answers an unknown one itself.
    modalities = check_chat(body, stage_voices=ctx.stage_voices)
    await trio.to_thread.run_sync(check_input_audio, body.messages)
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
        "stream": body.stream,
        "stop": body.stop,
        "frequency_penalty": body.frequency_penalty,
        "presence_penalty": body.presence_penalty,
        "logit_bias": logit_bias(body),
        "tools": body.tools,
        "tool_choice": body.tool_choice,
    }
    chat = _Chat(ctx, new_id("chatcmpl"), body, inputs, "audio" in modalities)
    if body.stream:
        return WatchedResponse(chat.stream, media_type=SSE_MEDIA_TYPE, stream_error=_stream_error)
    return WatchedResponse(chat.complete, media_type="application/json")


def check_input_audio(messages: list[dict[str, Any]]) -> None:
    """400 naming the part unless every ``input_audio`` part decodes (blocking: call it off the trio thread)."""
    for i, message in enumerate(messages):
        content = message.get("content")
        for j, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict) and part.get("type") == "input_audio":
                _check_audio_part(part.get("input_audio"), f"messages[{i}].content[{j}].input_audio")


def _check_audio_part(spec: Any, where: str) -> None:
    match spec:
        case {"data": str(encoded), "format": "wav" | "pcm16" as fmt}:
            _decode_audio_part(encoded, fmt, where)
        case {"data": str(), "format": fmt}:
            raise bad_request(f"{where}.format {fmt!r} is not supported; use 'wav' or 'pcm16'", f"{where}.format")
        case _:
            raise bad_request(f"{where} must be an object with base64 'data' and a 'format'", where)


def _decode_audio_part(encoded: str, fmt: str, where: str) -> None:
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{where}.data is not valid base64", f"{where}.data") from None
    try:
        if fmt == "wav":
            decode_audio_file(data)
        elif not data or len(data) % 2:
            raise AudioFormatError(f"pcm16 audio needs a non-zero, even number of bytes, got {len(data)}")
    except AudioFormatError as exc:
        raise bad_request(f"{where}.data: {exc}", f"{where}.data", code="invalid_audio") from None


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
            # Nothing is written before the pipeline's first output: a request it refuses (one that
            # cannot fit the context…) is still an error answer with its own status, not a 200.
            first = await anext(aiter(messages), None)
            await emitter.write(self._chunk({"role": "assistant", "content": ""}))
            if first is not None:
                await self._forward(emitter, output.add(first))
            async for message in messages:
                await self._forward(emitter, output.add(message))
        await self._forward(emitter, output.finish())
        if output.tool_calls:
            calls = [{"index": i, **call} for i, call in enumerate(output.tool_calls)]
            await emitter.write(self._chunk({"tool_calls": calls}))
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
        if output.tool_calls:
            message["tool_calls"] = output.tool_calls
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
