"""The training every fixture builder shares (``build_tiny_model.py``, ``build_family_fixtures.py``,
``build_vision_fixture.py`` and through it ``build_qwen3_vl_fixture.py``): full-batch Adam under a
warm-up then cosine learning rate, one ``mx.eval`` a step, the loss on the answer tokens only. The
builders differ in their data and their forward pass, which they pass in as the loss. The two
text builders also share their tokenizer: a byte-level BPE trained on their own corpus.

A rebuild must give the committed bytes, so everything here is the very arithmetic each builder
ran on its own before: the same operations in the same order (see ``warmup_cosine``'s
``fraction_first``), the same step count, nothing that draws from the random state.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

# isort: off
import mlx_responses  # noqa: F401  (importing it preloads OpenBLAS: before MLX)

# isort: on
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

# Qwen2/Qwen3's pre-tokenizer split: digits one by one, words with their leading space.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
Schedule = Callable[[mx.array], mx.array]
# The summed (or averaged) loss of ``model`` at a step: a builder that trains on a different
# slice of its data each step reads the step; the others ignore it.
StepLoss = Callable[[nn.Module, int], mx.array]


def warmup_cosine(
    peak: float, warmup_steps: int, steps: int, *, fraction_first: bool = True
) -> Schedule:
    """A linear warm-up over ``warmup_steps`` to ``peak``, then a cosine down to a tenth of it
    at ``steps``. ``fraction_first``: the cosine's angle is ``pi * (step / steps)`` (the text
    fixtures) or ``(pi * step) / steps`` (the vision fixtures): in float32 the two differ in the
    last bit at some steps, and each fixture was trained with its own."""

    def schedule(step: mx.array) -> mx.array:
        warm = mx.minimum(1.0, (step + 1) / warmup_steps)
        if fraction_first:
            angle = math.pi * mx.minimum(step / steps, 1.0)
        else:
            angle = math.pi * mx.minimum(step, steps) / steps
        decay = 0.5 * (1 + mx.cos(angle))
        return peak * warm * (0.1 + 0.9 * decay)

    return schedule


def adam_steps(
    model: nn.Module, loss: StepLoss, steps: int, schedule: Schedule, report_every: int
) -> float:
    """``steps`` Adam updates of ``model`` on ``loss``; prints the loss every ``report_every``
    steps and at the last; returns the last step's loss."""
    current = {"step": 0}

    def loss_fn(m: nn.Module) -> mx.array:
        return loss(m, current["step"])

    optimizer = optim.Adam(learning_rate=schedule)
    loss_and_grad = nn.value_and_grad(model, loss_fn)
    value = mx.array(0.0)
    started = time.perf_counter()
    for step in range(steps):
        current["step"] = step
        value, grads = loss_and_grad(model)
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state, value)
        if step % report_every == 0 or step == steps - 1:
            elapsed = time.perf_counter() - started
            print(f"  step {step:4d}  loss {value.item():.5f}  {elapsed:6.1f} s", flush=True)
    return float(value.item())


Example = tuple[list[int], int]  # token ids, index of the first completion token


def min_margin(model: nn.Module, examples: list[Example]) -> float:
    """The smallest logit gap, over every completion token of ``examples`` (each run on its
    own), between the right token and the runner-up: a thin one could flip under another
    backend's rounding."""
    worst = math.inf
    for ids, start in examples:
        logits = model(mx.array(ids[:-1])[None])[0][start - 1 :].astype(mx.float32)
        target = mx.array(ids[start:])
        right = mx.take_along_axis(logits, target[:, None], axis=-1)[:, 0]
        others = mx.put_along_axis(
            logits, target[:, None], mx.array(-math.inf, dtype=logits.dtype), axis=-1
        )
        worst = min(worst, float((right - others.max(axis=-1)).min().item()))
    return worst


class PrefixCache:
    """A layer's keys and values of a shared prefix, so one forward pass of the prefix serves a
    batch of suffixes: the first call (the prefix) stores them, with their gradient (nothing is
    frozen); each later call (the suffixes) returns them, broadcast to the batch, ahead of the
    suffixes' own, and keeps nothing. Enough of a KV cache for mlx-vlm's Qwen3-VL, which then
    masks with its own causal mask."""

    def __init__(self) -> None:
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.keys is None or self.values is None:
            self.keys, self.values, self.offset = keys, values, keys.shape[2]
            return keys, values
        batch = keys.shape[0]
        prefix_keys = mx.broadcast_to(self.keys, (batch, *self.keys.shape[1:]))
        prefix_values = mx.broadcast_to(self.values, (batch, *self.values.shape[1:]))
        return (
            mx.concatenate([prefix_keys, keys], axis=2),
            mx.concatenate([prefix_values, values], axis=2),
        )


class MaskedPrefixCache(PrefixCache):
    """``PrefixCache`` with the mask mlx-lm's models ask their cache for: causal in the prefix;
    all of the prefix plus causal within the suffix after it. A separate class because mlx-vlm
    asks for it too where it exists, and the Qwen3-VL fixture was trained on its own mask."""

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> Any:
        if self.keys is None:
            return mx.arange(n)[None, :] <= mx.arange(n)[:, None] if return_array else "causal"
        return mx.arange(self.offset + n)[None, :] <= (self.offset + mx.arange(n))[:, None]


def byte_level_bpe() -> Tokenizer:
    """An untrained byte-level BPE tokenizer with Qwen's pre-tokenizer split."""
    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def bpe_trainer(vocab_size: int, special: list[str]) -> trainers.BpeTrainer:
    """The merges' trainer: every byte in the alphabet, ``special`` kept whole."""
    return trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
