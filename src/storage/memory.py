"""In-memory storage backends (the default), under the storage flags' budgets.

Each backend keeps its records in a :class:`~.budget.BudgetedMap` as serialised JSON: one
``bytes`` blob per record, the compact UTF-8 JSON of ``record.to_json()`` (what the HTTP layer
would send, without spaces and without ``\\u`` escapes for non-ASCII text).

Invariants:
- Byte accounting (the estimator): a record counts ``len(blob)``, the exact size of its
  serialised JSON, computed once at ``put``. What is held in memory is that blob plus a constant
  per-entry overhead (the key, two dict slots, the blob's header: about 250 bytes), so the
  process's memory grows with the byte budget, not with Python's object overhead (several times
  the JSON size for small dicts and strings).
- ``get`` decodes a fresh record, so no caller ever holds what is stored (the interface's
  ownership rule) and no copy is needed on the way out.
- Time comes from ``clock`` (default ``time.monotonic``), read once per operation; tests pass a
  fake clock to drive TTL expiry.
- A record that is not JSON (a non-serialisable value) raises ``TypeError`` at ``put``, which
  changes nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from .budget import BudgetedMap
from .interface import (
    ConversationEdit,
    ConversationRecord,
    StoredResponse,
    StoreLimits,
    StoreStatistics,
    change_in_place,
)

Clock = Callable[[], float]


def encode_json(data: Any) -> bytes:
    """Compact UTF-8 JSON: the serialised form the memory backends hold and account for."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def decode_json(blob: bytes) -> Any:
    return json.loads(blob)


def serialized_size(data: Any) -> int:
    """The byte estimate the memory backends charge for ``data`` (a record's ``to_json()``)."""
    return len(encode_json(data))


class _JsonRecord(Protocol):
    @property
    def key(self) -> str: ...
    def to_json(self) -> Any: ...


R = TypeVar("R", bound=_JsonRecord)


class _MemoryRecords(Generic[R]):
    """Records held as compact JSON blobs, least recently used evicted first, under ``limits``;
    the byte estimate is the blob's exact length."""

    def __init__(
        self, limits: StoreLimits, decode: Callable[[Any], R], clock: Clock = time.monotonic
    ) -> None:
        self._map: BudgetedMap[str, bytes] = BudgetedMap(limits)
        self._decode = decode
        self._clock = clock

    @property
    def limits(self) -> StoreLimits:
        return self._map.limits

    def put(self, record: R) -> None:
        blob = encode_json(record.to_json())
        self._map.put(record.key, blob, len(blob), self._clock())

    def get(self, key: str) -> R | None:
        blob = self._map.get(key, self._clock())
        return None if blob is None else self._decode(decode_json(blob))

    def delete(self, key: str) -> bool:
        self._map.expire(self._clock())
        return self._map.delete(key)

    def statistics(self) -> StoreStatistics:
        self._map.expire(self._clock())
        return self._map.statistics()

    def close(self) -> None:
        """Nothing to release: memory goes with the process."""


class MemoryResponseStorage(_MemoryRecords[StoredResponse]):
    """Stored responses in memory, least recently used evicted first, under ``limits``."""

    def __init__(self, limits: StoreLimits, *, clock: Clock = time.monotonic) -> None:
        super().__init__(limits, StoredResponse.from_json, clock)

    def job_started(self, record: StoredResponse) -> None:
        """Nothing to keep: a restart forgets every job with the rest of memory."""


class MemoryConversationStorage(_MemoryRecords[ConversationRecord]):
    """Conversations in memory, least recently used evicted first, under ``limits``.

    A conversation is one record: an append re-serialises it whole (O(items)), and its TTL
    starts again at every write.
    """

    def __init__(self, limits: StoreLimits, *, clock: Clock = time.monotonic) -> None:
        super().__init__(limits, ConversationRecord.from_json, clock)

    def change(self, conversation_id: str, edit: ConversationEdit) -> ConversationRecord | None:
        return change_in_place(self, conversation_id, edit)


DEFAULT_ECHO_BYTES = 16 * 1024 * 1024
"""The reasoning echo's byte budget (``MLXCEL_REASONING_ECHO_MAX_BYTES``; 0 disables it)."""
_ECHO_MAX_ENTRIES = 1 << 20


class MemoryEchoStorage:
    """The reasoning echo's memory: always in memory (a restart forgets it, like a cache), each
    entry charged its key and its reasoning's UTF-8 bytes."""

    def __init__(self, max_bytes: int, *, clock: Clock = time.monotonic) -> None:
        self._map: BudgetedMap[str, str] = BudgetedMap(StoreLimits(_ECHO_MAX_ENTRIES, max_bytes, 0))
        self._clock = clock

    def remember(self, key: str, reasoning: str) -> None:
        self._map.put(key, reasoning, len(key) + len(reasoning.encode()), self._clock())

    def recall(self, keys: tuple[str, ...]) -> dict[str, str]:
        now = self._clock()
        return {k: v for k in keys if (v := self._map.get(k, now)) is not None}

    def statistics(self) -> StoreStatistics:
        return self._map.statistics()

    def close(self) -> None:
        pass
