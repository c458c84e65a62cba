"""A llama.cpp grammar (GBNF) that forces an answer to be one call of an offered function.

For ``tool_choice="required"`` (any offered function) or a named function, :func:`forced_call_grammar`
returns GBNF whose ``root`` rule accepts exactly one call in the model's
:class:`~schedulers.llamacpp.tool_calls.ToolCallFormat`: its ``forced_prefix``, a JSON object
``{"name": <an offered name>, <arguments_key>: <arguments>}`` whose arguments match that function's
``parameters`` JSON schema (llama-cpp-python's schema → GBNF converter; no schema: any JSON object),
and its ``forced_suffix``.  Sampled under it (``llama_sampler_init_grammar``), even a small model
writes a call :meth:`~schedulers.llamacpp.tool_calls.ToolCallFormat.parse` reads, then its
end-of-turn token (the grammar allows nothing else once the call is complete).  A ``parameters``
schema the converter cannot read is an :class:`~omnitrio.contract.InvalidRequest` naming ``tools``.
"""

from __future__ import annotations

import json
from typing import Any

from omnitrio.contract import InvalidRequest
from schedulers.llamacpp.tool_calls import ToolCallFormat


def forced_function(tool_choice: Any) -> str | None:
    """The function a named ``tool_choice`` forces (``{"type": "function", "function": {"name"}}``), or None."""
    match tool_choice:
        case {"function": {"name": str(name)}}:
            return name
    return None


def forced_call_grammar(fmt: ToolCallFormat, tools: list[dict[str, Any]], name: str | None = None) -> str:
    """GBNF for one call of ``name`` (or of any of ``tools`` when None), as the module docstring says."""
    from llama_cpp.llama_grammar import SchemaConverter

    functions = [tool["function"] for tool in tools if name is None or tool["function"]["name"] == name]
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": function["name"]},
                fmt.arguments_key: function.get("parameters") or {"type": "object"},
            },
            "required": ["name", fmt.arguments_key],
        }
        for function in functions
    ]
    schema = calls[0] if len(calls) == 1 else {"oneOf": calls}
    converter = SchemaConverter(
        prop_order={"name": 0, fmt.arguments_key: 1}, allow_fetch=False, dotall=False, raw_pattern=False
    )
    try:
        rule = converter.visit(converter.resolve_refs(schema, "tools"), "call")
    except Exception as exc:
        raise InvalidRequest(f"tools: a function's parameters schema cannot be followed: {exc}", param="tools") from exc
    parts = [json.dumps(fmt.forced_prefix), rule, json.dumps(fmt.forced_suffix)]
    body = " ".join(part for part in parts if part != '""')
    return f"{converter.format_grammar()}\nroot ::= {body}\n"
