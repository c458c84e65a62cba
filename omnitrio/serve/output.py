"""Turning a pipeline's message stream into what a response needs: deltas to forward, totals to return.

One :class:`Output` per request. :meth:`Output.add` takes each message in the order the pipeline
yields it and returns the :class:`Delta` items to forward (streaming routes send them, non-streaming
routes ignore them); :meth:`Output.finish` returns the last deltas, including text, transcript or audio
that a pipeline only put in its ``CompleteMessage.result`` and never streamed, so a pipeline that does
not stream is served the same way as one that does. An audio chunk that carries the ``text`` it
speaks gives a transcript delta just before its audio delta. Totals (``text``, ``transcript``, ``pcm``,
``usage``) include every delta handed out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from omnitrio.messages import CompleteMessage, StreamMessage
from omnitrio.serve.audio import PcmStream


@attrs.frozen
class Delta:
    """One piece to forward: a text or transcript string, or PCM16 bytes at the output rate."""

    kind: Literal["text", "transcript", "audio"]
    value: Any


class Output:
    """Everything one request produced; audio is resampled to ``audio_rate`` (None: the pipeline's rate)."""

    def __init__(self, *, audio_rate: int | None, want_audio: bool = True) -> None:
        self.want_audio = want_audio
        self.text_parts: list[str] = []
        self.transcript_parts: list[str] = []
        self.pcm = bytearray()
        self.usage: dict[str, Any] | None = None
        self._audio = PcmStream(audio_rate)
        self._results: dict[str, Any] = {}

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def transcript(self) -> str:
        return "".join(self.transcript_parts)

    @property
    def finish_reason(self) -> str:
        """``"length"`` when the answer was cut at its token limit, ``"tool_calls"`` when it calls tools,
        else ``"stop"``."""
        if self.tool_calls:
            return "tool_calls"
        return "length" if self._results.get("finish_reason") == "length" else "stop"

    def result(self, key: str) -> Any:
        """A field of the pipeline's result (the first terminal stage to name it), or None."""
        return self._results.get(key)

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The tool calls the answer made (OpenAI's chat shape), from the results; empty when none."""
        calls = self._results.get("tool_calls")
        return list(calls) if isinstance(calls, list) else []

    @property
    def sample_rate(self) -> int | None:
        """The rate of ``pcm`` (known once the first audio arrived, or fixed up front)."""
        return self._audio.rate

    def add(self, message: StreamMessage | CompleteMessage) -> list[Delta]:
        match message:
            case StreamMessage(modality="audio", chunk=chunk):
                spoken = chunk.get("text") if isinstance(chunk, Mapping) else None
                said = [self._record(Delta("transcript", spoken))] if isinstance(spoken, str) and spoken else []
                return said + (self._audio_delta(self._audio.push(chunk)) if self.want_audio else [])
            case StreamMessage(modality="transcript", chunk=chunk):
                return [self._record(Delta("transcript", str(chunk)))]
            case StreamMessage(chunk=chunk):
                return [self._record(Delta("text", str(chunk)))]
            case CompleteMessage(result=result):
                self._merge(result)
        return []

    def finish(self) -> list[Delta]:
        """Deltas still owed: the resampler tail and anything only the results carried."""
        deltas: list[Delta] = []
        results = self._results
        if self.want_audio:
            if not self.pcm and isinstance(results.get("audio"), Mapping):
                deltas += self._audio_delta(self._audio.push(results["audio"]))
            deltas += self._audio_delta(self._audio.flush())
        if not self.text_parts and isinstance(results.get("text"), str) and results["text"]:
            deltas.append(self._record(Delta("text", results["text"])))
        if not self.transcript_parts and isinstance(results.get("transcript"), str) and results["transcript"]:
            deltas.append(self._record(Delta("transcript", results["transcript"])))
        return deltas

    def _audio_delta(self, pcm: bytes) -> list[Delta]:
        return [self._record(Delta("audio", pcm))] if pcm else []

    def _record(self, delta: Delta) -> Delta:
        match delta.kind:
            case "text":
                self.text_parts.append(delta.value)
            case "transcript":
                self.transcript_parts.append(delta.value)
            case "audio":
                self.pcm += delta.value
        return delta

    def _merge(self, result: Any) -> None:
        """Results of several terminal stages merge; the first stage to name a key wins."""
        match result:
            case str():
                fields: Mapping[str, Any] = {"text": result}
            case Mapping():
                fields = result
            case _:
                fields = {}
        for key, value in fields.items():
            self._results.setdefault(key, value)
        if isinstance(fields.get("usage"), Mapping) and self.usage is None:
            self.usage = dict(fields["usage"])
