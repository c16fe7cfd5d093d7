"""The prompt cache's MLX side: what it hands out is a trimmed copy, never the stored value."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from mlx_responses.engine.prompt_cache import PromptCache


def kv_cache(tokens: int, layers: int = 2) -> list[Any]:
    cache = []
    for layer in range(layers):
        c = KVCache()
        keys = mx.arange(tokens * 8, dtype=mx.float32).reshape(1, 2, tokens, 4) + layer
        c.update_and_fetch(keys, keys * 2)
        cache.append(c)
    return cache


def test_fetch_trims_a_copy_and_leaves_the_entry_whole() -> None:
    cache = PromptCache(1 << 20, 8)
    tokens = tuple(range(10))
    stored = kv_cache(10)
    cache.store("t", tokens, stored)
    assert cache.stats.entries == 1
    # What the arrays hold (KVCache allocates in steps of 256 tokens).
    assert cache.stats.bytes == sum(layer.nbytes for layer in stored) > 0
    prompt = (*tokens[:6], 99, 98)
    reuse = cache.fetch("t", prompt)
    got, reused = reuse.cache, reuse.tokens
    assert reused == 6
    assert got is not None
    assert [layer.offset for layer in got] == [6, 6]
    keys, _ = got[0].keys_and_values()
    assert keys.shape[2] == 6
    # The stored entry still serves all ten tokens.
    reuse = cache.fetch("t", (*tokens, 5))
    again, reused_again = reuse.cache, reuse.tokens
    assert reused_again == 10
    assert again is not None
    assert [layer.offset for layer in again] == [10, 10]


def test_the_last_prompt_token_is_never_served_from_the_cache() -> None:
    cache = PromptCache(1 << 20, 8)
    tokens = tuple(range(10))
    cache.store("t", tokens, kv_cache(10))
    reuse = cache.fetch("t", tokens)
    got, reused = reuse.cache, reuse.tokens
    assert reused == 9
    assert got is not None
    assert got[0].offset == 9


def test_a_cache_that_does_not_hold_its_key_is_not_stored() -> None:
    cache = PromptCache(1 << 20, 8)
    cache.store("t", tuple(range(9)), kv_cache(10))
    assert cache.stats.entries == 0
    assert cache.fetch("t", tuple(range(12))).cache is None


def test_disabled_cache_stores_and_serves_nothing() -> None:
    cache = PromptCache(0, 8)
    cache.store("t", tuple(range(10)), kv_cache(10))
    assert cache.fetch("t", tuple(range(12))).cache is None
    assert not cache.enabled


def test_a_grown_entry_replaces_the_one_it_was_served_from() -> None:
    cache = PromptCache(1 << 20, 8)
    first = tuple(range(10))
    cache.store("t", first, kv_cache(10), prompt_tokens=5)  # a 5-token prompt, 5 generated
    # The next turn shares 6 tokens, then goes its own way (a reply that re-tokenized).
    reuse = cache.fetch("t", (*first[:6], 50, 51, 52))
    assert reuse.parent == first
    assert reuse.tokens == 6
    cache.store("t", (*first[:6], 50, 51, 52), kv_cache(9), replaces=reuse.parent)
    assert cache.stats.entries == 1
    assert cache.fetch("t", (*first[:6], 50, 51, 52, 53)).tokens == 9


def test_another_conversation_sharing_only_a_prefix_does_not_replace_the_entry() -> None:
    cache = PromptCache(1 << 20, 8)
    first = tuple(range(10))
    cache.store("t", first, kv_cache(10), prompt_tokens=8)
    # A new conversation shares the first 3 tokens (a system prompt), not the whole prompt.
    other = (*first[:3], 70, 71, 72)
    reuse = cache.fetch("t", other)
    assert reuse.tokens == 3
    assert reuse.parent is None
    cache.store("t", other, kv_cache(6), replaces=reuse.parent)
    assert cache.stats.entries == 2
    assert cache.fetch("t", (*first, 11)).tokens == 10  # the first conversation still hits


def hybrid_cache(tokens: int) -> list[Any]:
    """A recurrent layer (no token count, cannot be trimmed) and an attention layer."""
    from mlx_lm.models.cache import ArraysCache

    recurrent = ArraysCache(1)
    recurrent[0] = mx.full((1, 2, 4), float(tokens))
    return [recurrent, *kv_cache(tokens, layers=1)]


def test_a_cache_that_cannot_be_trimmed_serves_only_exact_prefixes() -> None:
    cache = PromptCache(1 << 20, 8)
    tokens = tuple(range(10))
    cache.store("t", tokens, hybrid_cache(10))
    cache.store("t", tokens[:4], hybrid_cache(4))  # a segment checkpoint: kept, not superseded
    assert cache.stats.entries == 2
    # Diverging at token 6: the 10-token entry would need trimming; the checkpoint serves.
    reuse = cache.fetch("t", (*tokens[:6], 99, 98))
    assert reuse.tokens == 4
    assert reuse.cache is not None
    assert reuse.cache[1].offset == 4
    assert float(reuse.cache[0][0][0, 0, 0]) == 4.0
    # The same prompt again: reuse stops one token short, which would trim: the checkpoint.
    assert cache.fetch("t", tokens).tokens == 4
    # An exact prefix is served whole, as a copy.
    whole = cache.fetch("t", (*tokens, 7))
    assert whole.tokens == 10
    assert whole.cache is not None
    whole.cache[0][0] = mx.zeros((1, 2, 4))
    assert float(cache.fetch("t", (*tokens, 7)).cache[0][0][0, 0, 0]) == 10.0  # type: ignore[index]
