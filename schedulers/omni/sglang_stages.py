"""Stages of ``configs/qwen3-omni-sglang.toml``: the omni graph with a real thinker served by SGLang (GPU).

SGLang tokenizes and detokenizes itself, so this graph differs from omni-tiny's in two places:

* :func:`create_chatml_preprocess_stage` turns chat inputs into a ChatML prompt *string*
  (``<|im_start|>role\\n…<|im_end|>``, Qwen's template) for
  :func:`~schedulers.ar.sglang_backend.create_sglang_scheduler`, which streams
  ``{"text": delta}``;
* :func:`create_text_relay_stage` forwards those deltas to the caller as ``text`` chunks (the
  detokenizer's place) and completes with ``{"text", "finish_reason"}``.

The talker and code2wav stay the toy ones (Qwen3-Omni's own talker and code2wav need model code
this repository does not have); :func:`project_to_hashed_talker` folds the large vocabulary into
the tiny talker's.  Media parts (audio, images) are refused: the SGLang adapter passes text only.
``sglang`` is imported only when the thinker's factory runs, never by validation.
"""

from __future__ import annotations

from typing import Any

import torch

from omnitrio.contract import OutgoingMessage, StagePayload, StreamItem
from schedulers.ar.talker import TalkerScheduler, TinyTalker
from schedulers.omni.inputs import parse_chat, wants_audio
from schedulers.simple import SimpleScheduler
from schedulers.streaming import StreamingSimpleScheduler


def chatml_prompt(inputs: Any) -> str:
    """Qwen's ChatML prompt for chat inputs (or a bare string); media parts are a ``ValueError``."""
    if isinstance(inputs, str):
        inputs = {"task": "chat", "messages": [{"role": "user", "content": inputs}]}
    turn = parse_chat(inputs)
    if turn.audio or turn.images:
        raise ValueError("qwen3-omni config: audio and image parts are not wired to the SGLang thinker yet")
    lines = []
    for message in inputs["messages"]:
        content = message.get("content")
        text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content or ())
        lines.append(f"<|im_start|>{message['role']}\n{text}<|im_end|>")
    return "\n".join([*lines, "<|im_start|>assistant\n"])


def create_chatml_preprocess_stage(*, max_new_tokens: int = 512) -> SimpleScheduler:
    """Chat inputs → ``{"prompt", "max_new_tokens", "temperature"}`` for the SGLang thinker.

    A request that asks for audio also asks for ``return_hidden_states``: the talker gets them.
    """

    def preprocess(payload: StagePayload) -> StagePayload:
        inputs = payload.data["raw_inputs"] if isinstance(payload.data, dict) else payload.data
        data: dict[str, Any] = {"prompt": chatml_prompt(inputs), "max_new_tokens": max_new_tokens}
        if isinstance(inputs, dict):
            data["max_new_tokens"] = min(inputs.get("max_tokens") or max_new_tokens, max_new_tokens)
            if inputs.get("temperature") is not None:
                data["temperature"] = inputs["temperature"]
        if wants_audio(inputs):
            data["return_hidden_states"] = True
        payload.data = data
        return payload

    return SimpleScheduler(preprocess)


class TextRelayScheduler(StreamingSimpleScheduler):
    """``{"text": delta}`` chunks in, ``str`` deltas (modality ``text``) out; result ``{"text", ...}``."""

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        return True

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        data = item.data
        delta = data.get("text") if isinstance(data, dict) else data
        if not isinstance(delta, str):
            raise TypeError(f"text relay: chunk {item.chunk_id} must be {{'text': str}}, got {type(data).__name__}")
        return [OutgoingMessage(request_id, "stream", delta, metadata={"modality": "text"})] if delta else []

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage]:
        payload = self.stream_payloads[request_id]
        data = payload.data if isinstance(payload.data, dict) else {}
        payload.data = {"text": data.get("text", ""), "finish_reason": data.get("finish_reason")}
        return [OutgoingMessage(request_id, "result", payload)]


def create_text_relay_stage() -> TextRelayScheduler:
    return TextRelayScheduler()


TALKER_VOCAB = 4096


def project_to_hashed_talker(payload: StagePayload) -> StagePayload:
    """The talker's input: the thinker's token ids folded into the toy talker's vocabulary (``id % 4096``),
    its text, and its ``hidden_states`` (``[generated, dim]``, which a real talker reads) when it has them."""
    data = payload.data if isinstance(payload.data, dict) else {}
    ids = [int(t) % TALKER_VOCAB for t in data.get("output_token_ids") or ()]
    talker: dict[str, Any] = {"output_token_ids": ids, "text": data.get("text", "")}
    if data.get("hidden_states") is not None:
        talker["hidden_states"] = data["hidden_states"]
    return StagePayload(payload.request_id, payload.request, talker)


def create_hashed_talker_stage(*, seed: int = 3, frames_per_token: int = 4, chunk_frames: int = 8) -> TalkerScheduler:
    """The toy talker over ``TALKER_VOCAB`` ids (see :func:`project_to_hashed_talker`)."""
    torch.set_num_threads(1)
    talker = TinyTalker(vocab_size=TALKER_VOCAB, frames_per_token=frames_per_token, seed=seed)
    return TalkerScheduler(talker, chunk_frames=chunk_frames)
