"""The storage interface the store actors use, and the records they keep.

Invariants:
- A backend is used by exactly one actor task, so it needs no locking.
- Records are immutable values; ``copy()`` returns an independent deep copy of their JSON, and
  ``to_json()`` / ``from_json()`` convert them to and from one plain JSON object (the form a
  backend may serialise; ``from_json(r.to_json())`` equals ``r`` up to lists for tuples inside).
- ``get`` returns a record that no one else holds (decoded afresh or deep-copied), so a caller
  may mutate what it gets without changing what is stored; ``put`` takes its own copy likewise.
- Limits follow spec 000's Storage Flags: ``max_entries`` 0 disables persistence,
  ``max_bytes`` 0 keeps the route but evicts at once, ``ttl_seconds`` 0 disables expiry.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..protocol.replay import compact_events, expand_events

JsonObject = dict[str, Any]


def scoped(owner: str, object_id: str) -> str:
    """The storage key of an object of tenant ``owner`` (decision 12): another tenant's key for
    the same id never matches, so its objects are simply absent (404), never forbidden."""
    return f"{owner}/{object_id}" if owner else object_id


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


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A finished response: its final object, the full input it was rendered from (the
    rehydrated chain included, each item with its id) and its SSE events for replay.

    The events are given literally when the record is made (``literal_events``, the third
    field) and read back through ``events``. The serialised form (``to_json``) keeps them as a
    compact replay tape (``protocol.replay``: the delta boundaries, a few bytes per delta) when
    the tape rebuilds them exactly, which is always the case for events made by the
    ``ResponseMachine``; a record read back from a store holds the tape (``replay``) and
    rebuilds the events, same types, ids and sequence numbers, when ``events`` is read.
    """

    response: JsonObject
    input_items: tuple[JsonObject, ...] = ()
    literal_events: tuple[JsonObject, ...] = ()
    owner: str = ""
    replay: JsonObject | None = None

    @property
    def id(self) -> str:
        return str(self.response["id"])

    @property
    def key(self) -> str:
        return scoped(self.owner, self.id)

    @property
    def events(self) -> tuple[JsonObject, ...]:
        """The response's SSE events, in order (rebuilt afresh from the tape if it has one)."""
        if self.replay is None:
            return self.literal_events
        return tuple(expand_events(self.response, self.replay))

    def copy(self) -> StoredResponse:
        return StoredResponse(
            copy.deepcopy(self.response),
            tuple(copy.deepcopy(list(self.input_items))),
            tuple(copy.deepcopy(list(self.literal_events))),
            self.owner,
            copy.deepcopy(self.replay),
        )

    def to_json(self) -> JsonObject:
        """One JSON object holding the record; shares structure with it (no copy). The events
        go in as a replay tape when one rebuilds them exactly, else literally."""
        data: JsonObject = {
            "response": self.response,
            "input_items": list(self.input_items),
            "owner": self.owner,
        }
        replay = self.replay
        if replay is None and self.literal_events:
            replay = compact_events(self.response, self.literal_events)
        if replay is not None:
            data["replay"] = replay
        else:
            data["events"] = list(self.literal_events)
        return data

    @staticmethod
    def from_json(data: JsonObject) -> StoredResponse:
        """The record ``to_json`` gave, taking ownership of ``data``."""
        return StoredResponse(
            data["response"],
            tuple(data["input_items"]),
            tuple(data.get("events", ())),
            str(data.get("owner", "")),
            data.get("replay"),
        )


@dataclass(frozen=True, slots=True)
class ConversationRecord:
    """A conversation: its object fields and its items in order (each with its id)."""

    id: str
    created_at: int
    metadata: Mapping[str, str] = field(default_factory=dict)
    items: tuple[JsonObject, ...] = ()
    owner: str = ""

    @property
    def key(self) -> str:
        return scoped(self.owner, self.id)

    def copy(self) -> ConversationRecord:
        return ConversationRecord(
            self.id,
            self.created_at,
            dict(self.metadata),
            tuple(copy.deepcopy(list(self.items))),
            self.owner,
        )

    def to_json(self) -> JsonObject:
        """One JSON object holding the record; shares structure with it (no copy)."""
        return {
            "id": self.id,
            "created_at": self.created_at,
            "metadata": dict(self.metadata),
            "items": list(self.items),
            "owner": self.owner,
        }

    @staticmethod
    def from_json(data: JsonObject) -> ConversationRecord:
        """The record ``to_json`` gave, taking ownership of ``data``."""
        return ConversationRecord(
            str(data["id"]),
            int(data["created_at"]),
            dict(data["metadata"]),
            tuple(data["items"]),
            str(data.get("owner", "")),
        )


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
