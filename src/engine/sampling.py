"""Samplers for the generation thread (call only on that thread: they create MLX arrays).

Invariants:
- Unseeded samplers are shared per (temperature, top_p): mlx-lm samples a whole batch in one
  call only when its rows share the same sampler object.
- A seeded sampler belongs to one sequence and draws from its own key, so the same request
  with the same seed samples the same tokens whatever else is in the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Sampler = Callable[[Any], Any]


def make_shared_sampler(temperature: float, top_p: float) -> Sampler:
    from mlx_lm.sample_utils import make_sampler

    sampler: Sampler = make_sampler(temp=temperature, top_p=top_p if top_p < 1 else 0.0)
    return sampler


def make_seeded_sampler(temperature: float, top_p: float, seed: int) -> Sampler:
    import mlx.core as mx
    from mlx_lm.sample_utils import apply_top_p

    if temperature == 0:
        return make_shared_sampler(0.0, 1.0)
    state = {"key": mx.random.key(seed)}

    def sample(logprobs: Any) -> Any:
        if 0 < top_p < 1:
            logprobs = apply_top_p(logprobs, top_p)
        state["key"], draw = mx.random.split(state["key"])
        return mx.random.categorical(logprobs * (1.0 / temperature), key=draw)

    return sample
