"""The stored records (pure values): a finished response, a conversation, an uploaded file.

Invariants:
- Records are immutable values; ``copy()`` returns an independent deep copy of their JSON, and
  ``to_json()`` / ``from_json()`` convert them to and from one plain JSON object (the form a
  backend may serialise; ``from_json(r.to_json())`` equals ``r`` up to lists for tuples inside).
- A ``StoredFile``'s data is ``bytes`` (immutable), so it is never copied.
- Keys are scoped to the tenant (``scoped``), so tenants never see each other's objects.
- They live here, below ``storage/`` (which keeps and serialises them) and beside the
  protocol code that renders them, so neither layer imports the other upward.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .events.replay import FAILED_UNSTARTED, compact_events, expand_events

JsonObject = dict[str, Any]


def scoped(owner: str, object_id: str) -> str:
    """The storage key of an object of tenant ``owner``: another tenant's key for
    the same id never matches, so its objects are simply absent (404), never forbidden."""
    return f"{owner}/{object_id}" if owner else object_id


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


def failed_unstarted(
    final: Mapping[str, Any], input_items: tuple[JsonObject, ...], owner: str, message: str
) -> StoredResponse:
    """The stored answer of a response that failed before it could be stored as it ended (a
    restart, a lost lease, a final object over the store's byte budget): ``failed`` with a
    ``server_error`` saying why, no output, and a stream the event machine rebuilds as
    ``created``, ``queued``, ``failed`` (its tape is one ``Fail``)."""
    failed = {
        **final,
        "status": "failed",
        "output": [],
        "completed_at": None,
        "incomplete_details": None,
        "error": {"code": "server_error", "message": message},
    }
    return StoredResponse(failed, input_items, (), owner, dict(FAILED_UNSTARTED))


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


@dataclass(frozen=True, slots=True)
class StoredFile:
    """An uploaded file. ``created_at``/``expires_at`` are Unix seconds (wall clock);
    ``expires_at`` is None without a TTL. ``content_type`` is the upload's (or a guess)."""

    id: str
    filename: str
    purpose: str
    content_type: str
    data: bytes
    created_at: int
    expires_at: int | None
    owner: str = ""
    # Set on a metadata-only copy whose ``data`` lives elsewhere (the SQLite file store's
    # index): the size of the data it stands for.
    stored_size: int | None = None

    @property
    def size(self) -> int:
        """The file object's ``bytes``."""
        return len(self.data) if self.stored_size is None else self.stored_size
