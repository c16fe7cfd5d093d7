"""The prefix cache's pure core against a naive model (a dict of keys and an LRU list)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mlx_responses.engine.prefix_cache import PrefixCache, common_length

# A tiny alphabet makes shared prefixes, splits and merges frequent.
tokens_st = st.lists(st.integers(0, 3), min_size=0, max_size=12).map(tuple)
tenant_st = st.sampled_from(["", "alice", "bob"])


@given(st.lists(st.integers(0, 2), max_size=20), st.lists(st.integers(0, 2), max_size=20))
def test_common_length_is_the_shared_prefix(a: list[int], b: list[int]) -> None:
    n = common_length(a, b)
    assert a[:n] == b[:n]
    assert n == min(len(a), len(b)) or a[n] != b[n]


@dataclass
class Model:
    max_bytes: int
    max_entries: int
    lru: OrderedDict[tuple[str, tuple[int, ...]], tuple[str, int]] = field(
        default_factory=OrderedDict
    )
    evictions: int = 0
    # (tenant, key) -> the entry's partition (its prompt_cache_key), for partitioned entries.
    partitions: dict[tuple[str, tuple[int, ...]], str] = field(default_factory=dict)

    def evict_one(self) -> None:
        """The oldest entry that is not the last of its partition (of its tenant), else the
        oldest."""
        victim = next(iter(self.lru))
        for owner, key in self.lru:
            part = self.partitions.get((owner, key))
            same = [k for k in self.lru if k[0] == owner and self.partitions.get(k) == part]
            if part is None or len(same) > 1:
                victim = (owner, key)
                break
        self.drop(victim)
        self.evictions += 1

    def drop(self, entry: tuple[str, tuple[int, ...]]) -> None:
        self.lru.pop(entry, None)
        self.partitions.pop(entry, None)

    @property
    def nbytes(self) -> int:
        return sum(size for _, size in self.lru.values())

    def insert(
        self,
        tenant: str,
        key: tuple[int, ...],
        value: str,
        size: int,
        sup: bool,
        replaces: tuple[int, ...] | None = None,
        partition: str | None = None,
    ) -> None:
        if not key:
            return
        if size > self.max_bytes:
            self.evictions += 1
            return
        self.lru[(tenant, key)] = (value, size)
        self.lru.move_to_end((tenant, key))
        self.partitions.pop((tenant, key), None)
        if partition is not None:
            self.partitions[(tenant, key)] = partition
        if sup and replaces is not None and replaces != key:
            self.drop((tenant, replaces))
        if sup:
            for owner, other in list(self.lru):
                if owner == tenant and len(other) < len(key) and key[: len(other)] == other:
                    self.drop((owner, other))
        while len(self.lru) > self.max_entries or self.nbytes > self.max_bytes:
            self.evict_one()

    def best_reuse(self, tenant: str, tokens: tuple[int, ...], limit: int, trim_ok: bool) -> int:
        best = 0
        for (owner, key), _ in self.lru.items():
            if owner != tenant:
                continue
            shared = common_length(key, tokens)
            if shared == len(key) and len(key) <= limit:
                best = max(best, len(key))
            elif trim_ok:
                best = max(best, min(shared, limit))
        return best


class PrefixCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cache: PrefixCache[str] | None = None
        self.model: Model | None = None
        self.lookups = 0
        self.counter = 0

    @precondition(lambda self: self.cache is None)
    @rule(max_bytes=st.integers(0, 60), max_entries=st.integers(0, 6))
    def start(self, max_bytes: int, max_entries: int) -> None:
        self.cache = PrefixCache(max_bytes, max_entries)
        self.model = Model(max_bytes, max_entries)

    @precondition(lambda self: self.cache is not None)
    @rule(
        tenant=tenant_st,
        key=tokens_st,
        size=st.integers(0, 25),
        sup=st.booleans(),
        replaces=st.none() | tokens_st,
        partition=st.sampled_from([None, None, "a", "b"]),
    )
    def insert(
        self,
        tenant: str,
        key: tuple[int, ...],
        size: int,
        sup: bool,
        replaces: tuple[int, ...] | None,
        partition: str | None = None,
    ) -> None:
        assert self.cache is not None
        assert self.model is not None
        self.counter += 1
        value = f"v{self.counter}:{tenant}:{key}"
        self.cache.insert(
            tenant,
            key,
            value,
            size,
            supersedes_prefixes=sup,
            replaces=replaces,
            partition=partition,
        )
        if self.cache.enabled:
            self.model.insert(tenant, key, value, size, sup, replaces, partition)

    @precondition(lambda self: self.model is not None and bool(self.model.lru))
    @rule(data=st.data(), extra=tokens_st, size=st.integers(0, 25))
    def grow_from_an_entry(self, data: st.DataObject, extra: tuple[int, ...], size: int) -> None:
        """A conversation's next turn: a key sharing part of an entry's, replacing it."""
        assert self.model is not None
        tenant, parent = data.draw(st.sampled_from(sorted(self.model.lru)))
        keep = data.draw(st.integers(0, len(parent)))
        partition = self.model.partitions.get((tenant, parent))
        self.insert(tenant, parent[:keep] + extra, size, True, parent, partition)

    @precondition(lambda self: self.cache is not None)
    @rule(
        tenant=tenant_st,
        tokens=tokens_st,
        slack=st.integers(0, 3),
        trim_ok=st.booleans(),
    )
    def lookup(self, tenant: str, tokens: tuple[int, ...], slack: int, trim_ok: bool) -> None:
        assert self.cache is not None
        assert self.model is not None
        limit = max(0, len(tokens) - slack)
        match = self.cache.lookup(tenant, tokens, limit=limit, trimmable=lambda _: trim_ok)
        self.lookups += 1
        best = self.model.best_reuse(tenant, tokens, limit, trim_ok)
        if match is None:
            assert best == 0
            return
        # The value is the one stored under the reported key, of this very tenant.
        assert (tenant, match.key) in self.model.lru
        assert self.model.lru[(tenant, match.key)][0] == match.value
        # It really shares what it claims, reuses the most possible, within the limit.
        assert match.reused == best > 0
        assert match.reused <= limit
        assert common_length(match.key, tokens) >= match.reused
        assert match.trim == len(match.key) - match.reused
        if not trim_ok:
            assert match.trim == 0
        self.model.lru.move_to_end((tenant, match.key))

    @precondition(lambda self: self.cache is not None)
    @rule(budget=st.integers(0, 60))
    def trim_to(self, budget: int) -> None:
        assert self.cache is not None
        assert self.model is not None
        self.cache.trim_to(budget)
        while self.model.lru and self.model.nbytes > budget:
            self.model.evict_one()

    @invariant()
    def agrees_with_the_model(self) -> None:
        if self.cache is None or self.model is None:
            return
        stats = self.cache.stats
        assert len(self.cache) == len(self.model.lru) == stats.entries
        assert self.cache.nbytes == self.model.nbytes == stats.bytes
        assert stats.bytes <= max(self.cache.max_bytes, 0)
        assert stats.entries <= self.cache.max_entries
        assert stats.evictions == self.model.evictions
        assert stats.hits + stats.misses == self.lookups
        for tenant in ("", "alice", "bob"):
            expected = [key for owner, key in self.model.lru if owner == tenant]
            assert self.cache.keys(tenant) == expected


PrefixCacheMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40)
test_prefix_cache_agrees_with_a_naive_lru = PrefixCacheMachine.TestCase


def test_exact_longer_and_shorter_entries() -> None:
    cache: PrefixCache[str] = PrefixCache(1000, 10)
    cache.insert("t", (1, 2, 3, 4, 5), "long", 5)
    cache.insert("t", (1, 2), "short", 2)
    # The longer entry shares four tokens: trimmed by one it serves them.
    match = cache.lookup("t", (1, 2, 3, 4, 9))
    assert match is not None
    assert (match.value, match.reused, match.trim) == ("long", 4, 1)
    # An exact entry is capped by the limit (the last prompt token must be prefilled).
    match = cache.lookup("t", (1, 2, 3, 4, 5), limit=4)
    assert match is not None
    assert (match.value, match.reused, match.trim) == ("long", 4, 1)
    # Untrimmable values only serve as prefixes.
    match = cache.lookup("t", (1, 2, 3, 9), trimmable=lambda _: False)
    assert match is not None
    assert (match.value, match.reused) == ("short", 2)
    assert cache.lookup("u", (1, 2, 3)) is None
    assert cache.stats.hits == 3
    assert cache.stats.misses == 1
    assert cache.stats.tokens_reused == 10


def test_a_tenant_never_finds_another_tenants_entry() -> None:
    cache: PrefixCache[str] = PrefixCache(1000, 10)
    cache.insert("alice", (7, 7, 7, 7), "a", 4)
    assert cache.lookup("bob", (7, 7, 7, 7, 1)) is None
    assert cache.lookup("", (7, 7, 7, 7, 1)) is None
    match = cache.lookup("alice", (7, 7, 7, 7, 1))
    assert match is not None
    assert match.value == "a"


def test_superseded_prefixes_are_dropped_and_lru_evicts_oldest() -> None:
    cache: PrefixCache[str] = PrefixCache(10, 2)
    cache.insert("t", (1, 2), "prompt", 2)
    cache.insert("t", (1, 2, 3, 4), "finished", 4, supersedes_prefixes=True)
    assert cache.keys("t") == [(1, 2, 3, 4)]
    cache.insert("t", (5,), "x", 1)
    cache.lookup("t", (1, 2, 3, 4, 5))  # makes "finished" the most recent
    cache.insert("t", (6,), "y", 1)
    assert cache.keys("t") == [(1, 2, 3, 4), (6,)]
    cache.insert("t", (8,), "too big", 11)
    assert cache.keys("t") == [(1, 2, 3, 4), (6,)]
    assert cache.stats.evictions == 2


@pytest.mark.parametrize(("max_bytes", "max_entries"), [(0, 10), (100, 0)])
def test_a_zero_bound_disables_the_cache(max_bytes: int, max_entries: int) -> None:
    cache: PrefixCache[str] = PrefixCache(max_bytes, max_entries)
    cache.insert("t", (1, 2, 3), "v", 1)
    assert len(cache) == 0
    assert cache.lookup("t", (1, 2, 3, 4)) is None
    assert not cache.stats.to_json()["enabled"]


def test_a_busy_key_does_not_evict_another_keys_latest_entry() -> None:
    """Room for 3 entries: key "a" stores 4 conversations, key "b" one (first). Plain LRU
    would drop b's; partitioned, a's oldest go instead and each key keeps its latest."""
    cache: PrefixCache[str] = PrefixCache(max_bytes=30, max_entries=10)
    cache.insert("t", (9, 9), "b1", 10, partition="b")
    for i in range(4):
        cache.insert("t", (i, i), f"a{i}", 10, partition="a")
    assert cache.keys("t") == [(9, 9), (2, 2), (3, 3)]
    found = cache.lookup("t", (9, 9, 5))
    assert found is not None
    assert found.value == "b1"
    # Without keys the same traffic is plain LRU: the first entry is gone.
    plain: PrefixCache[str] = PrefixCache(max_bytes=30, max_entries=10)
    plain.insert("t", (9, 9), "b1", 10)
    for i in range(4):
        plain.insert("t", (i, i), f"a{i}", 10)
    assert plain.lookup("t", (9, 9, 5)) is None
    # Partitions are per tenant: another tenant's key "b" is its own partition, and a's
    # older entry is what makes room for it.
    cache.insert("u", (9, 9), "u", 10, partition="b")
    assert cache.keys("t") == [(3, 3), (9, 9)]  # (9, 9) was used last
    assert cache.keys("u") == [(9, 9)]
    found = cache.lookup("u", (9, 9, 5))
    assert found is not None
    assert found.value == "u"


def test_when_every_entry_is_some_keys_latest_lru_applies() -> None:
    cache: PrefixCache[str] = PrefixCache(max_bytes=20, max_entries=10)
    cache.insert("t", (1,), "x", 10, partition="x")
    cache.insert("t", (2,), "y", 10, partition="y")
    cache.insert("t", (3,), "z", 10, partition="z")
    assert cache.keys("t") == [(2,), (3,)]
    assert cache.stats.evictions == 1
