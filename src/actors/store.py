"""The response store actor: the only owner of stored Response objects.

Invariants:
- The stored objects live in this one task; every other task asks by message through
  ``ResponseStoreHandle``. Objects are JSON-ready dicts, copied on the way in and out, so no
  caller can mutate what is stored.
- A response is stored only at its terminal event (the response actor puts it then), so a
  request refused before generation never leaves anything behind.
- This is the plain in-memory store of the walking skeleton; budgets, eviction and TTL belong
  to the budgeted store that replaces it behind the same handle.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import trio

from .kit import Reply, ask, open_mailbox

JsonObject = dict[str, Any]


@dataclass(frozen=True, slots=True)
class PutResponse:
    """Sender: a response actor at its terminal event."""

    response: JsonObject
    reply: Reply[None]


@dataclass(frozen=True, slots=True)
class GetResponse:
    """Sender: the HTTP layer (GET /v1/responses/{id})."""

    response_id: str
    reply: Reply[JsonObject | None]


@dataclass(frozen=True, slots=True)
class DeleteResponse:
    """Sender: the HTTP layer (DELETE /v1/responses/{id}). Replies whether it existed."""

    response_id: str
    reply: Reply[bool]


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    entries: int


StoreMessage = PutResponse | GetResponse | DeleteResponse


class ResponseStoreHandle:
    def __init__(self, mailbox: trio.MemorySendChannel[StoreMessage]) -> None:
        self._mailbox = mailbox
        self._stats = StoreStatistics(0)

    async def put(self, response: JsonObject) -> None:
        frozen = copy.deepcopy(response)
        await ask(self._mailbox, lambda reply: PutResponse(frozen, reply))

    async def get(self, response_id: str) -> JsonObject | None:
        return await ask(self._mailbox, lambda reply: GetResponse(response_id, reply))

    async def delete(self, response_id: str) -> bool:
        return await ask(self._mailbox, lambda reply: DeleteResponse(response_id, reply))

    def statistics(self) -> StoreStatistics:
        return self._stats


async def run_response_store(
    *, task_status: trio.TaskStatus[ResponseStoreHandle] = trio.TASK_STATUS_IGNORED
) -> None:
    send: trio.MemorySendChannel[StoreMessage]
    receive: trio.MemoryReceiveChannel[StoreMessage]
    send, receive = open_mailbox()
    handle = ResponseStoreHandle(send)
    entries: dict[str, JsonObject] = {}
    async with receive:
        task_status.started(handle)
        async for message in receive:
            match message:
                case PutResponse(response, reply):
                    entries[response["id"]] = response
                    reply.send(None)
                case GetResponse(response_id, reply):
                    found = entries.get(response_id)
                    reply.send(copy.deepcopy(found) if found is not None else None)
                case DeleteResponse(response_id, reply):
                    reply.send(entries.pop(response_id, None) is not None)
            handle._stats = StoreStatistics(len(entries))
