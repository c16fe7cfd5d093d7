"""The prompt cache's disk tier, pure part: file names, the header's fields, and the index.

No MLX and no file I/O here: ``disk_tier.py`` reads and writes the files and deletes the ones
this index lets go.

Invariants:
- A file's name is the SHA-256 of everything that decides whether it may serve a prompt: the
  tenant, the model's and the cache layout's fingerprints, the rank (a sharded model's shard)
  and the tokens (``entry_name``). Each part is length-prefixed, so no two different keys
  share a name; a file renamed or copied under another name fails ``entry_name`` on reading.
- The index is a ``PrefixCache`` keyed ``(tenant, tokens)`` whose value is the file's
  ``DiskEntry`` and whose size is the file's: longest-prefix lookup and an LRU byte budget,
  the same rules as the RAM tier (a trimmable entry serves any prefix, another only prompts it
  is an exact prefix of). Every file it drops (evicted, superseded by a longer trimmable entry,
  expired, bad) is queued in ``take_dropped`` for deletion; the bytes it counts never exceed
  ``max_bytes`` after a call returns.
- An entry unused for ``ttl_seconds`` (since it was written or last served) is never found:
  ``find`` drops it first, and ``expire`` sweeps the rest.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from .cache_stats import DiskStats
from .prefix_cache import PrefixCache, PrefixMatch, Tokens

# The suffix of a finished entry's file; a temp file being written ends in ".tmp".
SUFFIX = ".kv"


def encode_tokens(tokens: Sequence[int]) -> bytes:
    """Tokens as little-endian signed 64-bit integers (an image handle's ids are negative)."""
    return struct.pack(f"<{len(tokens)}q", *tokens)


def decode_tokens(data: bytes) -> Tokens:
    if len(data) % 8:
        raise ValueError("a token run is whole 8-byte integers")
    return struct.unpack(f"<{len(data) // 8}q", data)


def entry_name(tenant: str, model: str, layout: str, rank: int, tokens: Sequence[int]) -> str:
    """The file name of the entry of ``tokens`` for ``tenant`` (see the module header)."""
    digest = hashlib.sha256()
    for part in (tenant.encode(), model.encode(), layout.encode(), str(rank).encode()):
        digest.update(struct.pack("<Q", len(part)))
        digest.update(part)
    digest.update(encode_tokens(tokens))
    return digest.hexdigest() + SUFFIX


@dataclass(frozen=True, slots=True)
class DiskEntry:
    """One file of the directory: its name and size, whether its cache can be trimmed, how
    many of its tokens were the prompt, its positions' move (``vision.shift_tag``), the
    whole entry's bytes as the RAM tier counts them, and when it was last written or served."""

    name: str
    nbytes: int
    trimmable: bool
    prompt_tokens: int
    moved: int
    whole_bytes: int
    used_at: float


# No count bound of its own: the directory is bounded by bytes (and the file system).
_NO_ENTRY_BOUND = 1 << 40


class DiskIndex:
    """What the directory holds, by ``(tenant, tokens)`` (see the module header)."""

    def __init__(self, max_bytes: int, ttl_seconds: float) -> None:
        self._core: PrefixCache[DiskEntry] = PrefixCache(
            max_bytes, _NO_ENTRY_BOUND, on_remove=self._removed
        )
        self.ttl_seconds = ttl_seconds
        self._dropped: list[str] = []
        self._counts = {"hits": 0, "misses": 0, "tokens_reused": 0, "writes": 0}
        self._counts |= {"write_errors": 0, "skipped": 0, "expired": 0}

    @property
    def enabled(self) -> bool:
        return self._core.enabled

    def __len__(self) -> int:
        return len(self._core)

    def __contains__(self, item: tuple[str, Tokens]) -> bool:
        return item in self._core

    def keys(self, tenant: str) -> list[Tokens]:
        return self._core.keys(tenant)

    def entries(self) -> list[tuple[str, Tokens, DiskEntry]]:
        return self._core.items()

    def _removed(self, _tenant: str, _key: Tokens, entry: DiskEntry, _evicted: bool) -> None:
        self._dropped.append(entry.name)

    def take_dropped(self) -> list[str]:
        """The names of the files dropped since the last call: delete them."""
        dropped, self._dropped = self._dropped, []
        return dropped

    def add(self, tenant: str, tokens: Sequence[int], entry: DiskEntry) -> None:
        """Index a file written (or found at start); a file larger than the budget is not
        kept (its name is dropped at once)."""
        if entry.nbytes > self._core.max_bytes:
            self._dropped.append(entry.name)
            self._core.insert(tenant, tokens, entry, entry.nbytes)  # counted as an eviction
            return
        self._core.insert(tenant, tokens, entry, entry.nbytes, supersedes_prefixes=entry.trimmable)

    def find(
        self, tenant: str, tokens: Sequence[int], limit: int, now: float
    ) -> PrefixMatch[DiskEntry] | None:
        """The entry that serves the most of ``tokens`` (at most ``limit``), expired ones
        dropped first; counts nothing (``served``, ``missed`` do)."""
        while True:
            match = self._core.peek(
                tenant, tokens, limit=limit, trimmable=lambda entry: entry.trimmable
            )
            if match is None or not self._expired(match.value, now):
                return match
            self._core.discard(tenant, match.key)
            self._counts["expired"] += 1

    def _expired(self, entry: DiskEntry, now: float) -> bool:
        return now - entry.used_at > self.ttl_seconds

    def expire(self, now: float) -> None:
        """Drop every entry unused for longer than the TTL."""
        for tenant, key, entry in self._core.items():
            if self._expired(entry, now):
                self._core.discard(tenant, key)
                self._counts["expired"] += 1

    def served(self, tenant: str, key: Tokens, reused: int, now: float) -> None:
        """The entry under ``key`` served ``reused`` tokens: a hit, and recently used."""
        found = self._core.peek(tenant, key, limit=len(key))
        if found is not None and found.key == key:
            self._core.touch(tenant, key)
            entry = found.value
            self._core.insert(
                tenant,
                key,
                DiskEntry(
                    entry.name,
                    entry.nbytes,
                    entry.trimmable,
                    entry.prompt_tokens,
                    entry.moved,
                    entry.whole_bytes,
                    now,
                ),
                entry.nbytes,
            )
        self._counts["hits"] += 1
        self._counts["tokens_reused"] += reused

    def missed(self) -> None:
        self._counts["misses"] += 1

    def bad(self, tenant: str | None = None, key: Tokens | None = None) -> None:
        """A file that could not be used (missing, truncated, corrupt, mismatched): counted,
        and dropped from the index if it was in it."""
        self._counts["skipped"] += 1
        if tenant is not None and key is not None:
            self._core.discard(tenant, key)

    def wrote(self, ok: bool) -> None:
        self._counts["writes" if ok else "write_errors"] += 1

    def clear(self) -> None:
        """Forget every entry and queue every file for deletion."""
        self._dropped += [entry.name for _, _, entry in self._core.items()]
        self._core.clear()

    @property
    def stats(self) -> DiskStats:
        core = self._core.stats
        return DiskStats(
            entries=core.entries,
            bytes=core.bytes,
            max_bytes=core.max_bytes,
            ttl_seconds=self.ttl_seconds,
            evictions=core.evictions,
            **self._counts,
        )
