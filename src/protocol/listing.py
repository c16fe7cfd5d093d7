"""Cursor lists as OpenAI pages them (``limit``, ``order``, ``after``), for every list route.

Invariants:
- Query values come as each key to all its values (``request.args.to_dict(flat=False)``); a key
  given twice is a 400, as are a ``limit`` outside its range, an unknown ``order`` and an empty
  ``after``; unknown keys are ignored.
- ``page`` returns the items after the item ``after`` in ``order``, at most ``limit`` of them,
  and whether more follow; ``None`` when ``after`` is not one of the items (the route decides the
  error), so paging never skips or repeats an item.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from .errors import invalid_request

T = TypeVar("T")
Order = Literal["asc", "desc"]


@dataclass(frozen=True, slots=True)
class ListQuery:
    limit: int
    order: Order
    after: str | None


def single(args: Mapping[str, Sequence[str]], key: str) -> str | None:
    """The one value of ``key``; a key given twice is a 400."""
    values = args.get(key, ())
    if len(values) > 1:
        raise invalid_request(f"Invalid '{key}': given {len(values)} times.", key)
    return values[0] if values else None


def parse_list_query(
    args: Mapping[str, Sequence[str]], *, default_limit: int = 20, max_limit: int = 100
) -> ListQuery:
    """``?limit=&order=&after=``; ``order`` defaults to ``desc``, as OpenAI's lists do."""
    limit = default_limit
    if (raw_limit := single(args, "limit")) is not None:
        if (
            not (raw_limit.isascii() and raw_limit.isdigit())
            or not 1 <= int(raw_limit) <= max_limit
        ):
            raise invalid_request(
                f"Invalid value for 'limit': {raw_limit!r}; expected an integer from 1 to "
                f"{max_limit}.",
                "limit",
            )
        limit = int(raw_limit)
    order: Order = "desc"
    if (raw_order := single(args, "order")) is not None:
        if raw_order not in ("asc", "desc"):
            raise invalid_request(
                f"Invalid value for 'order': {raw_order!r}; supported values are 'asc', 'desc'.",
                "order",
            )
        order = "asc" if raw_order == "asc" else "desc"
    after = single(args, "after")
    if after == "":
        raise invalid_request("Invalid value for 'after': must not be empty.", "after")
    return ListQuery(limit, order, after)


def page(
    items: Sequence[T], query: ListQuery, item_id: Callable[[T], object]
) -> tuple[list[T], bool] | None:
    """(the page, has_more) of ``items`` (oldest first) per ``query``; None if ``after`` is
    unknown."""
    ordered = list(items) if query.order == "asc" else list(reversed(items))
    start = 0
    if query.after is not None:
        ids = [item_id(item) for item in ordered]
        if query.after not in ids:
            return None
        start = ids.index(query.after) + 1
    return ordered[start : start + query.limit], start + query.limit < len(ordered)


def list_envelope(data: Sequence[Mapping[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's list envelope over JSON objects that carry an ``id``. An empty page has
    ``first_id``/``last_id`` ``""``: the SDK types them as strings (``ResponseItemList``,
    ``ConversationItemList``), and its cursor pages stop at a falsy ``last_id``."""
    return {
        "object": "list",
        "data": list(data),
        "first_id": data[0]["id"] if data else "",
        "last_id": data[-1]["id"] if data else "",
        "has_more": has_more,
    }
