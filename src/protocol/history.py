"""Conversation history as items: what a response stores as its input, and how it is replayed.

Invariants:
- ``input_items`` gives every input item an id (``msg_``, ``fc_``, ``rs_``...) once; the same
  ids appear in ``GET /v1/responses/{id}/input_items`` and in the history a chained response
  replays.
- ``items_from_json`` reads back items in any of the shapes we store or return (input items,
  output items, conversation items) and skips item types that do not render, so replaying a
  previous ``output`` gives the same items the turn produced.
- ``history_tools``: a ``tool_search_output`` in the history (a chain, a conversation) loads
  its deferred tools as one in ``input`` does at the edge.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .items import InputItem, JsonObject, item_json, read_item
from .tool_search import discoverable
from .tools import FunctionTool, offered_tools

if TYPE_CHECKING:
    from .request import CreateRequest


def input_items(items: Iterable[InputItem]) -> tuple[JsonObject, ...]:
    return tuple(item_json(item) for item in items)


def items_from_json(items: Sequence[JsonObject]) -> list[InputItem]:
    """The input items a sequence of stored items renders as."""
    return [parsed for item in items if (parsed := read_item(item)) is not None]


def history_tools(
    request: CreateRequest, history: tuple[JsonObject, ...]
) -> tuple[FunctionTool, ...] | None:
    """The tools offered when a ``tool_search_output`` of the history loaded deferred tools;
    None when that changes nothing (issue 13)."""
    if not request.declared_tools or not history:
        return None
    items = (*items_from_json(history), *request.input)
    tools = offered_tools(discoverable(request.declared_tools, items), request.tool_choice)
    return None if tools == request.tools else tools
