"""The response store actor: the only owner of stored responses.

Invariants:
- The records live in this one task, inside a ``ResponseStorage`` backend; every other task asks
  by message through ``ResponseStoreHandle``. The backend takes its own copy at ``put`` (the
  memory backend serialises the record) and hands out records no one else holds (the storage
  interface's rule), so no caller can mutate what is stored; ``put`` returns only once the
  backend has its copy.
- Budgets are the backend's (spec 000, Storage Flags; the memory backend: LRU eviction until
  the entry and byte limits hold, TTL from the last write, a record over the byte budget not
  kept). A ``get`` refreshes recency; an evicted or expired response reads as absent (None).
- A response is stored only at its terminal event (the response actor puts it then), so a
  request refused before generation never leaves anything behind.
- ``enabled`` is false when persistence is disabled (``--responses-store-max-entries 0``).
- A backend error (e.g. a record that is not JSON) is raised in the asking task; the actor
  answers every request exactly once and keeps running.
- ``statistics()`` is the backend's, as of the last message handled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import assert_never

import trio

from ..storage.interface import (
    ResponseStorage,
    StoredResponse,
    StoreLimits,
    StoreStatistics,
    scoped,
)
from ..storage.memory import MemoryResponseStorage
from ..storage.thread import storage_runner
from .kit import Reply, ask, open_mailbox, serve_requests


@dataclass(frozen=True, slots=True)
class PutResponse:
    """Sender: a response actor at its terminal event."""

    record: StoredResponse
    reply: Reply[None]


@dataclass(frozen=True, slots=True)
class GetResponse:
    """Sender: the HTTP layer and response actors (chains). Refreshes recency."""

    response_id: str
    reply: Reply[StoredResponse | None]


@dataclass(frozen=True, slots=True)
class DeleteResponse:
    """Sender: the HTTP layer (DELETE /v1/responses/{id}). Replies whether it existed."""

    response_id: str
    reply: Reply[bool]


@dataclass(frozen=True, slots=True)
class PutJob:
    """Sender: the job supervisor, as a stored background job starts (its queued object and
    input). A durable backend keeps it until the job's record is put; a restart finds the
    unfinished ones and stores them ``failed`` (the server restarted)."""

    record: StoredResponse
    reply: Reply[None]


StoreMessage = PutResponse | GetResponse | DeleteResponse | PutJob


class ResponseStoreHandle:
    def __init__(self, mailbox: trio.MemorySendChannel[StoreMessage], limits: StoreLimits):
        self._mailbox = mailbox
        self.limits = limits
        self._stats = StoreStatistics()

    @property
    def enabled(self) -> bool:
        return self.limits.max_entries > 0

    async def put(self, record: StoredResponse) -> None:
        # No copy here: the backend takes its own at put (the storage interface's rule; the
        # memory backend serialises), and the caller waits until it has.
        await ask(self._mailbox, lambda reply: PutResponse(record, reply))

    async def get(self, response_id: str, owner: str = "") -> StoredResponse | None:
        """The record of ``owner``'s response ``response_id`` (another tenant's is absent)."""
        key = scoped(owner, response_id)
        return await ask(self._mailbox, lambda reply: GetResponse(key, reply))

    async def delete(self, response_id: str, owner: str = "") -> bool:
        key = scoped(owner, response_id)
        return await ask(self._mailbox, lambda reply: DeleteResponse(key, reply))

    async def job_started(self, record: StoredResponse) -> None:
        """A stored background job began (``record``: its queued object and input items);
        durable before this returns."""
        await ask(self._mailbox, lambda reply: PutJob(record, reply))

    def statistics(self) -> StoreStatistics:
        return self._stats


async def run_response_store(
    limits: StoreLimits,
    storage: ResponseStorage | None = None,
    *,
    open_storage: Callable[[], ResponseStorage] | None = None,
    task_status: trio.TaskStatus[ResponseStoreHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``storage`` (default: in memory, in this task), or the durable backend that
    ``open_storage`` opens on a thread of this actor's own (``StorageThread``)."""
    send: trio.MemorySendChannel[StoreMessage]
    receive: trio.MemoryReceiveChannel[StoreMessage]
    send, receive = open_mailbox()
    handle = ResponseStoreHandle(send, limits)
    async with receive, storage_runner("response-store", open_storage) as (opened, run):
        backend: ResponseStorage = (
            storage if storage is not None else opened or MemoryResponseStorage(limits)
        )
        handle._stats = backend.statistics() if run is None else await run(backend.statistics)
        task_status.started(handle)

        def publish() -> None:
            handle._stats = backend.statistics()

        await serve_requests(receive, partial(_answer, backend), publish, run)


def _answer(backend: ResponseStorage, message: StoreMessage) -> object:
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
