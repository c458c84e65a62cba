"""A GGUF model's conversation format: its chat template, and text ⇄ tokens by llama.cpp's tokenizer.

:class:`LlamaChat` renders ``tokenizer.chat_template`` from the file's metadata with jinja2 in a
sandbox, as Hugging Face's ``apply_chat_template`` does (``bos_token``/``eos_token`` named from the
vocabulary, ``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII text), and
tokenizes the rendered text with llama.cpp's own tokenizer, control tokens written in it
(``<|im_start|>``) read as such.  :meth:`LlamaChat.decode` gives an answer's text: control tokens
dropped, a character split across tokens shown as U+FFFD until its last byte arrives.  Tools are
rendered into templates that read a ``tools`` variable (:attr:`LlamaChat.supports_tools`); offering
them to one that does not is an :class:`~omnitrio.contract.InvalidRequest` naming ``tools``.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any

from schedulers.ar.chat_tokenizer import reads_tools, tool_variables
from schedulers.llamacpp.errors import ModelFileError
from schedulers.llamacpp.model import LlamaModel


def _raise(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


class LlamaChat:
    """Conversation → prompt tokens, answer tokens → text, for one loaded model."""

    def __init__(self, model: LlamaModel, template: str | None = None) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        template = template if template is not None else model.meta("tokenizer.chat_template")
        if not template:
            raise ModelFileError(
                model.path, "no tokenizer.chat_template in its metadata (not an instruction-tuned model?)"
            )
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson
        try:
            self._template = env.from_string(template)
        except Exception as exc:
            raise ModelFileError(model.path, f"its tokenizer.chat_template does not parse: {exc}") from exc
        self.supports_tools = reads_tools(env, template)
        self._model = model
        llama = model.llama
        self._names = {
            "bos_token": model.token_text(llama.llama_vocab_bos(model.vocab)),
            "eos_token": model.token_text(llama.llama_vocab_eos(model.vocab)),
        }

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The chat template applied to ``messages`` (dicts with ``role`` and string ``content``, and
        ``tool_calls`` / ``tool_call_id`` where the conversation has them) and the offered ``tools``."""
        extra = tool_variables(tools, supported=self.supports_tools)
        return str(
            self._template.render(
                messages=list(messages), add_generation_prompt=add_generation_prompt, **self._names, **extra
            )
        )

    def encode(self, text: str) -> list[int]:
        return self._model.tokenize(text)

    def encode_chat(self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        return self.encode(self.render(messages, tools=tools))

    def piece(self, token: int) -> bytes:
        """The bytes ``token`` adds to an answer (none for a control token)."""
        return self._model.piece(token)

    def decode(self, ids: Sequence[int]) -> str:
        return b"".join(map(self._model.piece, ids)).decode("utf-8", errors="replace")
