"""The text decode stage (terminal): the thinker's tokens → UTF-8-safe text deltas, with the checkpoint's tokenizer.

Built on :class:`~schedulers.detokenize.StreamingDetokenizeScheduler` (deltas never split a character;
they concatenate to the result's text).  The text is the tokenizer's ``decode(ids,
skip_special_tokens=True)`` of the generated ids, unaltered, so ``<|im_end|>`` and other special tokens
never show.

Which words a caller sees where follows OpenAI: a request that asked for audio (the thinker's token
chunks carry ``"want_audio": True``) gets its words as the audio's transcript (deltas with
``metadata={"modality": "transcript"}``, result key ``"transcript"``), a text-only request as the
message content (modality ``"text"``, result key ``"text"``).  The result is ``{"text" | "transcript",
"finish_reason", "usage", "token_ids"}``, the last three from the thinker's result payload (``token_ids``:
the generated ids, eos included).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnitrio.contract import OutgoingMessage, StagePayload, StreamItem
from schedulers.detokenize import StreamingDetokenizeScheduler, token_ids_of
from schedulers.qwen3_omni.checkpoint import preflight, require_model_dir


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
        if isinstance(item.data, dict) and "want_audio" in item.data:
            self._spoken[request_id] = bool(item.data["want_audio"])
        return super().on_stream_chunk(request_id, item)

    def clear_stream_state(self, request_id: str) -> None:
        super().clear_stream_state(request_id)
        self._spoken.pop(request_id, None)

    def _delta_messages(self, request_id: str, delta: str) -> list[OutgoingMessage]:
        messages = super()._delta_messages(request_id, delta)
        if self._wants_audio(request_id, None):
            for message in messages:
                message.metadata = {"modality": "transcript"}
        return messages

    def _payload_ids(self, payload: StagePayload) -> list[int]:
        data = payload.data
        ids = data.get("token_ids", data.get("output_token_ids")) if isinstance(data, dict) else None
        if ids is None:
            raise ValueError(
                f"{self.stage_name}: the thinker's result for {payload.request_id!r} has no 'token_ids' "
                f"(data of type {type(data).__name__})"
            )
        return token_ids_of(ids)

    def _wants_audio(self, request_id: str, payload: StagePayload | None) -> bool:
        if request_id in self._spoken:
            return self._spoken[request_id]
        data = payload.data if payload is not None else None
        return bool(data.get("want_audio")) if isinstance(data, dict) else False

    def _result(self, payload: StagePayload, text: str) -> dict[str, Any]:
        data = payload.data if isinstance(payload.data, dict) else {}
        key = "transcript" if self._wants_audio(payload.request_id, payload) else "text"
        ids = [int(i) for i in data.get("token_ids") or ()]
        return {key: text, "finish_reason": data.get("finish_reason"), "usage": data.get("usage"), "token_ids": ids}


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
