"""The storage interface the store actors use, and the records they keep.

Invariants:
- A backend is used by exactly one actor task, so it needs no locking.
- Records are immutable values; ``copy()`` returns an independent deep copy of their JSON, and
  ``to_json()`` / ``from_json()`` convert them to and from one plain JSON object (the form a
  backend may serialise; ``from_json(r.to_json())`` equals ``r`` up to lists for tuples inside).
- ``get`` returns a record that no one else holds (decoded afresh or deep-copied), so a caller
  may mutate what it gets without changing what is stored; ``put`` takes its own copy likewise.
- Limits follow the storage flags (docs/stores.md): ``max_entries`` 0 disables persistence,
  ``max_bytes`` 0 keeps the route but evicts at once, ``ttl_seconds`` 0 disables expiry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

# The records are pure values (``protocol.records``: the protocol layer renders them); the
# store actors and backends keep finding them here.
from ..protocol.records import (
    ConversationRecord,
    JsonObject,
    StoredFile,
    StoredResponse,
    scoped,
)

__all__ = [
    "ConversationEdit",
    "ConversationRecord",
    "ConversationStorage",
    "EchoStorage",
    "JsonObject",
    "ResponseStorage",
    "StoreLimits",
    "StoreStatistics",
    "StoredFile",
    "StoredResponse",
    "change_in_place",
    "scoped",
]


@dataclass(frozen=True, slots=True)
class StoreLimits:
    max_entries: int
    max_bytes: int
    ttl_seconds: float


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    entries: int = 0
    bytes: int = 0
    evictions: int = 0
    expirations: int = 0
    # Entries refused at put: larger than the byte budget, or the store keeps nothing.
    rejections: int = 0


class ResponseStorage(Protocol):
    """A response backend. ``put`` returns once the record is kept (durable, for a durable
    backend) or refused by the budget; it also ends the job row of the same key, if any.
    ``job_started`` keeps a stored background job's queued object until then (a no-op in
    memory, where a restart forgets everything anyway); ``close`` releases what it holds."""

    def put(self, record: StoredResponse) -> None: ...
    def get(self, response_id: str) -> StoredResponse | None: ...
    def delete(self, response_id: str) -> bool: ...
    def job_started(self, record: StoredResponse) -> None: ...
    def statistics(self) -> StoreStatistics: ...
    def close(self) -> None: ...


ConversationEdit = Callable[[ConversationRecord], ConversationRecord | None]


class ConversationStorage(Protocol):
    def put(self, record: ConversationRecord) -> None: ...
    def get(self, conversation_id: str) -> ConversationRecord | None: ...
    def change(self, conversation_id: str, edit: ConversationEdit) -> ConversationRecord | None: ...
    def delete(self, conversation_id: str) -> bool: ...
    def statistics(self) -> StoreStatistics: ...
    def close(self) -> None: ...


def change_in_place(
    storage: ConversationStorage, conversation_id: str, edit: ConversationEdit
) -> ConversationRecord | None:
    """``change`` for a backend only this process writes (memory, SQLite behind its lock
    file): read, edit, write. ``edit`` returning None writes nothing; the written record."""
    current = storage.get(conversation_id)
    changed = None if current is None else edit(current)
    if changed is not None:
        storage.put(changed)
    return changed


class EchoStorage(Protocol):
    """The reasoning echo's memory: reply key -> reasoning text, least recently used
    evicted first under a byte budget. ``recall`` answers only the keys it holds and refreshes
    them."""

    def remember(self, key: str, reasoning: str) -> None: ...
    def recall(self, keys: tuple[str, ...]) -> dict[str, str]: ...
    def statistics(self) -> StoreStatistics: ...
    def close(self) -> None: ...
