"""The store actor's responses (``Store.responses``): the only owner of stored responses.

Invariants:
- The records live in the store actor (``store.py``), inside a ``ResponseStorage`` backend;
  every other task asks by message through ``ResponseStoreHandle``. The backend takes its own
  copy at ``put`` (the memory backend serialises the record) and hands out records no one else
  holds (the storage interface's rule), so no caller can mutate what is stored; ``put``
  returns only once the backend has its copy.
- Budgets are the backend's (Storage Flags; the memory backend: LRU eviction until
  the entry and byte limits hold, TTL from the last write, a record over the byte budget not
  kept). A ``get`` refreshes recency; an evicted or expired response reads as absent (None).
- A response is stored only at its terminal event (the response actor puts it then), so a
  request refused before generation never leaves anything behind.
- ``enabled`` is false when persistence is disabled (``--responses-store-max-entries 0``).
- A backend error (e.g. a record that is not JSON) is raised in the asking task; the actor
  answers every request exactly once and keeps running.
- ``statistics()`` is the backend's, as of the newest reply (``store_part.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_never

import trio

from ..storage.interface import ResponseStorage, StoredResponse, StoreLimits, scoped
from .kit import Reply
from .store_part import StoreAnswer, StorePart


@dataclass(frozen=True, slots=True)
class PutResponse:
    """Sender: a response actor at its terminal event."""

    record: StoredResponse
    reply: Reply[StoreAnswer[None]]


@dataclass(frozen=True, slots=True)
class GetResponse:
    """Sender: the HTTP layer and response actors (chains). Refreshes recency."""

    response_id: str
    reply: Reply[StoreAnswer[StoredResponse | None]]


@dataclass(frozen=True, slots=True)
class DeleteResponse:
    """Sender: the HTTP layer (DELETE /v1/responses/{id}). Replies whether it existed."""

    response_id: str
    reply: Reply[StoreAnswer[bool]]


@dataclass(frozen=True, slots=True)
class PutJob:
    """Sender: the job supervisor, as a stored background job starts (its queued object and
    input). A durable backend keeps it until the job's record is put; a restart finds the
    unfinished ones and stores them ``failed`` (the server restarted)."""

    record: StoredResponse
    reply: Reply[StoreAnswer[None]]


ResponseMessage = PutResponse | GetResponse | DeleteResponse | PutJob


class ResponseStoreHandle(StorePart[ResponseMessage]):
    """The store actor's handle for responses (``Store.responses``)."""

    def __init__(self, mailbox: trio.MemorySendChannel[ResponseMessage], limits: StoreLimits):
        super().__init__(mailbox)
        self.limits = limits

    @property
    def enabled(self) -> bool:
        return self.limits.max_entries > 0

    async def put(self, record: StoredResponse) -> None:
        # No copy here: the backend takes its own at put (the storage interface's rule; the
        # memory backend serialises), and the caller waits until it has.
        await self._tell(lambda reply: PutResponse(record, reply))

    async def get(self, response_id: str, owner: str = "") -> StoredResponse | None:
        """The record of ``owner``'s response ``response_id`` (another tenant's is absent)."""
        key = scoped(owner, response_id)
        return await self._ask(lambda reply: GetResponse(key, reply))

    async def delete(self, response_id: str, owner: str = "") -> bool:
        key = scoped(owner, response_id)
        return await self._ask(lambda reply: DeleteResponse(key, reply))

    async def job_started(self, record: StoredResponse) -> None:
        """A stored background job began (``record``: its queued object and input items);
        durable before this returns."""
        await self._tell(lambda reply: PutJob(record, reply))


def answer(backend: ResponseStorage, message: ResponseMessage) -> object:
    """Apply one request to the backend; the reply's value."""
    match message:
        case PutResponse(record, _):
            backend.put(record)
            return None
        case GetResponse(response_id, _):
            return backend.get(response_id)
        case DeleteResponse(response_id, _):
            return backend.delete(response_id)
        case PutJob(record, _):
            backend.job_started(record)
            return None
        case _:
            assert_never(message)
