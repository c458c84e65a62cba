"""What ``response.create`` may ask of one response, checked; an error names its ``response.*`` param.

OpenAI's GA response parameters, all optional:

* ``instructions``, ``output_modalities``, ``max_output_tokens`` and ``audio.output`` (``voice``,
  ``format``): for this response only, checked as :func:`updated_session` checks the session's;
* ``conversation``: ``"auto"`` (the default: the answer becomes an item of the session's
  conversation) or ``"none"`` (out of band: the answer's item is in ``response.output_item.*`` and
  ``response.done`` only; it is never added to the conversation, no ``conversation.item.*`` event
  is sent for it, and ``conversation_id`` is null);
* ``input``: items (as ``conversation.item.create`` takes them) and references to items of the
  conversation (``{"type": "item_reference", "id"}``), in order: they replace the conversation as
  what the responder is given (``[]``: nothing but the instructions). Items given here are not added
  to the conversation;
* ``metadata``: null or up to 16 string pairs (keys up to 64 characters, values up to 512), returned
  as given in ``response.created`` and ``response.done``.

Other fields (``tools``, ``tool_choice``, ...) are accepted and not used. A field sent as ``null``
is not given (LiveKit's ``generate_reply`` sends every optional field, most of them null).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omnitrio.serve.context import new_id
from omnitrio.serve.realtime.conversation import Conversation, Item, client_item
from omnitrio.serve.realtime.protocol import EventError
from omnitrio.serve.realtime.response import Response
from omnitrio.serve.realtime.session_config import updated_session

SESSION_FIELDS = frozenset(
    {"instructions", "output_modalities", "max_output_tokens", "audio"}
    | {"modalities", "max_response_output_tokens", "voice"}  # the beta spellings
)
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


def requested_response(session: Mapping[str, Any], raw: Any, conversation: Conversation, lead: float) -> Response:
    """The response ``response.create`` asks for (``raw``: its ``response``, or None), not started."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise EventError("response.create's 'response' must be an object", "response")
    raw = {key: value for key, value in raw.items() if value is not None}
    chosen = {key: value for key, value in raw.items() if key in SESSION_FIELDS}
    try:
        own = updated_session(session, chosen) if chosen else dict(session)
    except EventError as error:
        param = error.param.replace("session.", "response.", 1) if error.param else None
        raise EventError(error.message.replace("session.", "response.", 1), param, error.code) from None
    match raw.get("conversation", "auto"):
        case "auto":
            in_conversation = True
        case "none":
            in_conversation = False
        case other:
            raise EventError(f"response.conversation must be 'auto' or 'none', got {other!r}", "response.conversation")
    context = None if raw.get("input") is None else _context(raw["input"], conversation)
    metadata = _metadata(raw.get("metadata"))
    return Response(own, None, lead, in_conversation=in_conversation, context=context, metadata=metadata)


def _context(raw: Any, conversation: Conversation) -> list[Item]:
    if not isinstance(raw, list):
        raise EventError("response.input must be a list of items and item references", "response.input")
    items = []
    for index, entry in enumerate(raw):
        param = f"response.input[{index}]"
        match entry:
            case {"type": "item_reference"}:
                items.append(conversation.get(entry.get("id"), f"{param}.id"))
            case _:
                try:
                    item = client_item(entry, new_id("item"))
                except EventError as error:
                    where = error.param or "item"
                    renamed = param + where.removeprefix("item") if where.startswith("item") else where
                    raise EventError(error.message.replace("item.", f"{param}.", 1), renamed, error.code) from None
                item.announced.set()  # never announced to the client: it is in no conversation
                items.append(item)
    return items


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if (
        isinstance(value, Mapping)
        and len(value) <= MAX_METADATA_PAIRS
        and all(
            isinstance(key, str)
            and len(key) <= MAX_METADATA_KEY
            and isinstance(text, str)
            and len(text) <= MAX_METADATA_VALUE
            for key, text in value.items()
        )
    ):
        return dict(value)
    raise EventError(
        f"response.metadata must be null or an object of at most {MAX_METADATA_PAIRS} string pairs"
        f" (keys up to {MAX_METADATA_KEY} characters, values up to {MAX_METADATA_VALUE})",
        "response.metadata",
    )
