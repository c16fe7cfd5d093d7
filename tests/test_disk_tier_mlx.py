"""The disk tier's MLX side: every cache kind round-trips; a bad file is never served."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from mlx_responses.engine.disk_tier import DiskTier
from mlx_responses.engine.prompt_cache import PromptCache, ShardMissing

BIG = 1 << 24


def kv(tokens: int, kind: str = "plain") -> list[Any]:
    layers: list[Any] = []
    for number in range(2):
        layer: Any = KVCache() if kind != "rotating" else RotatingKVCache(max_size=64, keep=4)
        keys = mx.arange(tokens * 8, dtype=mx.float32).reshape(1, 2, tokens, 4) + number
        layer.update_and_fetch(keys, keys * 2)
        layers.append(layer)
    if kind == "hybrid":  # a recurrent layer beside the attention ones (LFM2's shape)
        state = ArraysCache(2)
        state[0], state[1] = mx.ones((1, 3)) * tokens, mx.zeros((1, 2))
        layers.append(state)
    return layers


def tier(folder: Path, budget: int = BIG, rank: int = 0, clock: Any = None) -> DiskTier:
    made = DiskTier(
        folder, budget, 3600, "model", "layout", rank, **({"clock": clock} if clock else {})
    )
    made.open()
    return made


def spill(cache: PromptCache, tenant: str, key: tuple[int, ...], layers: list[Any]) -> None:
    """Store ``key`` and push it out of a one-entry RAM tier (so it is on disk only)."""
    cache.store(tenant, key, layers)
    cache.store("other", (7, 7, 7), kv(3))


def files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.kv"))


@pytest.mark.parametrize("kind", ["plain", "rotating", "hybrid"])
def test_an_evicted_entry_comes_back_from_disk(tmp_path: Path, kind: str) -> None:
    cache = PromptCache(BIG, 1, disk=tier(tmp_path))
    layers = kv(10, kind)
    spill(cache, "a", tuple(range(10)), layers)
    assert len(files(tmp_path)) == 1
    reuse = cache.fetch("a", (*range(10), 99))
    assert reuse.tokens == 10
    assert reuse.disk_key == tuple(range(10))
    assert reuse.cache is not None
    for got, want in zip(reuse.cache, layers, strict=True):
        assert type(got) is type(want)
        for a, b in zip(got.state, want.state, strict=True):
            if isinstance(b, mx.array) and b.ndim == 4:  # keys, values: the held tokens
                held = min(a.shape[-2], b.shape[-2], 10)
                assert mx.array_equal(a[..., :held, :], b[..., :held, :])
            elif isinstance(b, mx.array):
                assert mx.array_equal(a, b)
    stats = cache.stats
    assert stats.disk is not None
    assert stats.disk.hits == 1
    assert stats.hits == 1


def test_entries_survive_a_restart(tmp_path: Path) -> None:
    cache = PromptCache(BIG, 8, disk=tier(tmp_path))
    cache.store("a", tuple(range(10)), kv(10))
    cache.flush()  # a clean shutdown
    again = PromptCache(BIG, 8, disk=tier(tmp_path))
    assert again.stats.disk is not None
    assert again.stats.disk.entries == 1
    assert again.fetch("a", (*range(10), 5)).tokens == 10


def test_another_tenant_cannot_hit_a_file(tmp_path: Path) -> None:
    cache = PromptCache(BIG, 1, disk=tier(tmp_path))
    spill(cache, "a", tuple(range(10)), kv(10))
    assert cache.fetch("b", (*range(10), 5)).tokens == 0
    # A file copied under the other tenant's name is refused: its key says tenant "a".
    (original,) = files(tmp_path)
    stolen = tmp_path / tier(tmp_path).name_of("b", tuple(range(10)))
    stolen.write_bytes(original.read_bytes())
    reopened = tier(tmp_path)
    assert reopened.stats.skipped == 1
    assert not stolen.exists()
    assert PromptCache(BIG, 8, disk=reopened).fetch("b", (*range(10), 5)).tokens == 0


@pytest.mark.parametrize("damage", ["corrupt", "truncate", "delete"])
def test_a_bad_file_is_skipped_counted_and_removed(tmp_path: Path, damage: str) -> None:
    cache = PromptCache(BIG, 1, disk=tier(tmp_path))
    spill(cache, "a", tuple(range(10)), kv(10))
    (path,) = files(tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "corrupt":
        data[-5] ^= 0xFF  # a value's byte: only the digest sees it
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[:-7]))
    else:
        path.unlink()
    reuse = cache.fetch("a", (*range(10), 5))
    assert reuse.tokens == 0
    assert reuse.cache is None
    stats = cache.stats.disk
    assert stats is not None
    assert stats.skipped == 1
    assert stats.entries == 0
    assert not path.exists()


def test_a_truncated_file_is_skipped_at_start(tmp_path: Path) -> None:
    cache = PromptCache(BIG, 8, disk=tier(tmp_path))
    cache.store("a", tuple(range(10)), kv(10))
    cache.flush()
    (path,) = files(tmp_path)
    path.write_bytes(path.read_bytes()[:-3])
    (tmp_path / "garbage.kv").write_bytes(b"not a cache")
    reopened = tier(tmp_path)
    assert reopened.stats.skipped == 2
    assert reopened.stats.entries == 0
    assert files(tmp_path) == []


def test_the_disk_budget_holds_under_churn(tmp_path: Path) -> None:
    one = tier(tmp_path / "probe")
    one.write("t", (1,) * 20, kv(20), prompt_tokens=20, moved=0, whole_bytes=1, trimmable=True)
    size = one.stats.bytes
    budget = size * 3 + size // 2  # room for three files
    cache = PromptCache(BIG, 1, disk=tier(tmp_path / "d", budget))
    for turn in range(12):
        spill(cache, "a", tuple(range(turn * 100, turn * 100 + 20)), kv(20))
        on_disk = sum(path.stat().st_size for path in files(tmp_path / "d"))
        assert on_disk <= budget
        assert cache.stats.disk is not None
        assert cache.stats.disk.bytes == on_disk
    # The most recent ones are what is left.
    assert cache.fetch("a", (*range(1100, 1120), 5)).tokens == 20


def test_an_unused_entry_expires(tmp_path: Path) -> None:
    now = [1000.0]
    cache = PromptCache(BIG, 1, disk=tier(tmp_path, clock=lambda: now[0]))
    spill(cache, "a", tuple(range(10)), kv(10))
    now[0] += 3601
    assert cache.fetch("a", (*range(10), 5)).tokens == 0
    assert cache.stats.disk is not None
    assert cache.stats.disk.expired >= 1
    assert len(files(tmp_path)) == 0


def test_a_follower_loads_what_rank_0_chose_or_stops(tmp_path: Path) -> None:
    follower = PromptCache(BIG, 1, disk=tier(tmp_path, rank=1), follower=True)
    spill(follower, "a", tuple(range(10)), kv(10))
    # Without rank 0's word a follower never serves from disk on its own.
    assert follower.fetch("a", (*range(10), 5)).tokens == 0
    forced = follower.fetch("a", (*range(10), 5), disk_key=tuple(range(10)))
    assert forced.tokens == 10
    with pytest.raises(ShardMissing):
        follower.fetch("a", (*range(30), 5), disk_key=tuple(range(20)))


def test_ranks_share_a_folder_without_touching_each_others_files(tmp_path: Path) -> None:
    zero = PromptCache(BIG, 1, disk=tier(tmp_path, rank=0))
    spill(zero, "a", tuple(range(10)), kv(10))
    one = tier(tmp_path, rank=1)
    assert one.stats.entries == 0
    assert one.stats.skipped == 0
    assert len(files(tmp_path)) == 1  # rank 0's file is left alone
