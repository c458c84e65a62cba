"""Function calling in a realtime session, as OpenAI's Realtime protocol defines it.

The session's ``tools`` (``[{"type": "function", "name", "description", "parameters"}]``) and
``tool_choice`` (``"auto"``, ``"none"``, ``"required"`` or ``{"type": "function", "name"}``) go to
the responder in the chat shape (:func:`chat_tools`: ``{"type": "function", "function": {...}}``),
and only when the session has tools, so a responder that cannot call tools is asked nothing new.

A responder's answer carries its tool calls in its result (``tool_calls``, OpenAI's chat shape;
they are not streamed). For each, in order, a completed response sends (:func:`send_function_calls`)::

    response.output_item.added (a function_call item, in_progress) → conversation.item.added →
    response.function_call_arguments.delta (all the arguments) → response.function_call_arguments.done
    → response.output_item.done (completed) → conversation.item.done

and the items are in ``response.done``'s ``output`` after the message item, if there is one. The
client runs the function, adds a ``function_call_output`` item with the same ``call_id``
(``conversation.item.create``) and sends ``response.create``: the responder then sees the call (an
assistant message with ``tool_calls``) and its output (a ``tool`` message with ``tool_call_id``);
see :func:`~.conversation.messages_of`. An out-of-band response's calls are in its
``response.done`` only, never in the conversation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from omnitrio.serve.context import new_id
from omnitrio.serve.realtime.conversation import Conversation, Item


class _Host(Protocol):
    conversation: Conversation

    async def emit(self, event: dict[str, Any]) -> None: ...


class _Answer(Protocol):
    id: str
    in_conversation: bool


def chat_tools(session: Mapping[str, Any]) -> dict[str, Any]:
    """The responder's ``tools`` and ``tool_choice`` inputs for ``session`` (nothing without tools)."""
    tools = [
        {
            "type": "function",
            "function": {key: tool[key] for key in ("name", "description", "parameters") if key in tool},
        }
        for tool in session.get("tools") or ()
        if isinstance(tool, Mapping)
        and tool.get("type", "function") == "function"
        and isinstance(tool.get("name"), str)
    ]
    if not tools:
        return {}
    choice = session.get("tool_choice", "auto")
    if isinstance(choice, Mapping) and isinstance(choice.get("name"), str):
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return {"tools": tools, "tool_choice": choice}


def function_call_item(call: Mapping[str, Any]) -> Item:
    """The ``function_call`` item of one chat tool call, in progress, its arguments not yet given."""
    function = call.get("function") or {}
    body = {
        "id": new_id("item"),
        "object": "realtime.item",
        "type": "function_call",
        "status": "in_progress",
        "call_id": str(call.get("id") or new_id("call")),
        "name": str(function.get("name", "")),
        "arguments": "",
    }
    item = Item(body)
    item.transcribed.set()
    return item


async def send_function_calls(
    host: _Host, response: _Answer, calls: list[dict[str, Any]], *, first_index: int
) -> list[Item]:
    """Tell the client of each tool call of ``response`` (see the module docstring); returns their items."""
    items = []
    for index, call in enumerate(calls, start=first_index):
        item = function_call_item(call)
        arguments = str((call.get("function") or {}).get("arguments") or "")
        previous = host.conversation.insert(item) if response.in_conversation else None
        where = {"response_id": response.id, "output_index": index}
        await host.emit({"type": "response.output_item.added", **where, "item": item.public()})
        if response.in_conversation:
            await host.emit({"type": "conversation.item.added", "previous_item_id": previous, "item": item.public()})
        item.announced.set()
        ids = {**where, "item_id": item.id, "call_id": item.body["call_id"]}
        await host.emit({"type": "response.function_call_arguments.delta", **ids, "delta": arguments})
        done = {"type": "response.function_call_arguments.done", **ids, "name": item.body["name"]}
        await host.emit({**done, "arguments": arguments})
        item.body.update(arguments=arguments, status="completed")
        await host.emit({"type": "response.output_item.done", **where, "item": item.public()})
        if response.in_conversation:
            await host.emit({"type": "conversation.item.done", "previous_item_id": previous, "item": item.public()})
        items.append(item)
    return items
