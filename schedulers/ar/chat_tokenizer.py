"""The tokenizer and chat template a GGUF file carries in its metadata.

:func:`chat_tokenizer` builds a byte-level BPE ``tokenizers.Tokenizer`` from
``tokenizer.ggml.tokens`` / ``merges`` (``tokenizer.ggml.model == "gpt2"``), with the control tokens
(``token_type == 3``, e.g. ``<|im_start|>``) matched whole in text, and renders
``tokenizer.chat_template`` with jinja2 in a sandbox, as Hugging Face does.  ``encode(render(...))``
of a conversation is the prompt the model was trained on; ``decode`` drops control tokens.
Whether the model can be offered tools is read from the template: it can when the template reads a
``tools`` variable (:attr:`ChatTokenizer.supports_tools`); rendering tools for one that does not is an
:class:`~omnitrio.contract.InvalidRequest` naming ``tools`` (a 400), never a prompt without them.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any, Final

from omnitrio.contract import InvalidRequest
from schedulers.ar.gguf_file import GGUFModel

_CONTROL: Final = 3
# llama.cpp's pre-tokenizers: digits one by one, then GPT-2's split ("smollm", "starcoder", ...).
_DIGITS_FIRST: Final = frozenset({"smollm", "starcoder", "refact", "command-r"})


def _raise(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


class ChatTemplate:
    """A model's ``tokenizer.chat_template`` rendered as Hugging Face's ``apply_chat_template`` does:
    jinja2 in a sandbox with ``bos_token``/``eos_token``, ``raise_exception``, ``strftime_now`` and a
    ``tojson`` that keeps non-ASCII text.  A template that does not parse raises jinja2's error."""

    def __init__(self, template: str, *, bos_token: str, eos_token: str) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        environment.globals["raise_exception"] = _raise
        environment.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        environment.filters["tojson"] = _tojson
        self._template = environment.from_string(template)
        self.supports_tools = reads_tools(environment, template)
        self._names = {"bos_token": bos_token, "eos_token": eos_token}

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The template applied to ``messages`` (dicts with ``role`` and string ``content``, and
        ``tool_calls`` / ``tool_call_id`` where the conversation has them) and the offered ``tools``."""
        extra = tool_variables(tools, supported=self.supports_tools)
        return str(
            self._template.render(
                messages=list(messages), add_generation_prompt=add_generation_prompt, **self._names, **extra
            )
        )


class ChatTokenizer:
    """Text ⇄ ids and conversation → prompt text for one GGUF model (see the module docstring)."""

    def __init__(self, inner: Any, template: str, eos_token_id: int, bos_token: str, eos_token: str) -> None:
        self._inner = inner
        self.vocab_size: int = inner.get_vocab_size(with_added_tokens=True)
        self.eos_token_id = eos_token_id
        self.template = ChatTemplate(template, bos_token=bos_token, eos_token=eos_token)
        self.supports_tools = self.template.supports_tools

    def encode(self, text: str) -> list[int]:
        return list(self._inner.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._inner.decode(list(ids), skip_special_tokens=True))

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """See :meth:`ChatTemplate.render`."""
        return self.template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)

    def encode_chat(self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        return self.encode(self.render(messages, tools=tools))


def reads_tools(environment: Any, template: str) -> bool:
    """Whether the chat ``template`` (parsed by the jinja2 ``environment``) reads a ``tools`` variable."""
    from jinja2 import meta

    return "tools" in meta.find_undeclared_variables(environment.parse(template))


def tool_variables(tools: list[dict[str, Any]] | None, *, supported: bool) -> dict[str, Any]:
    """The template variables for the offered ``tools``; offering them to a template that does not read
    them is an :class:`~omnitrio.contract.InvalidRequest` naming ``tools``."""
    if not tools:
        return {}
    if not supported:
        raise InvalidRequest(
            "tools: this model's chat template has no place for tools, so it cannot call them", param="tools"
        )
    return {"tools": tools}


def chat_tokenizer(model: GGUFModel) -> ChatTokenizer:
    """The tokenizer of ``model``'s metadata; a :class:`~schedulers.ar.gguf_file.GGUFError` names what is missing."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    kind = model.field("tokenizer.ggml.model")
    if kind != "gpt2":
        raise model.fail(f"tokenizer.ggml.model is {kind!r}; only byte-level BPE ('gpt2') is supported")
    tokens: list[str] = model.field("tokenizer.ggml.tokens")
    merges: list[str] = model.field("tokenizer.ggml.merges")
    types = list(model.field("tokenizer.ggml.token_type", [1] * len(tokens)))
    vocab = {token: index for index, token in enumerate(tokens)}
    try:
        pairs = [(left, right) for left, right in (merge.split(" ", 1) for merge in merges)]
        inner = HFTokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
    except Exception as exc:
        raise model.fail(f"tokenizer.ggml.tokens/merges do not form a BPE vocabulary: {exc}") from exc
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if model.field("tokenizer.ggml.pre", "default") in _DIGITS_FIRST:
        digits = pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated")
        inner.pre_tokenizer = pre_tokenizers.Sequence([digits, byte_level])
    else:
        inner.pre_tokenizer = byte_level
    inner.decoder = decoders.ByteLevel()
    inner.add_special_tokens(
        [
            AddedToken(token, special=True, normalized=False)
            for token, kind in zip(tokens, types, strict=True)
            if kind == _CONTROL
        ]
    )
    eos = int(model.field("tokenizer.ggml.eos_token_id"))
    bos = int(model.field("tokenizer.ggml.bos_token_id", eos))
    template = model.field("tokenizer.chat_template")
    if not isinstance(template, str):
        raise model.fail("tokenizer.chat_template is not a string")
    return ChatTokenizer(inner, template, eos, tokens[bos], tokens[eos])
