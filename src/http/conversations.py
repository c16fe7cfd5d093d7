"""``/v1/conversations`` and ``/v1/conversations/{id}/items`` as OpenAI defines them.

Invariants:
- Thin: bodies are decoded strictly and validated by the pure
  ``protocol.conversation_items``; state is reached only through ``ConversationStoreHandle``.
- Images in items are taken as a response's are (``image_inputs.py``, on a vision model
  only), before the parser sees the body: a bad image is a 400 and nothing is kept.
- A refused request changes nothing: every body and query is fully validated before the first
  message that mutates the store, and ``append`` is atomic (all the items or none).
- With the conversation store disabled (``--conversation-store-max-entries 0``) every route
  here is a 400 saying so, before anything else is looked at.
- An unknown conversation, item or ``after`` cursor is a 404 whose message names the id.
- Every route is mounted with and without the ``/v1`` prefix.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

from quart import Response, request

from ..protocol.errors import ApiError, invalid_request, not_found
from ..protocol.items.conversation import (
    conversation_object,
    deleted_object,
    find_item,
    item_list,
    parse_create_body,
    parse_items_body,
    parse_update_body,
)
from ..protocol.listing import page, parse_list_query
from ..storage.interface import ConversationRecord
from .common import View, decode_json_body, json_response, mount, runtime, tenant
from .image_inputs import inline_image_inputs
from .include import check_includable
from .pipeline import image_sources

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..actors.conversation_store import ConversationStoreHandle

DISABLED_MESSAGE: Final = (
    "The conversation store is disabled on this server (--conversation-store-max-entries 0), "
    "so /v1/conversations is unavailable."
)


def check_include(args: Mapping[str, Sequence[str]]) -> None:
    """``include`` / ``include[]`` (the SDK's spelling) values must be OpenAI's."""
    for key in ("include", "include[]"):
        for value in args.get(key, ()):
            check_includable(value, "include")


def conversation_not_found(conversation_id: str) -> ApiError:
    return not_found(
        f"Conversation with id '{conversation_id}' not found.", param="conversation_id"
    )


def item_not_found(conversation_id: str, item_id: str, param: str = "item_id") -> ApiError:
    return not_found(
        f"Item with id '{item_id}' not found in conversation '{conversation_id}'.", param=param
    )


def _store() -> ConversationStoreHandle:
    return runtime().conversations


def _guarded(view: View) -> View:
    """A conversations view that answers 400 while the conversation store is disabled."""

    @functools.wraps(view)
    async def guarded(**kwargs: str) -> Response:
        if not _store().enabled:
            raise invalid_request(DISABLED_MESSAGE, None)
        return await view(**kwargs)

    return guarded


async def body(*, empty_is_object: bool = False) -> object:
    raw = await request.get_data(cache=False, as_text=False)
    if empty_is_object and not raw.strip():
        return {}
    return decode_json_body(raw)


def query() -> dict[str, list[str]]:
    return request.args.to_dict(flat=False)


async def existing(conversation_id: str) -> ConversationRecord:
    record = await _store().get(conversation_id, tenant())
    if record is None:
        raise conversation_not_found(conversation_id)
    return record


async def create_conversation() -> Response:
    # Images are read and checked as a response's are (docs/vision.md), before anything is kept.
    raw = await inline_image_inputs(await body(empty_is_object=True), image_sources(), "items")
    parsed = parse_create_body(raw)
    return json_response(
        conversation_object(await _store().create(parsed.metadata, parsed.items, tenant()))
    )


async def get_conversation(conversation_id: str) -> Response:
    return json_response(conversation_object(await existing(conversation_id)))


async def update_conversation(conversation_id: str) -> Response:
    metadata = parse_update_body(await body())
    record = await _store().update(conversation_id, metadata, tenant())
    if record is None:
        raise conversation_not_found(conversation_id)
    return json_response(conversation_object(record))


async def delete_conversation(conversation_id: str) -> Response:
    if not await _store().delete(conversation_id, tenant()):
        raise conversation_not_found(conversation_id)
    return json_response(deleted_object(conversation_id))


async def list_conversation_items(conversation_id: str) -> Response:
    args = query()
    wanted = parse_list_query(args)
    check_include(args)
    record = await existing(conversation_id)
    found = page(record.items, wanted, lambda item: item.get("id"))
    if found is None:
        raise item_not_found(conversation_id, wanted.after or "", param="after")
    return json_response(item_list(found[0], has_more=found[1]))


async def create_conversation_items(conversation_id: str) -> Response:
    check_include(query())
    raw = await inline_image_inputs(await body(), image_sources(), "items")
    items = parse_items_body(raw)
    if await _store().append(conversation_id, items, tenant()) is None:
        raise conversation_not_found(conversation_id)
    return json_response(item_list(items, has_more=False))


async def get_conversation_item(conversation_id: str, item_id: str) -> Response:
    check_include(query())
    item = find_item(await existing(conversation_id), item_id)
    if item is None:
        raise item_not_found(conversation_id, item_id)
    return json_response(item)


async def delete_conversation_item(conversation_id: str, item_id: str) -> Response:
    record = await _store().delete_item(conversation_id, item_id, tenant())
    if record is None:
        await existing(conversation_id)  # 404 naming the conversation if it is unknown
        raise item_not_found(conversation_id, item_id)
    return json_response(conversation_object(record))


def register_conversation_routes(app: QuartTrio) -> None:
    """Mount the conversations routes on ``app``; the conversation store is their only state."""
    mount(app, "/conversations", ["POST"])(_guarded(create_conversation))
    mount(app, "/conversations/<conversation_id>", ["GET"])(_guarded(get_conversation))
    mount(app, "/conversations/<conversation_id>", ["POST"])(_guarded(update_conversation))
    mount(app, "/conversations/<conversation_id>", ["DELETE"])(_guarded(delete_conversation))
    mount(app, "/conversations/<conversation_id>/items", ["GET"])(_guarded(list_conversation_items))
    mount(app, "/conversations/<conversation_id>/items", ["POST"])(
        _guarded(create_conversation_items)
    )
    mount(app, "/conversations/<conversation_id>/items/<item_id>", ["GET"])(
        _guarded(get_conversation_item)
    )
    mount(app, "/conversations/<conversation_id>/items/<item_id>", ["DELETE"])(
        _guarded(delete_conversation_item)
    )
