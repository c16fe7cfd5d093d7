"""Conversation history as items: what a response stores as its input, and how it is replayed.

Invariants:
- ``input_items`` gives every input message an id (``msg_...``) once; the same ids appear in
  ``GET /v1/responses/{id}/input_items`` and in the history a chained response replays.
- ``messages_from_items`` reads back message items in any of the shapes we store or return
  (input items, output items, conversation items) and skips item types that do not render
  as chat messages, so replaying a previous ``output`` gives the same messages as the turn had.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, get_args

from .ids import new_id
from .request import InputMessage, Role

JsonObject = dict[str, Any]

_ROLES: frozenset[str] = frozenset(get_args(Role))


def message_item(message: InputMessage, item_id: str | None = None) -> JsonObject:
    """A stored input message item (the shape ``input_items`` lists)."""
    part_type = "output_text" if message.role == "assistant" else "input_text"
    part: JsonObject = {"type": part_type, "text": message.text}
    if part_type == "output_text":
        part["annotations"] = []
    return {
        "id": item_id or new_id("msg"),
        "type": "message",
        "role": message.role,
        "status": "completed",
        "content": [part],
    }


def input_items(messages: Iterable[InputMessage]) -> tuple[JsonObject, ...]:
    return tuple(message_item(m) for m in messages)


def _text_of(content: object) -> str | None:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = []
    for part in content:
        if isinstance(part, dict):
            value = part.get("text", part.get("refusal"))
            if isinstance(value, str):
                texts.append(value)
    return "".join(texts)


def messages_from_items(items: Sequence[JsonObject]) -> list[InputMessage]:
    """The chat messages a sequence of stored items renders as."""
    messages: list[InputMessage] = []
    for item in items:
        if item.get("type", "message") != "message":
            continue
        role = item.get("role")
        text = _text_of(item.get("content"))
        if role in _ROLES and text is not None:
            messages.append(InputMessage(role, text))
    return messages
