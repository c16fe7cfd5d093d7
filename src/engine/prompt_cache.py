"""The generation thread's prompt cache: KV caches of earlier sequences, reused by new ones.

Called only on the generation thread (MLX arrays belong to it). The lookup logic is the pure
``PrefixCache``; this module adds what needs MLX: copying a stored cache so the batch never
writes into it, trimming it to the shared prefix, evaluating what is stored so it holds its
own buffers, and measuring it.

Invariants:
- A stored value is never handed to ``BatchGenerator`` itself: ``fetch`` returns fresh layer
  objects (sharing the immutable key/value arrays of a plain ``KVCache`` or a quantized
  ``kv_cache.SequenceQuantizedCache``, which the batch only reads when it merges caches; a
  deep copy for any other cache type).
- ``fetch`` reuses at most ``len(prompt) - 1`` tokens: the last prompt token is always run
  through the model, so the first generated token comes from fresh logits, as on a cold start.
- An entry's key is exactly the tokens its KV cache holds (checked on store, against every
  layer that counts its tokens: a recurrent layer's state does not), but for an M-RoPE image
  prompt's first id, keyed without its move (``vision.shift_tag``): the move is stored beside
  the entry and handed back in ``Reuse.moved``, and the caller turns the reused keys to its
  own prompt's move before using them (``vision_prefill.moved``).
- A cache that cannot be trimmed (``can_trim_prompt_cache`` false: recurrent or hybrid layers,
  a rotating cache past its window) is never trimmed: it serves only a prompt it is an exact
  prefix of (``PrefixCache.lookup``'s ``trimmable``). For such models ``needs_checkpoints`` is
  true and the generation thread also stores checkpoints at the segment boundaries that survive
  re-rendering (``segments.py``; ``checkpoint``'s ``at``), so a rewritten history still finds an
  exact prefix.
- ``Reuse.parent`` (the entry a new sequence may replace once it is stored) is set only when
  the new prompt reuses all of that entry's *prompt*, diverging at most in its generated tail
  (a replayed reply that re-tokenized): another conversation that shares only a system prompt
  with an entry never replaces it.
- Best effort: an exception while fetching is a miss, while storing a lost entry (both
  logged); neither ever fails the sequence it happened for.
- With a disk tier (``disk_tier.py``): an entry the RAM tier evicts, or one too large for it,
  is written to disk, and every entry still in RAM is written at a clean shutdown (``flush``).
  ``fetch`` serves from disk when the disk holds a longer reusable prefix than RAM: the file
  is loaded, verified, put back in RAM and served like a RAM entry (copied, trimmed). On a
  sharded model only rank 0 decides that (``Reuse.disk_key`` travels in the ``Admit``); a
  follower loads its shard of the same key and raises ``ShardMissing`` if it cannot, since
  the ranks must never diverge.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from .cache_stats import PrefixCacheStats
from .disk_tier import DiskTier
from .prefix_cache import PrefixCache, PrefixMatch, Tokens
from .vision import moved_of, untag

log = logging.getLogger(__name__)

# Without a --prompt-cache-bytes, the cache may hold this fraction of the machine's memory.
DEFAULT_MEMORY_FRACTION = 0.125
DEFAULT_MAX_ENTRIES = 64


def default_max_bytes() -> int:
    """A fraction of physical memory (unified memory on a Mac); 1 GiB if it cannot be read."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 8 << 30
    return int(total * DEFAULT_MEMORY_FRACTION)


def _copy_layer(layer: Any) -> Any:
    from mlx_lm.models.cache import KVCache

    from .kv_cache import SequenceQuantizedCache

    if type(layer) is KVCache:
        fresh = KVCache()
        fresh.keys, fresh.values, fresh.offset = layer.keys, layer.values, layer.offset
        return fresh
    if type(layer) is SequenceQuantizedCache:  # --kv-bits: read only by the batch's merge
        return SequenceQuantizedCache.of(layer, layer.quant)
    return copy.deepcopy(layer)


def _held(cache: Sequence[Any]) -> set[int]:
    """The token counts the layers that count their tokens report (their ``offset``: a plain
    or rotating KV cache's; a recurrent layer's state has none)."""
    return {int(layer.offset) for layer in cache if isinstance(getattr(layer, "offset", None), int)}


def _unmoved(tokens: Sequence[int]) -> tuple[int, ...]:
    """The key of ``tokens``: an M-RoPE image prompt's first id without its move, so prompts
    moved differently share their common prefix (the move is kept beside the entry)."""
    return (untag(tokens[0]), *tokens[1:]) if tokens and tokens[0] < 0 else tuple(tokens)


def needs_checkpoints(model: Any) -> bool:
    """Whether ``model``'s cache can ever refuse trimming (a recurrent or hybrid model, or a
    rotating window): then only exact prefixes are reused and segment checkpoints pay."""
    from mlx_lm.models.cache import RotatingKVCache, can_trim_prompt_cache, make_prompt_cache

    cache = make_prompt_cache(model)
    return not can_trim_prompt_cache(cache) or any(
        isinstance(layer, RotatingKVCache) for layer in cache
    )


@dataclass(frozen=True, slots=True)
class _Stored:
    """A stored KV cache, how many of its tokens were its sequence's prompt, and how far its
    positions are moved (an M-RoPE image prompt's, ``vision.shift_tag``; 0 for the rest)."""

    layers: list[Any]
    prompt_tokens: int
    moved: int = 0
    nbytes: int = 0  # as counted (a sharded rank counts the whole entry)


@dataclass(frozen=True, slots=True)
class Reuse:
    """What ``fetch`` found: a fresh cache holding the prompt's first ``tokens`` tokens
    (None: nothing reusable), the key of the entry it came from, and how far that entry's
    positions are moved (the caller turns them to its prompt's own: ``vision_prefill.moved``)."""

    cache: list[Any] | None = None
    tokens: int = 0
    parent: tuple[int, ...] | None = None
    moved: int = 0
    disk_key: tuple[int, ...] | None = None  # the disk entry it was loaded from


MISS = Reuse()


class ShardMissing(RuntimeError):
    """A sharded follower could not load its shard of the disk entry rank 0 chose."""


class PromptCache:
    """KV caches keyed by ``(tenant, tokens)``; bounded by bytes and entries (0 disables)."""

    def __init__(
        self,
        max_bytes: int,
        max_entries: int,
        share: tuple[int, int] = (1, 1),
        disk: DiskTier | None = None,
        follower: bool = False,
    ) -> None:
        self._core: PrefixCache[_Stored] = PrefixCache(
            max_bytes, max_entries, on_remove=self._left_ram
        )
        # A rank holds a share of each entry; it counts the whole (its bytes times
        # ``share[0] / share[1]``), so that every rank evicts alike (distributed.py).
        self._share = share
        self._disk = disk if self._core.enabled else None
        self._follower = follower  # a sharded follower: rank 0 decides disk hits

    @property
    def enabled(self) -> bool:
        return self._core.enabled

    @property
    def disk(self) -> DiskTier | None:
        return self._disk

    @property
    def share(self) -> tuple[int, int]:
        return self._share

    def with_disk(self, disk: DiskTier) -> PromptCache:
        """A fresh cache of the same bounds over ``disk`` (made at load, before any entry)."""
        core = self._core
        return PromptCache(core.max_bytes, core.max_entries, self._share, disk, self._follower)

    @property
    def stats(self) -> PrefixCacheStats:
        if self._disk is None:
            return self._core.stats
        return replace(self._core.stats, disk=self._disk.stats)

    def fetch(
        self, tenant: str, prompt: Sequence[int], disk_key: tuple[int, ...] | None = None
    ) -> Reuse:
        """A cache for the longest reusable prefix of ``prompt``. Insert the sequence with
        ``reuse.cache`` and ``prompt[reuse.tokens:]`` as its prompt. ``disk_key``: the disk
        entry rank 0 served this prompt from (a sharded follower loads the same)."""
        if not self._core.enabled or len(prompt) < 2:
            return MISS
        try:
            return self._fetch(tenant, prompt, disk_key)
        except ShardMissing:
            raise
        except Exception:
            log.exception("prompt cache: lookup failed; prefilling the whole prompt")
            return MISS

    def _fetch(self, tenant: str, prompt: Sequence[int], disk_key: Tokens | None) -> Reuse:
        from mlx_lm.models.cache import can_trim_prompt_cache

        key, limit = _unmoved(prompt), len(prompt) - 1
        if self._disk is not None and (disk_key is not None or not self._follower):
            ram = self._core.peek(
                tenant,
                key,
                limit=limit,
                trimmable=lambda stored: bool(can_trim_prompt_cache(stored.layers)),
            )
            served = self._from_disk(tenant, key, limit, ram.reused if ram else 0, disk_key)
            if served is not None:
                return served
        match = self._core.lookup(
            tenant,
            key,
            limit=limit,
            trimmable=lambda stored: bool(can_trim_prompt_cache(stored.layers)),
        )
        if match is None:
            if self._disk is not None:
                self._disk.missed()
            return MISS
        return _served(match)

    def _from_disk(
        self, tenant: str, key: Tokens, limit: int, in_ram: int, forced: Tokens | None
    ) -> Reuse | None:
        """The reuse a disk entry gives when it beats RAM's ``in_ram`` tokens (else None):
        loaded, verified, put back in RAM. A bad file is dropped and the next best tried."""
        disk = self._disk
        assert disk is not None
        for _ in range(3):  # each failure drops a file; a few at most per lookup
            if forced is not None:
                found = disk.entry(tenant, forced)
                found = found and PrefixMatch(found.key, found.value, min(len(forced), limit))
            else:
                found = disk.find(tenant, key, limit)
            if found is None or (forced is None and found.reused <= in_ram):
                break
            layers = disk.load(tenant, found)
            if layers is None:
                continue
            entry = found.value
            stored = _Stored(layers, entry.prompt_tokens, entry.moved, entry.whole_bytes)
            self._core.insert(
                tenant, found.key, stored, entry.whole_bytes, supersedes_prefixes=entry.trimmable
            )
            self._core.record(found.reused)
            served = _served(PrefixMatch(found.key, stored, found.reused))
            return replace(served, disk_key=found.key)
        if forced is not None:
            raise ShardMissing(f"this rank has no usable shard of a {len(forced)}-token entry")
        return None

    def _left_ram(self, tenant: str, key: Tokens, stored: _Stored, evicted: bool) -> None:
        """An entry leaves RAM: one evicted is kept on disk (a redundant one is not)."""
        if evicted:
            self._spill(tenant, key, stored)

    def _spill(self, tenant: str, key: Tokens, stored: _Stored) -> None:
        from mlx_lm.models.cache import can_trim_prompt_cache

        if self._disk is None or (tenant, key) in self._disk:
            return
        self._disk.write(
            tenant,
            key,
            stored.layers,
            prompt_tokens=stored.prompt_tokens,
            moved=stored.moved,
            whole_bytes=stored.nbytes,
            trimmable=bool(can_trim_prompt_cache(stored.layers)),
        )

    def flush(self) -> None:
        """Write every RAM entry not yet on disk (a clean shutdown), oldest first so the
        disk budget keeps the most recent."""
        if self._disk is None:
            return
        for tenant, key, stored in self._core.items():
            try:
                self._spill(tenant, key, stored)
            except Exception:
                log.exception("prompt cache: could not write an entry at shutdown")

    def store(
        self,
        tenant: str,
        tokens: Sequence[int],
        cache: Sequence[Any] | None,
        replaces: tuple[int, ...] | None = None,
        partition: str | None = None,
        prompt_tokens: int | None = None,
    ) -> None:
        """Keep ``cache``, which holds exactly ``tokens``, for later prompts of ``tenant``;
        ``replaces``: the entry the sequence was served from (``Reuse.parent``), dropped when
        this one can stand in for it (``PrefixCache.insert``); ``partition``: the request's
        ``prompt_cache_key``, whose latest entry eviction spares while it can; ``prompt_tokens``:
        how many of ``tokens`` were the prompt (the rest was generated; default: all)."""
        if not self._core.enabled or cache is None or not tokens:
            return
        try:
            prompt = len(tokens) if prompt_tokens is None else min(prompt_tokens, len(tokens))
            self._store(tenant, tokens, cache, replaces, partition, prompt)
        except Exception:
            log.exception("prompt cache: could not store an entry")

    def _store(
        self,
        tenant: str,
        tokens: Sequence[int],
        cache: Sequence[Any],
        replaces: tuple[int, ...] | None,
        partition: str | None,
        prompt_tokens: int,
    ) -> None:
        held = _held(cache)
        if held and held != {len(tokens)}:
            log.debug("prompt cache: a cache of %s tokens for %d tokens", held, len(tokens))
            return
        import mlx.core as mx
        from mlx_lm.models.cache import can_trim_prompt_cache

        layers = list(cache)
        # Materialise now: a lazy slice would keep the whole batch's buffers alive.
        mx.eval([layer.state for layer in layers])
        nbytes = sum(int(layer.nbytes) for layer in layers) * self._share[0] // self._share[1]
        stored = _Stored(layers, prompt_tokens, moved_of(tokens[0]), nbytes)
        if nbytes > self._core.max_bytes:  # too large for RAM: straight to disk, if any
            self._spill(tenant, _unmoved(tokens), stored)
        self._core.insert(
            tenant,
            _unmoved(tokens),
            stored,
            nbytes,
            supersedes_prefixes=can_trim_prompt_cache(layers),
            replaces=replaces,
            partition=partition,
        )

    def checkpoint(
        self,
        tenant: str,
        generator: Any,
        uid: int,
        replaces: tuple[int, ...] | None = None,
        partition: str | None = None,
        prompt_tokens: int | None = None,
        at: frozenset[int] | None = None,
    ) -> None:
        """Store what ``uid`` holds now in ``generator`` (its whole prompt, at its end; with
        ``at``, only if it holds one of these token counts: a segment checkpoint)."""
        if not self._core.enabled:
            return
        try:
            found = generator.extract_cache([uid]).get(uid)
        except Exception:
            log.exception("prompt cache: could not extract a checkpoint")
            return
        if found is not None:
            cache, tokens = found
            if at is not None and len(tokens) not in at:
                return
            self.store(tenant, tuple(tokens), cache, replaces, partition, prompt_tokens)

    def clear(self, disk: bool = False) -> None:
        """Drop every RAM entry (its MLX arrays are freed on this thread); ``disk``: delete
        the disk tier's files too."""
        self._core.clear()
        if disk and self._disk is not None:
            self._disk.clear()


def _served(match: PrefixMatch[_Stored]) -> Reuse:
    """A fresh cache of ``match``'s first ``reused`` tokens (copied, trimmed)."""
    from mlx_lm.models.cache import trim_prompt_cache

    cache = [_copy_layer(layer) for layer in match.value.layers]
    if match.trim:
        trim_prompt_cache(cache, match.trim)
    grown = match.reused >= match.value.prompt_tokens
    return Reuse(cache, match.reused, match.key if grown else None, match.value.moved)
