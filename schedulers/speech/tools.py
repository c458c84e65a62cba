"""Tools (functions) a conversation offers the model, and the calls it made, in OpenAI's chat shape.

What a responder may rely on after :func:`tools_of`, :func:`tool_choice_of` and :func:`tool_calls_of`:

* ``tools``: ``None`` (none offered) or a non-empty list of
  ``{"type": "function", "function": {"name": str, "description"?: str, "parameters"?: dict}}``
  (the realtime session's flat ``{"type": "function", "name", ...}`` is read as the same tool);
* ``tool_choice``: ``None`` (the server's default), ``"none"``, ``"auto"``, ``"required"`` or
  ``{"type": "function", "function": {"name": str}}`` naming one of ``tools``;
* an assistant message's ``tool_calls``: ``[{"id": str, "type": "function", "function": {"name": str,
  "arguments": str}}]``, and a tool message's ``tool_call_id``: str.

Anything else is an :class:`~omnitrio.contract.InvalidRequest` naming the field (a 400).
"""

from __future__ import annotations

from typing import Any, Final

from omnitrio.contract import InvalidRequest

CHOICES: Final = ("none", "auto", "required")


def _function(tool: Any, where: str) -> dict[str, Any]:
    match tool:
        case {"type": "function", "function": dict(function)}:
            pass
        case {"type": "function", "name": str()}:  # a realtime session's tool
            function = {key: tool[key] for key in ("name", "description", "parameters") if key in tool}
        case _:
            raise InvalidRequest(f"{where} must be {{'type': 'function', 'function': {{'name': ...}}}}", param=where)
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{where}.function.name must be a non-empty string", param=f"{where}.function.name")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise InvalidRequest(f"{where}.function.parameters must be a JSON schema object", param=f"{where}.function")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest(f"{where}.function.description must be a string", param=f"{where}.function")
    kept = {key: value for key, value in function.items() if value is not None}
    return {"type": "function", "function": kept}


def tools_of(raw: Any) -> list[dict[str, Any]] | None:
    """The offered tools in the chat shape; ``None`` and ``[]`` both mean none."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise InvalidRequest(f"tools must be a list of function tools, got {type(raw).__name__}", param="tools")
    tools = [_function(tool, f"tools[{i}]") for i, tool in enumerate(raw)]
    names = [tool["function"]["name"] for tool in tools]
    if len(set(names)) != len(names):
        raise InvalidRequest(f"tools: each function needs its own name, got {names}", param="tools")
    return tools or None


def tool_choice_of(raw: Any, tools: list[dict[str, Any]] | None) -> Any:
    """``raw`` checked against ``tools``; a named function must be one of them."""
    match raw:
        case None | "none" | "auto" | "required":
            return raw
        case {"type": "function", "function": {"name": str(name)}} | {"type": "function", "name": str(name)}:
            offered = [tool["function"]["name"] for tool in tools or []]
            if name not in offered:
                message = f"tool_choice names {name!r}, which is not in tools {offered}"
                raise InvalidRequest(message, param="tool_choice")
            return {"type": "function", "function": {"name": name}}
    raise InvalidRequest(
        f"tool_choice must be one of {list(CHOICES)} or {{'type': 'function', 'function': {{'name': ...}}}}, "
        f"got {raw!r}",
        param="tool_choice",
    )


def tool_calls_of(raw: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls``, each with a string id, name and arguments."""
    if not isinstance(raw, list):
        raise InvalidRequest(f"{where} must be a list of tool calls", param=where)
    calls = []
    for i, call in enumerate(raw):
        match call:
            case {"id": str(call_id), "function": {"name": str(name), "arguments": str(arguments)}}:
                calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
            case _:
                raise InvalidRequest(
                    f"{where}[{i}] must be {{'id': str, 'type': 'function', 'function': {{'name': str, "
                    "'arguments': str}}}}",
                    param=f"{where}[{i}]",
                )
    return calls
