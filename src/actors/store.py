"""The store actor: the one owner of everything kept between requests (responses,
conversations, files, the reasoning echo).

```
store actor (Trio task)             its mailbox: every part's requests, answered in order
 └─ storage thread (durable only)   opens, uses and closes the backends (storage/thread.py)
```

Invariants:
- One task owns every backend (``storage.choice.Backends``); other tasks reach them only by
  message through the ``Store`` handle's typed parts (``store.responses``,
  ``store.conversations``, ``store.files``, ``store.echo``), whose requests and answers are
  defined beside each part (``response_store.py``, ``conversation_store.py``, ``file_store.py``,
  ``reasoning_echo.py``).
- Memory backends are served in this task; durable ones (SQLite, PostgreSQL) are opened, used
  and closed on the actor's one ``StorageThread``, one request at a time, so Trio never blocks
  on I/O and a backend is only ever touched by one thread.
- Every request is answered exactly once with a ``StoreAnswer``: its outcome (a backend's
  exception is raised in the asking task, and the actor keeps serving) and the answering part's
  statistics as of that answer. Statistics travel only in replies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any, assert_never

import outcome
import trio

from ..storage.choice import Backends, Budgets, memory_backends
from ..storage.interface import StoreStatistics
from ..storage.thread import storage_runner
from . import conversation_store, file_store, reasoning_echo, response_store
from .conversation_store import (
    AppendItems,
    ConversationStoreHandle,
    CreateConversation,
    DeleteConversation,
    DeleteItem,
    GetConversation,
    UpdateConversation,
)
from .file_store import DeleteFile, FileStoreHandle, GetFile, ListFiles, PutFile
from .kit import open_mailbox
from .reasoning_echo import ReasoningEchoHandle, Recall, Remember
from .response_store import DeleteResponse, GetResponse, PutJob, PutResponse, ResponseStoreHandle
from .store_part import StoreAnswer, StorePart

StoreMessage = (
    response_store.ResponseMessage
    | conversation_store.ConversationMessage
    | file_store.FileMessage
    | reasoning_echo.EchoMessage
)

WallClock = Callable[[], float]


class Store:
    """The store actor's handle: one typed part per kind of record, one mailbox."""

    def __init__(self, mailbox: trio.MemorySendChannel[StoreMessage], budgets: Budgets) -> None:
        self.responses = ResponseStoreHandle(mailbox, budgets.responses)
        self.conversations = ConversationStoreHandle(mailbox, budgets.conversations)
        self.files = FileStoreHandle(mailbox, budgets.files)
        self.echo = ReasoningEchoHandle(mailbox, budgets.echo_bytes)


async def run_store(
    budgets: Budgets,
    backends: Backends | None = None,
    *,
    open_backends: Callable[[], Backends] | None = None,
    wall_clock: WallClock = time.time,
    task_status: trio.TaskStatus[Store] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``backends`` (default: in memory, in this task), or those ``open_backends`` opens
    on the actor's own thread (``storage.choice.backends_opener``). ``wall_clock`` stamps new
    files (Unix seconds)."""
    send: trio.MemorySendChannel[StoreMessage]
    receive: trio.MemoryReceiveChannel[StoreMessage]
    send, receive = open_mailbox()
    store = Store(send, budgets)
    async with receive, storage_runner("store", open_backends) as (opened, run):
        served = backends if backends is not None else opened or memory_backends(budgets)
        first = _statistics(served) if run is None else await run(lambda: _statistics(served))
        for part, statistics in zip(_parts(store), first, strict=True):
            part.observe(statistics, 0)
        task_status.started(store)
        serial = 0
        async for message in receive:
            serial += 1
            if run is None:
                answer = _answer(served, wall_clock, serial, message)
            else:
                answer = await run(partial(_answer, served, wall_clock, serial, message))
            if isinstance(answer.result, outcome.Error) and not isinstance(
                answer.result.error, Exception
            ):
                raise answer.result.error  # KeyboardInterrupt and the like end the actor
            message.reply.send(answer)


def _parts(store: Store) -> tuple[StorePart[Any], ...]:
    return store.responses, store.conversations, store.files, store.echo


def _statistics(backends: Backends) -> tuple[StoreStatistics, ...]:
    parts = (backends.responses, backends.conversations, backends.files, backends.echo)
    return tuple(part.statistics() for part in parts)


def _answer(
    backends: Backends, clock: WallClock, serial: int, message: StoreMessage
) -> StoreAnswer[Any]:
    """One request applied to its part's backend, where the backends live (this task, or the
    storage thread): the answer, with that part's statistics after it."""
    part: Any
    match message:
        case PutResponse() | GetResponse() | DeleteResponse() | PutJob():
            part = backends.responses
            result = outcome.capture(response_store.answer, part, message)
        case (
            CreateConversation()
            | GetConversation()
            | UpdateConversation()
            | DeleteConversation()
            | AppendItems()
            | DeleteItem()
        ):
            part = backends.conversations
            result = outcome.capture(conversation_store.answer, part, message)
        case PutFile() | GetFile() | ListFiles() | DeleteFile():
            part = backends.files
            result = outcome.capture(file_store.answer, part, clock, message)
        case Remember() | Recall():
            part = backends.echo
            result = outcome.capture(reasoning_echo.answer, part, message)
        case _:
            assert_never(message)
    return StoreAnswer(result, part.statistics(), serial)


__all__ = ["Backends", "Budgets", "Store", "StoreMessage", "run_store"]
