"""The store actor's files (``Store.files``): the only owner of uploaded files (docs/files.md).

Invariants:
- Files live in the store actor (``store.py``), inside a ``FileStorage`` backend; every other
  task asks by message through ``FileStoreHandle``. A ``StoredFile`` is immutable (its data is ``bytes``),
  so handing the same object to many readers is safe and no file is ever copied.
- The actor mints each file's id (``file-...``), ``created_at`` (Unix seconds from the
  store's ``wall_clock``) and ``expires_at`` (``created_at`` plus the store's TTL, or plus a shorter
  ``expires_after``; null with neither). ``put`` replies with the record, or None when the
  backend refused it (over the per-file limit or the whole byte budget), which stores nothing.
- Every request names an ``owner`` (the tenant, ``""`` when the server is open). A file of
  another owner is absent: ``get`` and ``delete`` answer as for an unknown id and ``list`` never
  shows it (404, never 403), and such a request touches nothing of that file.
- Budgets and expiry are the backend's (LRU under ``--files-max-bytes``, TTL
  ``--files-ttl-secs``): ``get`` refreshes recency, ``list`` does not; an evicted or expired
  file reads as absent (None).
- A backend error is raised in the asking task; the actor answers every request exactly once
  and keeps running. ``statistics()`` is the backend's, as of the newest reply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import assert_never

import trio

from ..protocol.ids import new_id
from ..storage.files import FileLimits, FileStorage, StoredFile
from .kit import Reply
from .store_part import StoreAnswer, StorePart


@dataclass(frozen=True, slots=True)
class PutFile:
    """Sender: the HTTP layer (``POST /v1/files``). Replies with the new record, or None."""

    owner: str
    filename: str
    purpose: str
    content_type: str
    data: bytes
    expires_after: int | None
    reply: Reply[StoreAnswer[StoredFile | None]]


@dataclass(frozen=True, slots=True)
class GetFile:
    """Sender: the HTTP layer and response actors (``input_file``). Refreshes recency."""

    owner: str
    file_id: str
    reply: Reply[StoreAnswer[StoredFile | None]]


@dataclass(frozen=True, slots=True)
class ListFiles:
    """Sender: the HTTP layer (``GET /v1/files``). The owner's files in upload order."""

    owner: str
    purpose: str | None
    reply: Reply[StoreAnswer[tuple[StoredFile, ...]]]


@dataclass(frozen=True, slots=True)
class DeleteFile:
    """Sender: the HTTP layer (``DELETE /v1/files/{id}``). Replies whether it existed."""

    owner: str
    file_id: str
    reply: Reply[StoreAnswer[bool]]


FileMessage = PutFile | GetFile | ListFiles | DeleteFile


class FileStoreHandle(StorePart[FileMessage]):
    """The store actor's handle for files (``Store.files``)."""

    def __init__(self, mailbox: trio.MemorySendChannel[FileMessage], limits: FileLimits) -> None:
        super().__init__(mailbox)
        self.limits = limits

    async def put(
        self,
        *,
        filename: str,
        purpose: str,
        content_type: str,
        data: bytes,
        owner: str = "",
        expires_after: int | None = None,
    ) -> StoredFile | None:
        """Store a new file of ``owner``; its record, or None if it does not fit the limits."""
        return await self._ask(
            lambda reply: PutFile(
                owner, filename, purpose, content_type, bytes(data), expires_after, reply
            ),
        )

    async def get(self, file_id: str, owner: str = "") -> StoredFile | None:
        """``owner``'s file ``file_id``; None if unknown, expired, evicted or another's."""
        return await self._ask(lambda reply: GetFile(owner, file_id, reply))

    async def list(self, owner: str = "", purpose: str | None = None) -> tuple[StoredFile, ...]:
        """``owner``'s files (of ``purpose`` if given), oldest upload first."""
        return await self._ask(lambda reply: ListFiles(owner, purpose, reply))

    async def delete(self, file_id: str, owner: str = "") -> bool:
        return await self._ask(lambda reply: DeleteFile(owner, file_id, reply))


def answer(backend: FileStorage, wall_clock: Callable[[], float], message: FileMessage) -> object:
    """Apply one request to the backend; the reply's value."""
    match message:
        case PutFile(owner, filename, purpose, content_type, data, expires_after, _):
            ttl = backend.limits.ttl_seconds
            lifetime = None if expires_after is None else float(expires_after)
            if lifetime is not None and ttl > 0 and lifetime >= ttl:
                lifetime = None  # the store's TTL ends it first anyway
            effective = lifetime if lifetime is not None else ttl
            created_at = int(wall_clock())
            record = StoredFile(
                id=new_id("file"),
                filename=filename,
                purpose=purpose,
                content_type=content_type,
                data=data,
                created_at=created_at,
                expires_at=created_at + int(effective) if effective > 0 else None,
                owner=owner,
            )
            kept = backend.put(record, lifetime=lifetime)
            return record if kept else None
        case GetFile(owner, file_id, _):
            return backend.get(file_id, owner)
        case ListFiles(owner, purpose, _):
            return backend.list(owner, purpose)
        case DeleteFile(owner, file_id, _):
            return backend.delete(file_id, owner)
        case _:
            assert_never(message)
