"""How a model writes a tool call, read from its chat template: where a call starts in an answer, and the calls.

:func:`tool_format_of` names the format a ``tokenizer.chat_template`` teaches (by the markers its
text contains), or None for one this module does not read:

* :data:`HERMES` (Hermes, Qwen2.5, Qwen3, SmolLM3): ``<tool_call>\\n{"name": ..., "arguments": {...}}
  \\n</tool_call>``, one block per call (a last block missing its closing tag is read too);
* :data:`LLAMA3` (Llama 3.1 / 3.2): a JSON object ``{"name": ..., "parameters": {...}}`` as the whole
  answer, or after ``<|python_tag|>`` (several separated by ``;``);
* :data:`MISTRAL`: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``.

What a caller may rely on, for an answer's text written so far (``markers`` are control tokens that
must be kept in that text: a model's tokenizer may drop them from an answer):

* :meth:`ToolCallFormat.call_start` is where a call begins, or None; the text before it is the
  answer's words, and it never changes once a call began;
* :meth:`ToolCallFormat.streamable` of text without a call is how much of it can be shown now: text
  that may still become a call's first marker (``"<tool_"``) and an answer that is only white space
  so far (a call may follow) are held;
* :meth:`ToolCallFormat.parse` of the text from :meth:`~ToolCallFormat.call_start` on is the calls in
  OpenAI's chat shape (``{"id": "call_<random>", "type": "function", "function": {"name",
  "arguments": JSON text}}``), or None when it is not a well-formed call (the model wrote text).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from typing import Any, Final

import attrs

_DECODER: Final = json.JSONDecoder(strict=False)  # a string may hold a raw newline


def _call(name: Any, arguments: Any) -> dict[str, Any] | None:
    """One call in OpenAI's shape, or None when ``name`` is no name or ``arguments`` no JSON object."""
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = _DECODER.decode(arguments)
        except ValueError:
            return None
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    text = json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{secrets.token_hex(12)}", "type": "function", "function": {"name": name, "arguments": text}}


def _objects(text: str, separators: str) -> list[Any] | None:
    """The JSON values ``text`` holds one after another (``separators`` and white space between), or None."""
    values: list[Any] = []
    at = 0
    while True:
        while at < len(text) and (text[at].isspace() or text[at] in separators):
            at += 1
        if at == len(text):
            return values or None
        try:
            value, at = _DECODER.raw_decode(text, at)
        except ValueError:
            return None
        values.append(value)


def _calls(objects: Any, arguments_key: str) -> list[dict[str, Any]] | None:
    if not isinstance(objects, list) or not objects or not all(isinstance(o, dict) for o in objects):
        return None
    calls = [_call(o.get("name"), o.get(arguments_key, o.get("arguments"))) for o in objects]
    return [call for call in calls if call is not None] if None not in calls else None


def _hermes(text: str) -> list[dict[str, Any]] | None:
    blocks = re.findall(r"<tool_call>(.*?)(?:</tool_call>|$)", text, flags=re.DOTALL)
    if re.sub(r"<tool_call>.*?(?:</tool_call>|$)", "", text, flags=re.DOTALL).strip():
        return None  # text between or after the calls: not a call the format knows
    objects = [_objects(block, "") for block in blocks]
    if any(o is None or len(o) != 1 for o in objects):
        return None
    return _calls([o[0] for o in objects if o], "arguments")


def _llama3(text: str) -> list[dict[str, Any]] | None:
    return _calls(_objects(text.removeprefix("<|python_tag|>"), ";"), "parameters")


def _mistral(text: str) -> list[dict[str, Any]] | None:
    found = _objects(text.removeprefix("[TOOL_CALLS]"), "")
    return _calls(found[0], "arguments") if found is not None and len(found) == 1 else None


@attrs.frozen
class ToolCallFormat:
    """One model family's way of writing calls (see the module docstring)."""

    name: str
    opening: str  # the marker a call starts with
    markers: frozenset[str]  # control tokens that are kept in the answer's text
    arguments_key: str  # the key the call's JSON gives its arguments under
    forced_prefix: str  # what a call the grammar forces starts with, then its JSON object ...
    forced_suffix: str  # ... then this
    bare_json: bool  # a call may also be a JSON object alone, without ``opening``
    _parse: Callable[[str], list[dict[str, Any]] | None] = attrs.field(repr=False)

    def call_start(self, text: str) -> int | None:
        """Where the first call in ``text`` begins, or None (see the module docstring)."""
        at = text.find(self.opening)
        if at >= 0:
            return at
        if self.bare_json and text.lstrip().startswith("{"):
            return len(text) - len(text.lstrip())
        return None

    def streamable(self, text: str) -> int:
        """How much of ``text`` (which holds no call yet) may be shown: not what may still become one."""
        end = len(text)
        for size in range(min(len(self.opening) - 1, len(text)), 0, -1):
            if self.opening.startswith(text[-size:]):
                end -= size
                break
        return end if text[:end].strip() else 0

    def parse(self, text: str) -> list[dict[str, Any]] | None:
        """The calls ``text`` (from :meth:`call_start` on) makes, or None when it is not a call."""
        return self._parse(text.strip())


HERMES: Final = ToolCallFormat(
    "hermes", "<tool_call>", frozenset({"<tool_call>", "</tool_call>"}), "arguments",
    "<tool_call>\n", "\n</tool_call>", False, _hermes,
)  # fmt: skip
LLAMA3: Final = ToolCallFormat(
    "llama3", "<|python_tag|>", frozenset({"<|python_tag|>"}), "parameters", "", "", True, _llama3
)
MISTRAL: Final = ToolCallFormat(
    "mistral", "[TOOL_CALLS]", frozenset({"[TOOL_CALLS]"}), "arguments", "[TOOL_CALLS][", "]", False, _mistral
)


def tool_format_of(template: str) -> ToolCallFormat | None:
    """The call format ``template`` (a chat template's text) teaches its model, or None when unknown."""
    if "<tool_call>" in template:
        return HERMES
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<|python_tag|>" in template or ('"parameters"' in template and "<|start_header_id|>" in template):
        return LLAMA3
    return None
