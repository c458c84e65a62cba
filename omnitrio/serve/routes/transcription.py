"""``POST /v1/audio/transcriptions``: an uploaded audio file to text.

The upload (multipart ``file``; WAV, FLAC, OGG or MP3, any rate, any channel count) is decoded and
resampled off the trio thread to mono float32 at 16 kHz before the pipeline sees it. The body is
capped at the server's limit (413 beyond it, decided before it is all read when the client
declares its length), and so is its length in seconds (``max_audio_seconds``: 413, decided from the
file's header before it is decoded). ``response_format`` is ``json`` (``{"text"}``), ``text`` or ``verbose_json``;
``stream=true`` sends ``transcript.text.delta`` events and one ``transcript.text.done``.
``verbose_json`` carries the language the recognizer heard and its timed ``segments`` (``id``,
``start``, ``end`` in seconds, ``text``, …), and ``words`` when ``timestamp_granularities[]`` includes
``word``. A form field this route does not know is a 400 naming it, except OpenAI's
:data:`FORM_HINTS`, accepted and ignored.
"""

from __future__ import annotations

from typing import Any

import trio
from starlette.datastructures import FormData, Headers, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request

from omnitrio.serve.api_errors import ApiError, bad_request, invalid_value
from omnitrio.serve.audio import TRANSCRIBE_RATE, AudioFormatError, audio_seconds, decode_audio_file, resample
from omnitrio.serve.context import ServeContext, new_id, read_body
from omnitrio.serve.model_names import check_model
from omnitrio.serve.openai_types import TRANSCRIPTION_FORMATS, form_bool, form_float
from omnitrio.serve.output import Delta, Output
from omnitrio.serve.routes.sse import SSE_MEDIA_TYPE, Emitter, WatchedResponse, json_bytes, sse_event

_FIELDS = ("model", "language", "prompt", "response_format", "stream", "temperature")
_GRANULARITIES = "timestamp_granularities[]"
FORM_HINTS = ("chunking_strategy", "include[]", "known_speaker_names[]", "known_speaker_references[]")
_KNOWN = frozenset({"file", *_FIELDS, _GRANULARITIES, *FORM_HINTS})


async def create_transcription(ctx: ServeContext, request: Request) -> WatchedResponse:
    ctx.require("transcription")
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise bad_request("transcriptions expect a multipart/form-data body with a 'file' field")
    form = await _parse_form(request.headers, await read_body(request, ctx.max_body_bytes), ctx.max_body_bytes)
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise bad_request("the form has no 'file' upload", "file", code="missing_file")
    unknown = sorted(set(form.keys()) - _KNOWN)
    if unknown:
        raise bad_request(f"unrecognized form field: {unknown[0]}", unknown[0], code="unknown_parameter")
    fields = {name: _text_field(form, name) for name in _FIELDS}
    check_model(ctx, "transcription", fields["model"])
    response_format = fields["response_format"] or "json"
    if response_format not in TRANSCRIPTION_FORMATS:
        raise invalid_value(
            f"response_format {response_format!r} is not supported; use one of {sorted(TRANSCRIPTION_FORMATS)}",
            "response_format",
        )
    granularities = [_as_text(value, _GRANULARITIES) for value in form.getlist(_GRANULARITIES)]
    for granularity in granularities:
        if granularity not in ("word", "segment"):
            raise invalid_value(f"{_GRANULARITIES} {granularity!r} is not 'word' or 'segment'", _GRANULARITIES)
    stream = form_bool(fields["stream"], "stream")
    form_float(fields["temperature"], "temperature")
    samples = await trio.to_thread.run_sync(_decode, await upload.read(), ctx.limits.max_audio_seconds)
    inputs: dict[str, Any] = {
        "task": "transcription",
        "audio": samples,
        "language": fields["language"] or None,
        "prompt": fields["prompt"] or None,
    }
    if response_format == "verbose_json":
        inputs["timestamps"] = "word" if "word" in granularities else "segment"
    job = _Transcription(ctx, inputs, response_format, fields["language"], samples.size / TRANSCRIBE_RATE)
    if stream:
        return WatchedResponse(job.events, media_type=SSE_MEDIA_TYPE, stream_error=_stream_error)
    media_type = "text/plain" if response_format == "text" else "application/json"
    return WatchedResponse(job.complete, media_type=media_type)


async def _parse_form(headers: Headers, body: bytes, limit: int) -> FormData:
    async def replay() -> Any:
        yield body

    try:
        return await MultiPartParser(headers, replay(), max_files=4, max_fields=32, max_part_size=limit).parse()
    except MultiPartException as exc:
        raise bad_request(f"invalid multipart body: {exc.message}") from None


def _text_field(form: FormData, name: str) -> str | None:
    value = form.get(name)
    return None if value is None else _as_text(value, name)


def _as_text(value: str | UploadFile, name: str) -> str:
    if isinstance(value, UploadFile):
        raise bad_request(f"form field {name!r} must be text, not a file", name)
    return value


def _decode(data: bytes, max_seconds: float) -> Any:
    seconds = audio_seconds(data)
    if seconds is not None and seconds > max_seconds:
        message = f"the uploaded audio is {seconds:.1f} s long; the limit is {max_seconds:g} s (max_audio_seconds)"
        raise ApiError(413, message, param="file", code="audio_too_long")
    try:
        samples, rate = decode_audio_file(data)
    except AudioFormatError as exc:
        raise bad_request(str(exc), "file", code="invalid_file_format") from None
    return resample(samples, rate, TRANSCRIBE_RATE)


def _stream_error(error: ApiError) -> bytes:
    return sse_event({"type": "error", **error.body()})


class _Transcription:
    def __init__(
        self, ctx: ServeContext, inputs: dict[str, Any], response_format: str, language: str | None, duration: float
    ) -> None:
        self.ctx = ctx
        self.id = new_id("transcription")
        self.inputs = inputs
        self.response_format = response_format
        self.language = language
        self.duration = duration
        self.output = Output(audio_rate=None, want_audio=False)

    async def complete(self, emitter: Emitter) -> None:
        async with self.ctx.pipeline.stream(self.id, self.inputs, timeout=self.ctx.request_timeout) as messages:
            async for message in messages:
                self.output.add(message)
        self.output.finish()
        text = self.output.text or self.output.transcript
        match self.response_format:
            case "text":
                await emitter.respond(200, text.encode(), "text/plain; charset=utf-8")
            case "verbose_json":
                heard = self.output.result("language")
                verbose = {
                    "task": "transcribe",
                    "language": heard if isinstance(heard, str) else self.language or "unknown",
                    "duration": self.duration,
                    "text": text,
                    "segments": self.output.result("segments") or [],
                }
                if self.inputs.get("timestamps") == "word":
                    verbose["words"] = self.output.result("words") or []
                await emitter.respond(200, json_bytes(verbose), "application/json")
            case _:
                answer: dict[str, Any] = {"text": text}
                if self.output.usage is not None:
                    answer["usage"] = self.output.usage
                await emitter.respond(200, json_bytes(answer), "application/json")

    async def events(self, emitter: Emitter) -> None:
        async with self.ctx.pipeline.stream(self.id, self.inputs, timeout=self.ctx.request_timeout) as messages:
            async for message in messages:
                await self._forward(emitter, self.output.add(message))
        await self._forward(emitter, self.output.finish())
        text = self.output.text or self.output.transcript
        await emitter.write(sse_event({"type": "transcript.text.done", "text": text}))

    async def _forward(self, emitter: Emitter, deltas: list[Delta]) -> None:
        """Text deltas; ``transcript`` deltas only from a pipeline that sends no text."""
        for delta in deltas:
            if delta.kind == "text" or not self.output.text_parts:
                await emitter.write(sse_event({"type": "transcript.text.delta", "delta": delta.value}))
