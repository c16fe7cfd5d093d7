"""Conversation history as items: what a response stores as its input, and how it is replayed.

Invariants:
- ``input_items`` gives every input item an id (``msg_``, ``fc_``, ``rs_``...) once; the same
  ids appear in ``GET /v1/responses/{id}/input_items`` and in the history a chained response
  replays.
- ``items_from_json`` reads back items in any of the shapes we store or return (input items,
  output items, conversation items) and skips item types that do not render, so replaying a
  previous ``output`` gives the same items the turn produced.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .items import InputItem, JsonObject, item_json, read_item


def input_items(items: Iterable[InputItem]) -> tuple[JsonObject, ...]:
    return tuple(item_json(item) for item in items)


def items_from_json(items: Sequence[JsonObject]) -> list[InputItem]:
    """The input items a sequence of stored items renders as."""
    return [parsed for item in items if (parsed := read_item(item)) is not None]
