"""The prompt cache's figures: its RAM tier's and its disk tier's, as ``/health``, ``/status``
and ``/metrics`` show them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DiskStats:
    """The disk tier's figures: counters since start and the directory's size now."""

    entries: int = 0
    bytes: int = 0
    max_bytes: int = 0
    ttl_seconds: float = 0.0
    hits: int = 0
    misses: int = 0
    tokens_reused: int = 0
    writes: int = 0
    write_errors: int = 0
    skipped: int = 0
    evictions: int = 0
    expired: int = 0

    def to_json(self) -> dict[str, int | float]:
        return {
            "entries": self.entries,
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
            "ttl_seconds": self.ttl_seconds,
            "hits": self.hits,
            "misses": self.misses,
            "tokens_reused": self.tokens_reused,
            "writes": self.writes,
            "write_errors": self.write_errors,
            "skipped": self.skipped,
            "evictions": self.evictions,
            "expired": self.expired,
        }


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    """Counters since start (hits, misses, tokens_reused, evictions) and the current size."""

    hits: int = 0
    misses: int = 0
    tokens_reused: int = 0
    evictions: int = 0
    entries: int = 0
    bytes: int = 0
    max_bytes: int = 0
    max_entries: int = 0
    # The disk tier's, when the prompt cache has one (``disk_tier.py``): then ``hits``,
    # ``misses`` and ``tokens_reused`` count lookups of both tiers, the rest the RAM tier.
    disk: DiskStats | None = None

    @property
    def ram_hits(self) -> int:
        return self.hits - (self.disk.hits if self.disk is not None else 0)

    @property
    def ram_misses(self) -> int:
        """Lookups the RAM tier did not serve: the misses of both, and the disk's hits."""
        return self.misses + (self.disk.hits if self.disk is not None else 0)

    def to_json(self) -> dict[str, object]:
        return {
            "enabled": self.max_bytes > 0 and self.max_entries > 0,
            "hits": self.hits,
            "misses": self.misses,
            "tokens_reused": self.tokens_reused,
            "evictions": self.evictions,
            "entries": self.entries,
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
            "max_entries": self.max_entries,
            "ram": {
                "entries": self.entries,
                "bytes": self.bytes,
                "max_bytes": self.max_bytes,
                "hits": self.ram_hits,
                "misses": self.ram_misses,
            },
            "disk": self.disk.to_json() if self.disk is not None else None,
        }
