"""A quantized KV cache for the running batch and the prompt cache (``--kv-bits``,
``kv_quant.KvQuant``).

mlx-lm quantizes a single sequence's cache (``QuantizedKVCache``) but has no batched one:
``BatchGenerator`` merges per-sequence caches through their class's ``merge``, and
``QuantizedKVCache`` has none. ``BatchQuantizedKVCache`` is ``BatchKVCache`` with its keys and
values stored as ``mx.quantize`` triples (packed words, scales, biases); ``SequenceQuantizedCache``
is the per-sequence ``QuantizedKVCache`` it extracts and merges from, which the prompt cache keeps.

Invariants:
- Only plain attention layers (``KVCache``) are quantized. A rotating (sliding-window) layer,
  a recurrent ``ArraysCache`` or any other kind stays as the model made it, at full precision.
- Left padding, ``offset`` and ``_idx`` mean what they mean in ``BatchKVCache``: row ``i`` holds
  its tokens at ``[left_padding[i], _idx)``; ``offset[i]`` is its position. Padding slots hold
  zeros, or a right-padded prefill's filler rolled to the left (``finalize``); the mask
  (``make_mask``, as ``BatchKVCache``'s) hides them from attention either way.
- Keys and values are quantized once, as they are written (each prefill chunk, each decode
  step); nothing is ever dequantized into the cache. ``update_and_fetch`` returns the triples
  and the cache carries ``bits`` and ``group_size``, so mlx-lm's attention
  (``models.base.scaled_dot_product_attention``) takes its quantized path.
- A stored entry's arrays are only read: ``merge`` copies them into the batch's own buffers,
  so the prompt cache may hand the same arrays to several sequences.
- ``quantize_layers`` accepts what the prompt cache or a prefill hands over: a full-precision
  ``KVCache`` (quantized then), a ``QuantizedKVCache`` of the same bits and group size, or a
  layer of another kind (kept).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import (
    KVCache,
    QuantizedKVCache,
    _BaseCache,
    dynamic_roll,
    make_prompt_cache,
)

from .kv_quant import KvQuant, KvQuantUnsupported

__all__ = ["BatchQuantizedKVCache", "SequenceQuantizedCache", "check_model", "quantize_layers"]

Triple = tuple[mx.array, mx.array, mx.array]


def _quantize(x: mx.array, quant: KvQuant) -> Triple:
    w, s, b = mx.quantize(x, group_size=quant.group_size, bits=quant.bits)
    return w, s, b


def _slots(triple: Triple, length: int, rows: int | None = None) -> list[mx.array]:
    """Zero arrays shaped like ``triple``'s parts with ``length`` token slots (and ``rows``
    rows, when given)."""
    return [
        mx.zeros(
            (part.shape[0] if rows is None else rows, part.shape[1], length, part.shape[3]),
            part.dtype,
        )
        for part in triple
    ]


def _take(triple: Triple, index: Any) -> Triple:
    w, s, b = (part[index] for part in triple)
    return w, s, b


class SequenceQuantizedCache(QuantizedKVCache):  # type: ignore[misc]
    """One sequence's quantized layer: what the batch extracts and the prompt cache keeps."""

    def size(self) -> int:
        return int(self.offset)

    @property
    def quant(self) -> KvQuant:
        return KvQuant(self.bits, self.group_size)

    @classmethod
    def merge(cls, caches: list[Any]) -> BatchQuantizedKVCache:
        return BatchQuantizedKVCache.merge(caches)

    @classmethod
    def of(cls, layer: Any, quant: KvQuant) -> SequenceQuantizedCache:
        """``layer`` (a ``KVCache`` or ``QuantizedKVCache``) as this class, holding its first
        ``offset`` tokens."""
        fresh = cls(group_size=quant.group_size, bits=quant.bits)
        fresh.offset = int(layer.offset)
        if layer.keys is None or fresh.offset == 0:
            fresh.offset = 0
            return fresh
        if isinstance(layer, QuantizedKVCache):
            if (layer.bits, layer.group_size) != (quant.bits, quant.group_size):
                raise ValueError("a quantized layer of other bits or group size")
            fresh.keys, fresh.values = layer.keys, layer.values
        else:
            n = fresh.offset
            fresh.keys = _quantize(layer.keys[..., :n, :], quant)
            fresh.values = _quantize(layer.values[..., :n, :], quant)
        return fresh


def quantize_layers(cache: list[Any] | None, model: Any, quant: KvQuant) -> list[Any]:
    """A sequence's cache (the model's fresh one when ``cache`` is None) with every plain
    attention layer quantized; other layers as they are."""
    layers = make_prompt_cache(model) if cache is None else cache
    return [
        SequenceQuantizedCache.of(layer, quant)
        if type(layer) is KVCache or isinstance(layer, QuantizedKVCache)
        else layer
        for layer in layers
    ]


class BatchQuantizedKVCache(_BaseCache):  # type: ignore[misc]
    """``BatchKVCache``'s bookkeeping over quantized storage (see the module header)."""

    step = 256

    def __init__(self, left_padding: list[int], quant: KvQuant) -> None:
        self.keys: Triple | None = None
        self.values: Triple | None = None
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-pad for pad in left_padding])
        self._idx = 0
        self._right_padding: mx.array | None = None
        self.quant = quant
        self.bits = quant.bits
        self.group_size = quant.group_size

    # -- the model's calls -------------------------------------------------------------------

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Triple, Triple]:
        prev, n = self._idx, keys.shape[2]
        new_keys, new_values = _quantize(keys, self.quant), _quantize(values, self.quant)
        if self.keys is None or self.values is None or prev + n > self.keys[0].shape[2]:
            length = (self.step + n - 1) // self.step * self.step
            if self.keys is None or self.values is None:
                self.keys = tuple(_slots(new_keys, length))  # type: ignore[assignment]
                self.values = tuple(_slots(new_values, length))  # type: ignore[assignment]
            else:
                self.keys = self._grow(self.keys, prev, length)
                self.values = self._grow(self.values, prev, length)
        assert self.keys is not None
        assert self.values is not None
        self.offset = self.offset + n
        self._idx += n
        for stored, new in ((self.keys, new_keys), (self.values, new_values)):
            for part, chunk in zip(stored, new, strict=True):
                part[..., prev : self._idx, :] = chunk
        return self.keys_and_values()

    @staticmethod
    def _grow(triple: Triple, used: int, length: int) -> Triple:
        kept = [part[..., :used, :] for part in triple]
        w, s, b = (
            mx.concatenate([part, extra], axis=2)
            for part, extra in zip(kept, _slots(triple, length), strict=True)
        )
        return w, s, b

    def keys_and_values(self) -> tuple[Triple, Triple]:
        assert self.keys is not None
        assert self.values is not None
        cut = (Ellipsis, slice(None, self._idx), slice(None))
        return _take(self.keys, cut), _take(self.values, cut)

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> mx.array:
        mask: mx.array = create_causal_mask(
            N, offset=self._idx, left_padding=self.left_padding, **kwargs
        )
        return mask

    # -- the generator's calls ---------------------------------------------------------------

    def prepare(
        self,
        *,
        left_padding: list[int] | None = None,
        lengths: list[int] | None = None,
        right_padding: list[int] | None = None,
    ) -> None:
        if left_padding is not None:
            if self.keys is not None:
                raise ValueError("left padding can only be added to an empty cache")
            added = mx.array(left_padding)
            self.left_padding = self.left_padding + added
            self.offset = self.offset - added
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = mx.array(right_padding)

    def finalize(self) -> None:
        padding = self._right_padding
        if padding is None:
            return
        shifts = padding[:, None]
        assert self.keys is not None
        assert self.values is not None
        self.keys = _roll(self.keys, shifts)
        self.values = _roll(self.values, shifts)
        self.offset = self.offset - padding
        self.left_padding = self.left_padding + padding
        self._right_padding = None

    @property
    def state(self) -> tuple[Any, ...]:
        return self.keys, self.values, self.offset, self.left_padding

    @state.setter
    def state(self, v: tuple[Any, ...]) -> None:
        self.keys, self.values, self.offset, self.left_padding = v

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        return n

    def filter(self, batch_indices: list[int]) -> None:
        """Keep only the rows ``batch_indices``, dropping the padding they all share."""
        index = mx.array(batch_indices)
        if self.keys is not None and self.values is not None:
            self.keys, self.values = _take(self.keys, index), _take(self.values, index)
        self.offset = self.offset[index]
        self.left_padding = self.left_padding[index]
        shared = int(self.left_padding.min().item())  # type: ignore[arg-type]
        if shared > 0:
            if self.keys is not None and self.values is not None:
                cut = (Ellipsis, slice(shared, None), slice(None))
                self.keys, self.values = _take(self.keys, cut), _take(self.values, cut)
            self._idx -= shared
            self.left_padding = self.left_padding - shared

    def extend(self, other: BatchQuantizedKVCache) -> None:
        """Append ``other``'s rows, both right-aligned at the longer one's index."""
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        width = max(self._idx, other._idx)
        mine, theirs = self._aligned(width, other), other._aligned(width, self)
        self.keys = _cat(mine[0], theirs[0])
        self.values = _cat(mine[1], theirs[1])
        self.offset = mx.concatenate([self.offset, other.offset])
        self.left_padding = mx.concatenate([mine[2], theirs[2]])
        self._idx = width

    def _aligned(self, width: int, like: BatchQuantizedKVCache) -> tuple[Triple, Triple, mx.array]:
        """This cache's keys, values and left padding padded on the left to end at ``width``
        (``like`` gives the shapes when this one holds nothing yet)."""
        left = width - self._idx
        rows = int(self.offset.shape[0])
        if self.keys is None or self.values is None:
            assert like.keys is not None
            assert like.values is not None
            keys = _rows(like.keys, rows)
            values = _rows(like.values, rows)
        else:
            keys = _take(self.keys, (Ellipsis, slice(None, self._idx), slice(None)))
            values = _take(self.values, (Ellipsis, slice(None, self._idx), slice(None)))
        return _pad_left(keys, left), _pad_left(values, left), self.left_padding + left

    def extract(self, idx: int) -> SequenceQuantizedCache:
        assert self.keys is not None
        assert self.values is not None
        padding = int(self.left_padding[idx].item())  # type: ignore[arg-type]
        cut = (slice(idx, idx + 1), slice(None), slice(padding, self._idx), slice(None))
        cache = SequenceQuantizedCache(group_size=self.group_size, bits=self.bits)
        w, s, b = (mx.contiguous(part[cut]) for part in self.keys)
        cache.keys = (w, s, b)
        w, s, b = (mx.contiguous(part[cut]) for part in self.values)
        cache.values = (w, s, b)
        cache.offset = self._idx - padding
        return cache

    @classmethod
    def merge(cls, caches: list[Any]) -> BatchQuantizedKVCache:
        """One batch of the per-sequence layers ``caches`` (``SequenceQuantizedCache``),
        right-aligned."""
        quant = KvQuant(caches[0].bits, caches[0].group_size)
        lengths = [int(c.offset) if c.keys is not None else 0 for c in caches]
        width = max(lengths)
        padding = [width - n for n in lengths]
        batch = cls(padding, quant)
        if width == 0:
            return batch
        model = next(c for c in caches if c.keys is not None)
        keys = _slots(model.keys, width, len(caches))
        values = _slots(model.values, width, len(caches))
        for i, (pad, c) in enumerate(zip(padding, caches, strict=True)):
            if c.keys is None or lengths[i] == 0:
                continue
            for stored, held in ((keys, c.keys), (values, c.values)):
                for part, source in zip(stored, held, strict=True):
                    part[i : i + 1, :, pad:width] = source[..., : lengths[i], :]
        batch.keys = (keys[0], keys[1], keys[2])
        batch.values = (values[0], values[1], values[2])
        batch.offset = batch.offset + width
        batch._idx = width
        return batch

    # -- books -------------------------------------------------------------------------------

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return sum(int(part.nbytes) for part in (*self.keys, *self.values))


def _roll(triple: Triple, shifts: mx.array) -> Triple:
    w, s, b = (dynamic_roll(part, shifts, axis=2) for part in triple)
    return w, s, b


def _cat(a: Triple, b: Triple) -> Triple:
    w, s, z = (mx.concatenate([x, y]) for x, y in zip(a, b, strict=True))
    return w, s, z


def _rows(triple: Triple, rows: int) -> Triple:
    """Empty parts shaped like ``triple``'s for ``rows`` rows and no token."""
    w, s, b = (mx.zeros((rows, part.shape[1], 0, part.shape[3]), part.dtype) for part in triple)
    return w, s, b


def _pad_left(triple: Triple, left: int) -> Triple:
    if left == 0:
        return triple
    widths = [(0, 0), (0, 0), (left, 0), (0, 0)]
    w, s, b = (mx.pad(part, widths) for part in triple)
    return w, s, b


def check_model(model: Any, quant: KvQuant) -> int:
    """How many of ``model``'s cache layers ``quant`` quantizes, after a two-token forward
    pass through them (raises ``KvQuantUnsupported`` naming the flags when the model cannot read a
    quantized cache: a head size the group size does not divide, attention sinks ...)."""
    layers = quantize_layers(None, model, quant)
    quantized = sum(isinstance(layer, SequenceQuantizedCache) for layer in layers)
    if quantized == 0:
        return 0
    batch = [
        layer.merge([layer]) if hasattr(layer, "merge") else layer  # one-row batch caches
        for layer in layers
    ]
    try:
        mx.eval(model(mx.array([[0, 0]]), cache=batch))
    except Exception as exc:
        raise KvQuantUnsupported(
            f"--kv-bits {quant.bits} --kv-group-size {quant.group_size}: this model cannot use "
            f"a quantized KV cache ({exc}); the group size must divide the attention head size"
        ) from exc
    return quantized
