"""The file store's records, limits and in-memory backend, on ``BudgetedMap``.

Invariants:
- A file is one immutable ``StoredFile``: its bytes (``bytes`` is immutable) and metadata. The
  backend keeps the very object it was given and hands it out again; nothing can mutate it, so
  no copy is made of (possibly tens of MiB of) file data on the way in or out. This satisfies
  the storage interface's ownership rule without copying.
- Entries are keyed by ``(owner, file id)``: a lookup with another owner is a plain miss, so
  another tenant's file is absent (404), never forbidden, and such a miss touches
  nothing (no recency refresh, no expiry change) of the other tenant's entry.
- Byte accounting: a file is charged ``charged_bytes(record)``: its size plus its metadata
  strings plus a fixed ``RECORD_OVERHEAD``; the total is held under ``max_bytes``, least
  recently used first evicted (``BudgetedMap``); a ``get`` refreshes recency, a ``list`` does
  not. A file larger than the per-file limit, or than the whole budget, is refused at ``put``
  (nothing evicted). At most ``MAX_FILES`` files are held (OpenAI's list page maximum).
- Expiry: the store's TTL from the upload (``BudgetedMap``; ``ttl_seconds`` 0: none), or a
  shorter per-file ``expires_after`` deadline; an expired file reads as absent and is counted
  once in ``expirations``. Time comes from ``clock`` (monotonic by default), read once per
  operation, so tests drive expiry with a fake clock.
- ``list`` returns the owner's readable files in upload order (oldest first).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from .budget import BudgetedMap
from .interface import StoredFile as StoredFile  # the record lives in protocol.records
from .interface import StoreLimits, StoreStatistics

Clock = Callable[[], float]

MIB = 1024 * 1024
MAX_FILES = 10_000
"""Most files held at once (all tenants together); OpenAI's largest list page."""
RECORD_OVERHEAD = 256
"""Bytes charged per file on top of its data and metadata strings (the record's bookkeeping)."""


@dataclass(frozen=True, slots=True)
class FileLimits:
    """The file store's flags: ``--files-max-bytes``, ``--files-max-file-bytes``,
    ``--files-ttl-secs``. ``max_bytes`` 0 refuses every upload; ``ttl_seconds`` 0: no expiry."""

    max_bytes: int = 1024 * MIB
    max_file_bytes: int = 32 * MIB
    ttl_seconds: float = 7 * 24 * 3600  # the seven-day retention window

    def __post_init__(self) -> None:
        if self.max_bytes < 0 or self.max_file_bytes < 0 or self.ttl_seconds < 0:
            raise ValueError(f"file store limits must not be negative: {self}")

    def store_limits(self) -> StoreLimits:
        return StoreLimits(MAX_FILES, self.max_bytes, self.ttl_seconds)


DEFAULT_FILE_LIMITS = FileLimits()


def charged_bytes(record: StoredFile) -> int:
    """What the byte budget charges for ``record``: data, metadata strings, fixed overhead."""
    strings = (record.id, record.filename, record.purpose, record.content_type, record.owner)
    return record.size + sum(len(s.encode("utf-8")) for s in strings) + RECORD_OVERHEAD


class FileStorage(Protocol):
    """What the file store actor needs of a backend (the memory one, or a durable one later)."""

    @property
    def limits(self) -> FileLimits: ...
    def put(self, record: StoredFile, *, lifetime: float | None = None) -> bool: ...
    def get(self, file_id: str, owner: str = "") -> StoredFile | None: ...
    def list(self, owner: str = "", purpose: str | None = None) -> tuple[StoredFile, ...]: ...
    def delete(self, file_id: str, owner: str = "") -> bool: ...
    def statistics(self) -> StoreStatistics: ...
    def close(self) -> None: ...


_Key = tuple[str, str]  # (owner, file id)


class MemoryFileStorage:
    """Files in memory under ``limits``, least recently used evicted first."""

    def __init__(self, limits: FileLimits, *, clock: Clock = time.monotonic) -> None:
        self._limits = limits
        self._map: BudgetedMap[_Key, StoredFile] = BudgetedMap(limits.store_limits())
        self._clock = clock
        # Upload order, for listing without touching recency; pruned to the map's keys
        # whenever the map dropped something behind our back (eviction, TTL expiry).
        self._index: dict[_Key, StoredFile] = {}
        # Per-file deadlines shorter than the TTL (``expires_after``): a min-heap on the
        # backend clock; entries for keys already gone are skipped when popped.
        self._deadlines: list[tuple[float, _Key]] = []
        self._deadline_of: dict[_Key, float] = {}
        self._early_expirations = 0

    @property
    def limits(self) -> FileLimits:
        return self._limits

    def put(self, record: StoredFile, *, lifetime: float | None = None) -> bool:
        """Keep ``record``; False if refused (over the per-file limit or the whole budget).

        ``lifetime`` (seconds from now) expires this file earlier than the store's TTL.
        """
        now = self._sweep()
        key = (record.owner, record.id)
        if record.size > self._limits.max_file_bytes:
            self._map.delete(key)  # a refused replacement still drops the old version
            self._sync()
            return False
        kept = self._map.put(key, record, charged_bytes(record), now)
        self._deadline_of.pop(key, None)
        if kept:
            self._index[key] = record
            if lifetime is not None:
                deadline = now + lifetime
                self._deadline_of[key] = deadline
                heapq.heappush(self._deadlines, (deadline, key))
        self._sync()
        return kept

    def get(self, file_id: str, owner: str = "") -> StoredFile | None:
        """The file (made the most recent), or None if absent, expired or another owner's."""
        now = self._sweep()
        found = self._map.get((owner, file_id), now)
        self._sync()
        return found

    def list(self, owner: str = "", purpose: str | None = None) -> tuple[StoredFile, ...]:
        """``owner``'s readable files in upload order, optionally of one ``purpose``."""
        self._sweep()
        self._sync()
        return tuple(
            record
            for (file_owner, _), record in self._index.items()
            if file_owner == owner and (purpose is None or record.purpose == purpose)
        )

    def delete(self, file_id: str, owner: str = "") -> bool:
        self._sweep()
        key = (owner, file_id)
        removed = self._map.delete(key)
        self._deadline_of.pop(key, None)
        self._sync()
        return removed

    def statistics(self) -> StoreStatistics:
        self._sweep()
        self._sync()
        stats = self._map.statistics()
        return replace(stats, expirations=stats.expirations + self._early_expirations)

    def close(self) -> None:
        """Nothing to release: memory goes with the process."""

    def held(self) -> dict[tuple[str, str], StoredFile]:
        """The files held now, by ``(owner, id)``, in upload order (without expiring)."""
        self._sync()
        return dict(self._index)

    def lifetime_of(self, owner: str, file_id: str, now: float) -> float | None:
        """Seconds left of ``expires_after`` at ``now`` (None: only the store's TTL)."""
        deadline = self._deadline_of.get((owner, file_id))
        return None if deadline is None else deadline - now

    def _sweep(self) -> float:
        """Expire by TTL and by per-file deadline at the clock's time; that time."""
        now = self._clock()
        self._map.expire(now)
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, key = heapq.heappop(self._deadlines)
            if self._deadline_of.get(key) != deadline:
                continue  # deleted, evicted, replaced or expired already
            del self._deadline_of[key]
            if self._map.delete(key):
                self._early_expirations += 1
        return now

    def _sync(self) -> None:
        """Drop index and deadline entries of keys the map no longer holds."""
        if len(self._index) == len(self._map):
            return
        held = set(self._map.keys())
        self._index = {k: v for k, v in self._index.items() if k in held}
        for key in [k for k in self._deadline_of if k not in held]:
            del self._deadline_of[key]
        if len(self._deadlines) > 2 * len(self._deadline_of) + 16:
            self._deadlines = [(d, k) for k, d in self._deadline_of.items()]
            heapq.heapify(self._deadlines)
