"""``engine/kv_cache.py`` against mlx-lm's own single-sequence ``QuantizedKVCache``: what the
batch holds for each row, through every operation ``BatchGenerator`` applies (merge, prefill
with right padding, extend, filter, extract), is what that cache holds for the row alone; and
the batch decodes the bundled model's documented answers while sequences join and leave."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import BatchGenerator, make_stop_sequences
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH, load_bundled_prompts
from mlx_responses.engine.kv_cache import (
    BatchQuantizedKVCache,
    SequenceQuantizedCache,
    quantize_layers,
)
from mlx_responses.engine.kv_quant import KvQuant

QUANT = KvQuant(8, 32)
HEADS, DIM = 2, 32


def rows(lengths: list[int], seed: int) -> list[tuple[mx.array, mx.array]]:
    mx.random.seed(seed)
    return [
        (mx.random.normal((1, HEADS, n, DIM)), mx.random.normal((1, HEADS, n, DIM)))
        for n in lengths
    ]


def alone(keys: mx.array, values: mx.array) -> QuantizedKVCache:
    cache = QuantizedKVCache(group_size=QUANT.group_size, bits=QUANT.bits)
    cache.update_and_fetch(keys, values)
    return cache


def assert_same(batch: BatchQuantizedKVCache, index: int, expected: QuantizedKVCache) -> None:
    got = batch.extract(index)
    assert isinstance(got, SequenceQuantizedCache)
    assert got.offset == expected.offset
    for mine, theirs in zip(
        (*got.keys, *got.values), (*expected.keys, *expected.values), strict=False
    ):
        assert mx.array_equal(mine, theirs[..., : expected.offset, :])


def prefilled(data: list[tuple[mx.array, mx.array]]) -> BatchQuantizedKVCache:
    """A batch prefilled as ``PromptProcessingBatch.prompt`` does: right-padded, then rolled."""
    lengths = [k.shape[2] for k, _ in data]
    width = max(lengths)
    batch = BatchQuantizedKVCache([0] * len(data), QUANT)
    batch.prepare(lengths=lengths, right_padding=[width - n for n in lengths])

    def padded(x: mx.array) -> mx.array:
        return mx.pad(x, [(0, 0), (0, 0), (0, width - x.shape[2]), (0, 0)])

    keys = mx.concatenate([padded(k) for k, _ in data])
    values = mx.concatenate([padded(v) for _, v in data])
    batch.update_and_fetch(keys, values)
    batch.finalize()
    return batch


def test_every_batch_operation_keeps_each_row_as_it_is_alone() -> None:
    first, second = rows([5, 9, 3], seed=1), rows([300, 2], seed=2)
    batch = prefilled(first)
    for i, (k, v) in enumerate(first):
        assert_same(batch, i, alone(k, v))
    # A second prefill batch joins (extend), longer than the step the storage grows by.
    batch.extend(prefilled(second))
    everyone = [alone(k, v) for k, v in first + second]
    for i, expected in enumerate(everyone):
        assert_same(batch, i, expected)
    # One decode step for every row, then two rows leave (filter).
    step = rows([1] * 5, seed=3)
    batch.update_and_fetch(
        mx.concatenate([k for k, _ in step]), mx.concatenate([v for _, v in step])
    )
    for cache, (k, v) in zip(everyone, step, strict=True):
        cache.update_and_fetch(k, v)
    batch.filter([1, 3, 4])
    for i, kept in enumerate([1, 3, 4]):
        assert_same(batch, i, everyone[kept])
    # What the prompt cache stores merges back into a batch unchanged, trimmed or not.
    stored = [batch.extract(i) for i in range(3)]
    stored[1].trim(4)
    merged = BatchQuantizedKVCache.merge([SequenceQuantizedCache.of(c, QUANT) for c in stored])
    assert merged.size() == max(c.offset for c in stored)
    for i, c in enumerate(stored):
        assert merged.extract(i).offset == c.offset
        assert_same(merged, i, c)


def test_a_full_precision_layer_is_quantized_and_others_are_kept() -> None:
    ((keys, values),) = rows([7], seed=4)
    plain = KVCache()
    plain.update_and_fetch(keys, values)
    other = object()
    quantized, kept = quantize_layers([plain, other], None, QUANT)
    assert kept is other
    assert isinstance(quantized, SequenceQuantizedCache)
    assert quantized.offset == 7
    expected = alone(keys, values)
    for mine, theirs in zip(
        (*quantized.keys, *quantized.values), (*expected.keys, *expected.values), strict=False
    ):
        assert mx.array_equal(mine, theirs[..., :7, :])


@pytest.fixture(scope="module")
def bundled() -> tuple[object, object]:
    model, tokenizer = load(str(BUNDLED_MODEL_PATH))[:2]
    return model, tokenizer


def test_sequences_join_and_leave_a_quantized_batch_with_their_documented_answers(
    bundled: tuple[object, object],
) -> None:
    model, tokenizer = bundled
    prompts = [p for p in load_bundled_prompts() if not p.tools][:6]
    ids = [
        tokenizer.apply_chat_template(p.messages, add_generation_prompt=True)  # type: ignore[attr-defined]
        for p in prompts
    ]
    generator = BatchGenerator(model, prefill_batch_size=2, prefill_step_size=8)
    stops = make_stop_sequences(tokenizer)
    out: dict[int, list[int]] = {}

    def insert(chosen: list[int]) -> list[int]:
        uids = generator.insert(
            [ids[i] for i in chosen],
            max_tokens=[64] * len(chosen),
            caches=[quantize_layers(None, model, QUANT) for _ in chosen],
            stop_sequences=[stops] * len(chosen),
        )
        out.update({uid: [] for uid in uids})
        return uids

    try:
        uids = dict(zip(range(3), insert([0, 1, 2]), strict=True))
        finished: set[int] = set()
        steps = 0
        while steps < 400 and (steps <= 5 or not {uids[i] for i in range(5)} <= finished):
            if steps == 3:  # two more join while the first decode
                uids.update(zip([3, 4, 5], insert([3, 4, 5]), strict=True))
            if steps == 5:  # one leaves mid-way
                generator.remove([uids[5]])
                finished.add(uids[5])
            for response in generator.next()[1]:
                if response.finish_reason != "stop":
                    out[response.uid].append(response.token)
                if response.finish_reason is not None:
                    finished.add(response.uid)
            steps += 1
    finally:
        generator.close()
    for index in range(5):
        text = tokenizer.decode(out[uids[index]])  # type: ignore[attr-defined]
        assert text == prompts[index].expected, prompts[index].name
