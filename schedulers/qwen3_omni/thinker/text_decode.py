"""The text decode stage (terminal): the thinker's tokens → UTF-8-safe text deltas, with the checkpoint's tokenizer.

Built on :class:`~schedulers.detokenize.StreamingDetokenizeScheduler` (deltas never split a character;
they concatenate to the result's text).  The text is the tokenizer's ``decode(ids,
skip_special_tokens=True)`` of the generated ids, unaltered, so ``<|im_end|>`` and other special tokens
never show.

Its inputs are the thinker's :class:`~schedulers.qwen3_omni.handoffs.DecodeToken` chunks and its
:class:`~schedulers.qwen3_omni.handoffs.ThinkerResult`.  Which words a caller sees where follows OpenAI: a
request that asked for audio (``want_audio``) gets its words as the audio's transcript (deltas with
``metadata={"modality": "transcript"}``, result key ``"transcript"``), a text-only request as the
message content (modality ``"text"``, result key ``"text"``).  The result (what the server reads) is
``{"text" | "transcript", "finish_reason", "usage", "token_ids"}``, the last three from the thinker's
result (``token_ids``: the generated ids, eos included).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from omnitrio.contract import OutgoingMessage, StagePayload, StreamItem
from schedulers.detokenize import StreamingDetokenizeScheduler
from schedulers.qwen3_omni.checkpoint import preflight, require_model_dir
from schedulers.qwen3_omni.handoffs import DecodeToken, ThinkerResult


class SkipSpecial:
    """``decode`` of an HF tokenizer with special tokens skipped (what the detokenizer calls)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))


class TextDecodeScheduler(StreamingDetokenizeScheduler):
    """Deltas as ``text`` or ``transcript`` (module docstring)."""

    def __init__(self, tokenizer: Any, *, stage_name: str = "decode") -> None:
        super().__init__(SkipSpecial(tokenizer), None, build_result=self._result, stage_name=stage_name)
        self._spoken: dict[str, bool] = {}

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        token = item.data
        if not isinstance(token, DecodeToken):
            raise TypeError(f"{self.stage_name}: stream chunk {item.chunk_id} for {request_id!r} is not a DecodeToken")
        self._spoken[request_id] = token.want_audio
        return super().on_stream_chunk(request_id, attrs.evolve(item, data=token.token_id))

    def clear_stream_state(self, request_id: str) -> None:
        super().clear_stream_state(request_id)
        self._spoken.pop(request_id, None)

    def _delta_messages(self, request_id: str, delta: str) -> list[OutgoingMessage]:
        messages = super()._delta_messages(request_id, delta)
        if self._wants_audio(request_id, None):
            for message in messages:
                message.metadata = {"modality": "transcript"}
        return messages

    def _thinker_result(self, payload: StagePayload) -> ThinkerResult:
        if not isinstance(payload.data, ThinkerResult):
            raise ValueError(
                f"{self.stage_name}: the thinker's result for {payload.request_id!r} must be a ThinkerResult, "
                f"got {type(payload.data).__name__}"
            )
        return payload.data

    def _payload_ids(self, payload: StagePayload) -> list[int]:
        return list(self._thinker_result(payload).token_ids)

    def _wants_audio(self, request_id: str, payload: StagePayload | None) -> bool:
        if request_id in self._spoken:
            return self._spoken[request_id]
        return payload is not None and isinstance(payload.data, ThinkerResult) and payload.data.want_audio

    def _result(self, payload: StagePayload, text: str) -> dict[str, Any]:
        result = self._thinker_result(payload)
        key = "transcript" if self._wants_audio(payload.request_id, payload) else "text"
        return {
            key: text,
            "finish_reason": result.finish_reason,
            "usage": result.usage,
            "token_ids": list(result.token_ids),
        }


def create_decode_stage(*, model_dir: str | Path | None = None) -> TextDecodeScheduler:
    """Stage factory: the checkpoint's tokenizer (``model_dir``), special tokens skipped."""
    from transformers import AutoTokenizer

    model_dir = require_model_dir(model_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as exc:
        raise ValueError(f"decode stage: cannot load the tokenizer from {model_dir}: {exc}") from exc
    return TextDecodeScheduler(tokenizer)


create_decode_stage.preflight = preflight  # type: ignore[attr-defined]
