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
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .prefix_cache import PrefixCache, PrefixCacheStats
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


@dataclass(frozen=True, slots=True)
class Reuse:
    """What ``fetch`` found: a fresh cache holding the prompt's first ``tokens`` tokens
    (None: nothing reusable), the key of the entry it came from, and how far that entry's
    positions are moved (the caller turns them to its prompt's own: ``vision_prefill.moved``)."""

    cache: list[Any] | None = None
    tokens: int = 0
    parent: tuple[int, ...] | None = None
    moved: int = 0


MISS = Reuse()


class PromptCache:
    """KV caches keyed by ``(tenant, tokens)``; bounded by bytes and entries (0 disables)."""

    def __init__(self, max_bytes: int, max_entries: int, share: tuple[int, int] = (1, 1)) -> None:
        self._core: PrefixCache[_Stored] = PrefixCache(max_bytes, max_entries)
        # A rank holds a share of each entry; it counts the whole (its bytes times
        # ``share[0] / share[1]``), so that every rank evicts alike (distributed.py).
        self._share = share

    @property
    def enabled(self) -> bool:
        return self._core.enabled

    @property
    def stats(self) -> PrefixCacheStats:
        return self._core.stats

    def fetch(self, tenant: str, prompt: Sequence[int]) -> Reuse:
        """A cache for the longest reusable prefix of ``prompt``. Insert the sequence with
        ``reuse.cache`` and ``prompt[reuse.tokens:]`` as its prompt."""
        if not self._core.enabled or len(prompt) < 2:
            return MISS
        try:
            return self._fetch(tenant, prompt)
        except Exception:
            log.exception("prompt cache: lookup failed; prefilling the whole prompt")
            return MISS

    def _fetch(self, tenant: str, prompt: Sequence[int]) -> Reuse:
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        match = self._core.lookup(
            tenant,
            _unmoved(prompt),
            limit=len(prompt) - 1,
            trimmable=lambda stored: bool(can_trim_prompt_cache(stored.layers)),
        )
        if match is None:
            return MISS
        cache = [_copy_layer(layer) for layer in match.value.layers]
        if match.trim:
            trim_prompt_cache(cache, match.trim)
        grown = match.reused >= match.value.prompt_tokens
        return Reuse(cache, match.reused, match.key if grown else None, match.value.moved)

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
        self._core.insert(
            tenant,
            _unmoved(tokens),
            _Stored(layers, prompt_tokens, moved_of(tokens[0])),
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

    def clear(self) -> None:
        self._core.clear()
