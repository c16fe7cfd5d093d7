"""A map under an entry budget, a byte budget and a time-to-live: the core of the stores.

Pure and I/O-free: one owner (a store actor's backend), no locks, and no clock of its own. Every
operation that can expire entries takes ``now`` from the caller, so tests drive time by hand.

Invariants (after every operation):
- ``len(self) <= limits.max_entries`` and ``self.bytes <= limits.max_bytes``; ``self.bytes`` is
  the sum of the ``nbytes`` given at ``put`` for the entries held.
- Eviction is least-recently-used: ``put`` and ``get`` make an entry the most recent; when a put
  pushes a budget over its limit, the least recent entries are removed, one at a time, until both
  limits hold again. Nothing else is ever evicted, so every entry that fits stays.
- TTL: an entry written (``put``) at ``t`` is readable while ``now < t + ttl_seconds``; a ``get``
  refreshes recency, not the TTL. ``ttl_seconds`` 0 disables expiry. ``now`` must not go
  backwards; a smaller ``now`` than one seen before is treated as the latest one seen.
- An entry whose ``nbytes`` exceeds ``max_bytes`` is not kept and evicts nothing; a put that
  replaces a key drops the old value first, even when the new value is refused.
- ``max_entries`` 0 keeps nothing (persistence disabled); ``max_bytes`` 0 keeps nothing either
  (the store stays usable but every entry is evicted at once); negative limits are an error.
- Every removal is counted once: ``evictions`` (budget), ``expirations`` (TTL) or
  ``rejections`` (refused at put). A ``delete`` or a replacement is not counted.

Costs: ``put``, ``get`` and ``delete`` are O(1) plus O(1) per entry they evict or expire. Entries
are kept in two insertion-ordered dicts: one by recency (LRU order) and, with a TTL, one by write
time; the TTL is the same for every entry, so write order is expiry order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from .interface import StoreLimits, StoreStatistics

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(slots=True)
class _Entry(Generic[V]):
    value: V
    nbytes: int
    written_at: float


class BudgetedMap(Generic[K, V]):
    """An LRU map bounded by entries and bytes, with a TTL from the last write."""

    def __init__(self, limits: StoreLimits, *, track_removals: bool = False) -> None:
        """``track_removals``: remember every key removed (evicted, expired, deleted or
        replaced) until ``drain_removed``, for a backend that mirrors the map on disk."""
        if limits.max_entries < 0 or limits.max_bytes < 0 or limits.ttl_seconds < 0:
            raise ValueError(f"store limits must not be negative: {limits}")
        self._limits = limits
        self._recency: OrderedDict[K, _Entry[V]] = OrderedDict()  # least recent first
        self._writes: OrderedDict[K, None] = OrderedDict()  # oldest write first (TTL only)
        self._bytes = 0
        self._now = float("-inf")
        self._evictions = 0
        self._expirations = 0
        self._rejections = 0
        self._removed: list[K] | None = [] if track_removals else None

    # -- queries --

    @property
    def limits(self) -> StoreLimits:
        return self._limits

    @property
    def bytes(self) -> int:
        """The sum of ``nbytes`` of the entries held."""
        return self._bytes

    @property
    def evictions(self) -> int:
        return self._evictions

    @property
    def expirations(self) -> int:
        return self._expirations

    @property
    def rejections(self) -> int:
        return self._rejections

    def __len__(self) -> int:
        return len(self._recency)

    def keys(self, now: float | None = None) -> Iterator[K]:
        """The keys held, least recently used first, without touching recency or expiring.

        Without ``now``, expired entries not yet removed are included; with it, only the keys
        still readable at ``now``.
        """
        ttl = self._limits.ttl_seconds
        if now is None or ttl <= 0:
            return iter(list(self._recency))
        now = max(now, self._now)
        return iter([k for k, e in self._recency.items() if e.written_at + ttl > now])

    def nbytes(self, key: K) -> int | None:
        """The byte size recorded for ``key``, without touching its recency."""
        entry = self._recency.get(key)
        return None if entry is None else entry.nbytes

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            entries=len(self._recency),
            bytes=self._bytes,
            evictions=self._evictions,
            expirations=self._expirations,
            rejections=self._rejections,
        )

    # -- commands --

    def drain_removed(self) -> list[K]:
        """The keys removed since the last call, in order (``track_removals`` only). A key
        replaced by a put appears here too: delete these first, then write what was kept."""
        if self._removed is None:
            return []
        removed, self._removed = self._removed, []
        return removed

    def restore(self, entries: Iterable[tuple[K, V, int, float]]) -> None:
        """Load ``(key, value, nbytes, written_at)`` entries, least recently used first (a
        durable backend at start), then evict least recently used ones until both limits hold
        (the flags may be smaller than when they were written). Expiry happens on the next
        operation, as ever."""
        loaded = list(entries)
        for key, value, nbytes, written_at in loaded:
            self._remove(key)
            self._recency[key] = _Entry(value, nbytes, written_at)
            self._bytes += nbytes
        if self._limits.ttl_seconds > 0:
            self._writes = OrderedDict(
                (key, None)
                for key, _ in sorted(self._recency.items(), key=lambda kv: kv[1].written_at)
            )
        limits = self._limits
        while self._recency and (
            len(self._recency) > limits.max_entries or self._bytes > limits.max_bytes
        ):
            self._remove(next(iter(self._recency)))
            self._evictions += 1

    def put(self, key: K, value: V, nbytes: int, now: float) -> bool:
        """Store ``value`` as the most recent entry; False if it was refused (not kept)."""
        if nbytes < 0:
            raise ValueError(f"nbytes must not be negative, got {nbytes}")
        self.expire(now)
        self._remove(key)
        limits = self._limits
        if limits.max_entries == 0 or limits.max_bytes == 0 or nbytes > limits.max_bytes:
            self._rejections += 1
            return False
        self._recency[key] = _Entry(value, nbytes, self._now)
        if limits.ttl_seconds > 0:
            self._writes[key] = None
        self._bytes += nbytes
        # The new entry fits alone (nbytes <= max_bytes, max_entries >= 1), so this loop stops
        # before reaching it.
        while len(self._recency) > limits.max_entries or self._bytes > limits.max_bytes:
            oldest = next(iter(self._recency))
            self._remove(oldest)
            self._evictions += 1
        return True

    def get(self, key: K, now: float) -> V | None:
        """The value for ``key`` (made the most recent), or None if absent or expired."""
        self.expire(now)
        entry = self._recency.get(key)
        if entry is None:
            return None
        self._recency.move_to_end(key)
        return entry.value

    def delete(self, key: K) -> bool:
        """Remove ``key``; whether it was held."""
        return self._remove(key)

    def expire(self, now: float) -> int:
        """Remove every entry whose TTL has run out at ``now``; how many were removed."""
        self._now = max(self._now, now)
        ttl = self._limits.ttl_seconds
        if ttl <= 0:
            return 0
        removed = 0
        while self._writes:
            oldest = next(iter(self._writes))
            if self._recency[oldest].written_at + ttl > self._now:
                break
            self._remove(oldest)
            removed += 1
        self._expirations += removed
        return removed

    def _remove(self, key: K) -> bool:
        entry = self._recency.pop(key, None)
        if entry is None:
            return False
        if self._removed is not None:
            self._removed.append(key)
        self._writes.pop(key, None)
        self._bytes -= entry.nbytes
        return True
