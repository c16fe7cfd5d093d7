"""Sampling adjustments as mlx-lm logits processors: presence / frequency penalties and top_k.

Invariants:
- ``SamplingAdjust`` is a frozen request setting; ``processors()`` builds fresh MLX processors and
  must run on the generation thread (they create MLX arrays).
- The penalties are OpenAI's additive ones (-2..2) through mlx-lm's ``make_logits_processors``,
  applied over every token the sequence has seen (prompt and generated), not a 20-token window.
- ``top_k`` keeps the k most likely tokens (mlx-lm's ``apply_top_k``); 0 or a k at least the
  vocabulary size changes nothing. Under greedy decoding it changes nothing either.
- All-default settings build no processor at all, so they cost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..protocol.request import CreateRequest

PENALTY_RANGE = (-2.0, 2.0)
# Tokens a penalty looks back over: effectively the whole sequence.
_WHOLE_SEQUENCE = 1 << 30


@dataclass(frozen=True, slots=True)
class SamplingAdjust:
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_k: int = 0

    @property
    def is_default(self) -> bool:
        return self.presence_penalty == 0 and self.frequency_penalty == 0 and self.top_k <= 0

    def processors(self) -> list[Any]:
        """The logits processors (generation thread only)."""
        if self.is_default:
            return []
        from mlx_lm.sample_utils import make_logits_processors

        built: list[Any] = list(
            make_logits_processors(
                presence_penalty=self.presence_penalty or None,
                presence_context_size=_WHOLE_SEQUENCE,
                frequency_penalty=self.frequency_penalty or None,
                frequency_context_size=_WHOLE_SEQUENCE,
            )
        )
        if self.top_k > 0:
            built.append(_top_k_processor(self.top_k))
        return built


def _top_k_processor(k: int) -> Any:
    import mlx.core as mx

    def top_k(_tokens: Any, logits: Any) -> Any:
        vocab = logits.shape[-1]
        if k >= vocab:
            return logits
        mask_idx = mx.argpartition(-logits, kth=k - 1, axis=-1)[..., k:]
        return mx.put_along_axis(logits, mask_idx, mx.array(-float("inf"), logits.dtype), axis=-1)

    return top_k


def sampling_adjust(request: CreateRequest) -> SamplingAdjust:
    """A request's penalties (echoed on its Response) and ``top_k`` (Anthropic's)."""
    return SamplingAdjust(
        presence_penalty=request.config.presence_penalty,
        frequency_penalty=request.config.frequency_penalty,
        top_k=request.top_k,
    )
