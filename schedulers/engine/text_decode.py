"""The text decode stage (terminal): a decoder's tokens → UTF-8-safe text deltas, with the checkpoint's tokenizer.

Built on :class:`~schedulers.detokenize.StreamingDetokenizeScheduler` (deltas never split a character;
they concatenate to the result's text).  The text is the tokenizer's ``decode(ids,
skip_special_tokens=True)`` of the generated ids, unaltered, so ``<|im_end|>`` and other special tokens
never show.

Its inputs are a family's token chunks and its thinker's result, of the classes the family passes
(``token_type``, ``result_type``: :class:`DecodeTokenLike`, :class:`ThinkerResultLike`, e.g.
:class:`schedulers.engine.handoffs.DecodeToken` and ``ThinkerResult``); anything else fails the
request.

Which words a caller sees where follows OpenAI: a request that asked for audio (``want_audio``) gets its words
as the audio's transcript (deltas with ``metadata={"modality": "transcript"}``, result key ``"transcript"``),
a text-only request as the message content (modality ``"text"``, result key ``"text"``). The result (what the
server reads) is ``{"text" | "transcript", "finish_reason", "usage", "token_ids"}``, the last three from the
thinker's result (``token_ids``: the generated ids, eos included).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import attrs

from omnitrio.contract import OutgoingMessage, StagePayload, StreamItem
from schedulers.detokenize import StreamingDetokenizeScheduler


class DecodeTokenLike(Protocol):
    """One generated token, as soon as it is chosen: its id, and whether the answer is spoken."""

    @property
    def token_id(self) -> int: ...
    @property
    def want_audio(self) -> bool: ...


class ThinkerResultLike(Protocol):
    """The decoder's result: the generated ids (eos included), why it ended, OpenAI's usage, spoken or not."""

    @property
    def token_ids(self) -> tuple[int, ...]: ...
    @property
    def finish_reason(self) -> str: ...
    @property
    def usage(self) -> dict[str, int]: ...
    @property
    def want_audio(self) -> bool: ...


class SkipSpecial:
    """``decode`` of an HF tokenizer with special tokens skipped (what the detokenizer calls)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))


class TextDecodeScheduler(StreamingDetokenizeScheduler):
    """Deltas as ``text`` or ``transcript`` (module docstring)."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        token_type: type[DecodeTokenLike],
        result_type: type[ThinkerResultLike],
        stage_name: str = "decode",
    ) -> None:
        super().__init__(SkipSpecial(tokenizer), None, build_result=self._result, stage_name=stage_name)
        self.token_type = token_type
        self.result_type = result_type
        self._spoken: dict[str, bool] = {}

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        token = item.data
        if not isinstance(token, self.token_type):
            kind = self.token_type.__name__
            raise TypeError(f"{self.stage_name}: stream chunk {item.chunk_id} for {request_id!r} is not a {kind}")
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

    def _thinker_result(self, payload: StagePayload) -> ThinkerResultLike:
        if not isinstance(payload.data, self.result_type):
            raise ValueError(
                f"{self.stage_name}: the thinker's result for {payload.request_id!r} must be a "
                f"{self.result_type.__name__}, "
                f"got {type(payload.data).__name__}"
            )
        return payload.data

    def _payload_ids(self, payload: StagePayload) -> list[int]:
        return list(self._thinker_result(payload).token_ids)

    def _wants_audio(self, request_id: str, payload: StagePayload | None) -> bool:
        if request_id in self._spoken:
            return self._spoken[request_id]
        return payload is not None and isinstance(payload.data, self.result_type) and payload.data.want_audio

    def _result(self, payload: StagePayload, text: str) -> dict[str, Any]:
        result = self._thinker_result(payload)
        key = "transcript" if self._wants_audio(payload.request_id, payload) else "text"
        return {
            key: text,
            "finish_reason": result.finish_reason,
            "usage": result.usage,
            "token_ids": list(result.token_ids),
        }


def load_text_decode(
    model_dir: str | Path, *, token_type: type[DecodeTokenLike], result_type: type[ThinkerResultLike]
) -> TextDecodeScheduler:
    """The stage over the tokenizer of ``model_dir`` (a family's factory checks the directory first); a
    tokenizer that does not load raises ``ValueError`` naming the directory."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as exc:
        raise ValueError(f"decode stage: cannot load the tokenizer from {model_dir}: {exc}") from exc
    return TextDecodeScheduler(tokenizer, token_type=token_type, result_type=result_type)
