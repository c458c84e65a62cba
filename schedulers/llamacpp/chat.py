"""A GGUF model's conversation format: its chat template, and text ⇄ tokens by llama.cpp's tokenizer.

:class:`LlamaChat` renders ``tokenizer.chat_template`` from the file's metadata as Hugging Face's
``apply_chat_template`` does (:class:`~schedulers.ar.chat_tokenizer.ChatTemplate`, ``bos_token`` and
``eos_token`` named from the vocabulary), and
tokenizes the rendered text with llama.cpp's own tokenizer, control tokens written in it
(``<|im_start|>``) read as such.  :meth:`LlamaChat.decode` gives an answer's text: control tokens
dropped, a character split across tokens shown as U+FFFD until its last byte arrives.  Tools are
rendered into templates that read a ``tools`` variable (:attr:`LlamaChat.supports_tools`); offering
them to one that does not is an :class:`~omnitrio.contract.InvalidRequest` naming ``tools``.  The
format its model writes calls in is :attr:`LlamaChat.tool_format`
(:mod:`schedulers.llamacpp.tool_calls`); an earlier call's ``arguments`` (JSON text in OpenAI's
shape) reach the template as the object templates expect.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from schedulers.ar.chat_tokenizer import ChatTemplate
from schedulers.llamacpp.errors import ModelFileError
from schedulers.llamacpp.model import LlamaModel
from schedulers.llamacpp.tool_calls import ToolCallFormat, tool_format_of


class LlamaChat:
    """Conversation → prompt tokens, answer tokens → text, for one loaded model."""

    def __init__(self, model: LlamaModel, template: str | None = None) -> None:
        template = template if template is not None else model.meta("tokenizer.chat_template")
        if not template:
            raise ModelFileError(
                model.path, "no tokenizer.chat_template in its metadata (not an instruction-tuned model?)"
            )
        llama = model.llama
        try:
            self.template = ChatTemplate(
                template,
                bos_token=model.token_text(llama.llama_vocab_bos(model.vocab)),
                eos_token=model.token_text(llama.llama_vocab_eos(model.vocab)),
            )
        except Exception as exc:
            raise ModelFileError(model.path, f"its tokenizer.chat_template does not parse: {exc}") from exc
        self.supports_tools = self.template.supports_tools
        self.tool_format: ToolCallFormat | None = tool_format_of(template) if self.supports_tools else None
        self._model = model

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """See :meth:`~schedulers.ar.chat_tokenizer.ChatTemplate.render`."""
        messages = [_with_argument_objects(m) if m.get("tool_calls") else m for m in messages]
        return self.template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)

    def encode(self, text: str) -> list[int]:
        return self._model.tokenize(text)

    def encode_chat(self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        return self.encode(self.render(messages, tools=tools))

    def piece(self, token: int, keep: frozenset[str] = frozenset()) -> bytes:
        """The bytes ``token`` adds to an answer: none for a control token, unless its text is in ``keep``."""
        piece = self._model.piece(token)
        if not piece and keep and (text := self._model.token_text(token)) in keep:
            return text.encode()
        return piece

    def decode(self, ids: Sequence[int]) -> str:
        return b"".join(map(self._model.piece, ids)).decode("utf-8", errors="replace")


def _with_argument_objects(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with each call's ``arguments`` parsed from JSON text (kept as text when it is not JSON)."""
    calls = []
    for call in message["tool_calls"]:
        function = dict(call["function"])
        try:
            function["arguments"] = json.loads(function["arguments"])
        except (TypeError, ValueError):
            pass
        calls.append({**call, "function": function})
    return {**message, "tool_calls": calls}
