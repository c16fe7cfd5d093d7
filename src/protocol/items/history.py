"""Conversation history as items: what a response stores as its input, and how it is replayed.

Invariants:
- ``input_items`` gives every input item an id (``msg_``, ``fc_``, ``rs_``...) once (a hosted
  tool's item keeps its own); the same ids appear in ``GET /v1/responses/{id}/input_items``
  and in the history a chained response replays.
- ``resolve`` reads a request's turn once: its input with ids; the history and input as the
  items that render (the history's items in any of the shapes we store or return: input,
  output and conversation items, skipping types we do not read, so replaying a previous
  ``output`` gives the items the turn produced; the input as parsed at the edge:
  ``read_item(item_json(x)) == x``; a hosted tool's listing and approvals are kept though they
  render nothing, for the preparation that pairs an approval with its request); and the tools
  its history loaded: a ``tool_search_output`` in the history (a chain, a conversation) loads
  its deferred tools as one in ``input`` does at the edge.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..tools.offered import FunctionTool, offered_tools
from ..tools.search import discoverable
from .read import InputItem, JsonObject, read_item
from .write import item_json

if TYPE_CHECKING:
    from ..request import CreateRequest


def input_items(items: Iterable[InputItem]) -> tuple[JsonObject, ...]:
    return tuple(item_json(item) for item in items)


def items_from_json(items: Sequence[JsonObject]) -> list[InputItem]:
    """The input items a sequence of stored items renders as (what ``resolve`` reads a history
    as; the scripts that render captured requests read them so too)."""
    return [parsed for item in items if (parsed := read_item(item)) is not None]


@dataclass(frozen=True, slots=True)
class Turn:
    """A request read against its history: what it stores, what renders, what it offers."""

    new_items: tuple[JsonObject, ...]  # its input, ids assigned
    items: tuple[InputItem, ...]  # the history's items, then its input: what renders
    tools: tuple[FunctionTool, ...] | None  # loaded by the history; None: the request's own


def resolve(request: CreateRequest, history: tuple[JsonObject, ...]) -> Turn:
    """``request``'s turn over ``history`` (stored items), each item parsed once."""
    new_items = tuple(item_json(item) for item in request.input)
    replayed = items_from_json(history)
    items = (*replayed, *request.input)
    if not request.declared_tools or not history:
        return Turn(new_items, items, None)
    tools = offered_tools(discoverable(request.declared_tools, items), request.tool_choice)
    return Turn(new_items, items, None if tools == request.tools else tools)
