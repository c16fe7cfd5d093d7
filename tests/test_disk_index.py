"""The disk tier's pure part: file names, the token encoding, and the index's budget."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_responses.engine.disk_index import (
    DiskEntry,
    DiskIndex,
    decode_tokens,
    encode_tokens,
    entry_name,
)

tokens = st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=12).map(tuple)
tenants = st.sampled_from(["", "a", "b"])


@given(tokens)
def test_tokens_round_trip(run: tuple[int, ...]) -> None:
    assert decode_tokens(encode_tokens(run)) == run


@given(tenants, tenants, tokens, tokens, st.integers(0, 3), st.integers(0, 3))
def test_a_name_is_its_key(
    ta: str, tb: str, a: tuple[int, ...], b: tuple[int, ...], ra: int, rb: int
) -> None:
    same = (ta, a, ra) == (tb, b, rb)
    assert (entry_name(ta, "m", "l", ra, a) == entry_name(tb, "m", "l", rb, b)) == same


def test_the_fingerprints_are_part_of_the_name() -> None:
    base = entry_name("t", "m", "l", 0, (1, 2))
    assert base != entry_name("t", "m2", "l", 0, (1, 2))
    assert base != entry_name("t", "m", "l2", 0, (1, 2))
    # Length-prefixed parts: moving a character from one part to the next is another name.
    assert entry_name("ab", "c", "l", 0, (1,)) != entry_name("a", "bc", "l", 0, (1,))


def entry(name: str, nbytes: int, used_at: float = 0.0, trimmable: bool = True) -> DiskEntry:
    return DiskEntry(name, nbytes, trimmable, 1, 0, nbytes, used_at)


def test_a_tenant_never_finds_another_tenants_file() -> None:
    index = DiskIndex(1000, 60)
    index.add("a", (1, 2, 3), entry("x", 10))
    assert index.find("b", (1, 2, 3, 4), 3, now=0) is None
    found = index.find("a", (1, 2, 3, 4), 3, now=0)
    assert found is not None
    assert found.value.name == "x"


def test_an_expired_entry_is_never_found_and_its_file_goes() -> None:
    index = DiskIndex(1000, 60)
    index.add("a", (1, 2, 3), entry("x", 10, used_at=0))
    assert index.find("a", (1, 2, 3, 4), 3, now=61) is None
    assert index.take_dropped() == ["x"]
    assert index.stats.expired == 1
    assert index.stats.entries == 0


def test_a_longer_trimmable_entry_supersedes_its_prefixes_files() -> None:
    index = DiskIndex(1000, 60)
    index.add("a", (1, 2), entry("short", 10))
    index.add("a", (1, 2, 3), entry("long", 10))
    assert index.take_dropped() == ["short"]
    index.add("a", (1, 2, 3, 4), entry("exact", 10, trimmable=False))
    assert index.take_dropped() == []  # an untrimmable entry supersedes nothing


operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), tenants, tokens, st.integers(1, 400), st.booleans()),
        st.tuples(st.just("find"), tenants, tokens, st.integers(0, 12), st.booleans()),
        st.tuples(st.just("bad"), tenants, tokens, st.integers(0, 0), st.booleans()),
        st.tuples(st.just("expire"), tenants, tokens, st.integers(0, 200), st.booleans()),
    ),
    max_size=60,
)


@settings(max_examples=200)
@given(operations)
def test_the_budget_holds_and_every_file_is_indexed_or_dropped(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    index = DiskIndex(1000, 100)
    written: dict[str, int] = {}  # files that exist: name -> size
    clock = 0.0
    for number, (kind, tenant, key, amount, flag) in enumerate(ops):
        clock += 1
        if kind == "add":
            name = f"{tenant}:{key}"
            written[name] = amount
            index.add(tenant, key, entry(name, amount, clock, trimmable=flag))
        elif kind == "find":
            found = index.find(tenant, key, amount, clock)
            if found is not None:
                assert found.reused <= amount
                assert found.value.name.startswith(f"{tenant}:")
                if flag:
                    index.served(tenant, found.key, found.reused, clock)
        elif kind == "bad":
            index.bad(tenant, key)
        else:
            clock += amount
            index.expire(clock)
        for name in index.take_dropped():
            written.pop(name, None)
        stats = index.stats
        assert stats.bytes <= 1000, number
        indexed = {e.name for _, _, e in index.entries()}
        # Every file written is indexed, or was handed back for deletion (exactly once).
        assert indexed == set(written)
        assert stats.bytes == sum(e.nbytes for _, _, e in index.entries())
        assert all(clock - e.used_at <= 100 or kind != "expire" for _, _, e in index.entries())
