"""The stages around an SGLang thinker (:mod:`schedulers.ar.sglang_backend`): a prompt string in, text out.

SGLang tokenizes and detokenizes itself, so a pipeline with an SGLang thinker needs no tokenizer stage:

* :func:`create_chatml_preprocess_stage` turns chat inputs (OpenAI messages with text content, or a bare
  string) into ``{"prompt", "max_new_tokens", "temperature"}`` with the prompt in Qwen's ChatML
  (``<|im_start|>role\\n…<|im_end|>``); audio and image parts are refused naming the part (the adapter
  passes text to the engine, not media);
* :func:`create_text_relay_stage` forwards the thinker's ``{"text": delta}`` chunks to the caller as
  ``text`` and completes with ``{"text", "finish_reason"}``.

``sglang`` is imported only when the thinker's factory runs, never by these stages or by validation.
"""

from __future__ import annotations

from typing import Any

from omnitrio.contract import OutgoingMessage, StagePayload, StreamItem
from schedulers.simple import SimpleScheduler
from schedulers.streaming import StreamingSimpleScheduler


def chatml_prompt(inputs: Any) -> str:
    """Qwen's ChatML prompt for chat inputs (or a bare string); a media part is a ``ValueError`` naming it."""
    if isinstance(inputs, str):
        inputs = {"task": "chat", "messages": [{"role": "user", "content": inputs}]}
    messages = inputs.get("messages") if isinstance(inputs, dict) else None
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages: must be a non-empty list")
    lines = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"messages[{i}]: must be a dict with a string 'role'")
        lines.append(f"<|im_start|>{message['role']}\n{_text(message.get('content'), f'messages[{i}]')}<|im_end|>")
    return "\n".join([*lines, "<|im_start|>assistant\n"])


def _text(content: Any, where: str) -> str:
    match content:
        case None:
            return ""
        case str():
            return content
        case list():
            texts = []
            for j, part in enumerate(content):
                match part:
                    case {"type": "text", "text": str(text)}:
                        texts.append(text)
                    case _:
                        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                        raise ValueError(f"{where}.content[{j}]: only text parts reach an SGLang thinker, got {kind!r}")
            return " ".join(texts)
    raise ValueError(f"{where}.content: must be a string or a list of parts, got {type(content).__name__}")


def create_chatml_preprocess_stage(*, max_new_tokens: int = 512, hidden_states: bool = False) -> SimpleScheduler:
    """Chat inputs → the SGLang thinker's ``{"prompt", "max_new_tokens", "temperature"}``; a request's
    ``max_tokens`` is capped at ``max_new_tokens``.  ``hidden_states`` asks the engine for the generated
    tokens' hidden states (``return_hidden_states``; the engine needs ``enable_return_hidden_states``)."""

    def preprocess(payload: StagePayload) -> StagePayload:
        inputs = payload.data["raw_inputs"] if isinstance(payload.data, dict) else payload.data
        data: dict[str, Any] = {"prompt": chatml_prompt(inputs), "max_new_tokens": max_new_tokens}
        if isinstance(inputs, dict):
            data["max_new_tokens"] = min(inputs.get("max_tokens") or max_new_tokens, max_new_tokens)
            if inputs.get("temperature") is not None:
                data["temperature"] = inputs["temperature"]
        if hidden_states:
            data["return_hidden_states"] = True
        payload.data = data
        return payload

    return SimpleScheduler(preprocess)


class TextRelayScheduler(StreamingSimpleScheduler):
    """``{"text": delta}`` chunks in, ``str`` deltas (modality ``text``) out; result ``{"text", "finish_reason"}``."""

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
