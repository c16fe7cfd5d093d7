"""The store actor's conversations (``Store.conversations``): the only owner of conversations
and their items.

Invariants:
- Conversations live in the store actor (``store.py``), inside a ``ConversationStorage``
  backend; others ask by message through ``ConversationStoreHandle``. JSON is deep-copied on the way in (by the handle)
  and the backend hands out records no one else holds (the storage interface's rule).
- Budgets are the backend's: a conversation is one entry; LRU eviction
  until the entry and byte limits hold, TTL from the last write (create, update, append, item
  delete), a conversation over the byte budget not kept. Every request refreshes recency; an
  evicted or expired conversation reads as absent (None).
- Items arrive with their ids already assigned (``msg_``, ``fc_``, ...); the actor keeps their
  order of arrival. ``append`` is atomic: all the items of one turn or none.
- A turn is appended only when a response finishes with output (the response actor's job), so
  a refused or failed request appends nothing.
- ``enabled`` is false when transcripts are disabled (``--conversation-store-max-entries 0``).
- A backend error is raised in the asking task; the actor answers every request exactly once
  and keeps running. ``statistics()`` is the backend's, as of the newest reply.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import assert_never

import trio

from ..protocol.ids import new_id
from ..storage.interface import (
    ConversationRecord,
    ConversationStorage,
    JsonObject,
    StoreLimits,
    scoped,
)
from .kit import Reply
from .store_part import StoreAnswer, StorePart


@dataclass(frozen=True, slots=True)
class CreateConversation:
    """Sender: the HTTP layer. Replies with the new record."""

    metadata: Mapping[str, str]
    items: tuple[JsonObject, ...]
    reply: Reply[StoreAnswer[ConversationRecord]]
    owner: str = ""


@dataclass(frozen=True, slots=True)
class GetConversation:
    """Sender: the HTTP layer and response actors (history). Refreshes recency."""

    conversation_id: str
    reply: Reply[StoreAnswer[ConversationRecord | None]]


@dataclass(frozen=True, slots=True)
class UpdateConversation:
    """Sender: the HTTP layer. Replaces the metadata; None if the conversation is unknown."""

    conversation_id: str
    metadata: Mapping[str, str]
    reply: Reply[StoreAnswer[ConversationRecord | None]]


@dataclass(frozen=True, slots=True)
class DeleteConversation:
    conversation_id: str
    reply: Reply[StoreAnswer[bool]]


@dataclass(frozen=True, slots=True)
class AppendItems:
    """Sender: the HTTP layer (create items) and response actors (a finished turn)."""

    conversation_id: str
    items: tuple[JsonObject, ...]
    reply: Reply[StoreAnswer[ConversationRecord | None]]


@dataclass(frozen=True, slots=True)
class DeleteItem:
    conversation_id: str
    item_id: str
    reply: Reply[StoreAnswer[ConversationRecord | None]]


ConversationMessage = (
    CreateConversation
    | GetConversation
    | UpdateConversation
    | DeleteConversation
    | AppendItems
    | DeleteItem
)


class ConversationStoreHandle(StorePart[ConversationMessage]):
    """The store actor's handle for conversations (``Store.conversations``)."""

    def __init__(
        self, mailbox: trio.MemorySendChannel[ConversationMessage], limits: StoreLimits
    ) -> None:
        super().__init__(mailbox)
        self.limits = limits

    @property
    def enabled(self) -> bool:
        return self.limits.max_entries > 0

    # Every method takes the tenant (``owner``): ids are scoped to it, so another
    # tenant's conversation is simply absent.

    async def create(
        self, metadata: Mapping[str, str], items: Sequence[JsonObject] = (), owner: str = ""
    ) -> ConversationRecord:
        frozen = ConversationRecord("", 0, dict(metadata), tuple(items)).copy()
        return await self._ask(
            lambda reply: CreateConversation(frozen.metadata, frozen.items, reply, owner),
        )

    async def get(self, conversation_id: str, owner: str = "") -> ConversationRecord | None:
        key = scoped(owner, conversation_id)
        return await self._ask(lambda reply: GetConversation(key, reply))

    async def update(
        self, conversation_id: str, metadata: Mapping[str, str], owner: str = ""
    ) -> ConversationRecord | None:
        meta, key = dict(metadata), scoped(owner, conversation_id)
        return await self._ask(lambda reply: UpdateConversation(key, meta, reply))

    async def delete(self, conversation_id: str, owner: str = "") -> bool:
        key = scoped(owner, conversation_id)
        return await self._ask(lambda reply: DeleteConversation(key, reply))

    async def append(
        self, conversation_id: str, items: Sequence[JsonObject], owner: str = ""
    ) -> ConversationRecord | None:
        frozen = ConversationRecord("", 0, {}, tuple(items)).copy().items
        key = scoped(owner, conversation_id)
        return await self._ask(lambda reply: AppendItems(key, frozen, reply))

    async def delete_item(
        self, conversation_id: str, item_id: str, owner: str = ""
    ) -> ConversationRecord | None:
        key = scoped(owner, conversation_id)
        return await self._ask(lambda reply: DeleteItem(key, item_id, reply))


def answer(backend: ConversationStorage, message: ConversationMessage) -> object:
    """Apply one request to the backend; the reply's value."""
    match message:
        case CreateConversation(metadata, items, _, owner):
            record = ConversationRecord(
                new_id("conv"), int(time.time()), dict(metadata), items, owner
            )
            backend.put(record)
            return record
        case GetConversation(conversation_id, _):
            return backend.get(conversation_id)
        case UpdateConversation(conversation_id, metadata, _):
            return backend.change(conversation_id, lambda c: replace(c, metadata=dict(metadata)))
        case DeleteConversation(conversation_id, _):
            return backend.delete(conversation_id)
        case AppendItems(conversation_id, items, _):
            return backend.change(conversation_id, lambda c: replace(c, items=c.items + items))
        case DeleteItem(conversation_id, item_id, _):

            def without_item(current: ConversationRecord) -> ConversationRecord | None:
                kept = tuple(i for i in current.items if i.get("id") != item_id)
                return None if len(kept) == len(current.items) else replace(current, items=kept)

            return backend.change(conversation_id, without_item)
        case _:
            assert_never(message)
