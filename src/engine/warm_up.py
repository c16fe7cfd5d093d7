"""One short sequence through a batch of its own before the thread serves.

Invariants:
- MLX builds some kernels the first time a computation runs: on the CPU it compiles fused
  kernels with the system's C++ compiler and keeps them in its temp folder (``/tmp/mlx``), so
  on a machine whose temp folder does not hold them yet (a fresh install, a reboot that
  cleared ``/tmp``) the first request waited for the compiler: 2.3 s to the first delta on
  the bundled model against ~10 ms after it. The warm-up runs two short sequences' prefill
  and decode steps with the API's default sampling (temperature 1) at start instead, batched
  (two rows: one sequence alone in the generator left kernels for two at once to compile),
  then the longer one alone (``batch.py``'s solo steps: the model on a plain cache): what
  they compile covers a greedy request, a lone one (its prefill alone included) and two at
  once (``tests/test_warm_up.py``).
- It leaves nothing behind: its batch has its own prompt cache that holds nothing and its
  own counters, and its sequences' output goes nowhere; the serving batch starts empty, and
  OpenBLAS is left on the prefill's thread count, as the load leaves it.
- A failed warm-up is logged and never stops a start; the first request then does the work.
- Never on a split model: each of its steps is an exchange every rank must join alike.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from .batch import Batch
from .blas_threads import open_blas
from .inbound import Admit, SequenceSpec
from .loader import LoadedModel
from .prompt_cache import PromptCache

log = logging.getLogger(__name__)

WARM_UP_TEXT = "Hello, how are you today?"
WARM_UP_TOKENS = 3  # the prefill's token and two batched decode steps'
# The second sequence's: two more steps, alone once the first has ended.
WARM_UP_LONGER_TOKENS = WARM_UP_TOKENS + 2
# The Responses API's default temperature (greedy compiles nothing more).
WARM_UP_TEMPERATURE = 1.0


def warm_up(loaded: LoadedModel) -> float | None:
    """Run the warm-up on ``loaded``; its seconds, or None when it could not run."""
    sizes = loaded.sizes
    assert sizes is not None  # chosen at load, before this runs
    began = time.perf_counter()
    try:
        prompt = tuple(int(token) for token in loaded.tokenizer.encode(WARM_UP_TEXT))
        if not prompt:
            return None
        batch = Batch(
            loaded,
            PromptCache(0, 1),  # holds nothing
            prefill_step_size=sizes.prefill_step_size,
            completion_batch_size=sizes.completion_batch_size,
            prefill_batch_size=sizes.prefill_batch_size,
            solo=True,  # a lone request's decode steps: the model on a plain cache
        )
        try:
            spec = SequenceSpec(prompt, WARM_UP_TOKENS, WARM_UP_TEMPERATURE, 1.0)
            batch.admit(Admit(0, spec))  # two at once: both prefill in the generator
            batch.admit(Admit(1, replace(spec, max_tokens=WARM_UP_LONGER_TOKENS)))
            while batch.live:
                batch.step()
        finally:
            batch.close("shutdown", None)
            _leave_threads_for_prefill(loaded)
    except Exception:
        log.exception("the warm-up failed; the first request compiles what it needs")
        return None
    return time.perf_counter() - began


def _leave_threads_for_prefill(loaded: LoadedModel) -> None:
    """OpenBLAS back on the prefill's count, where the load leaves it for the serving batch's
    first step (a prefill; ``blas_threads``), once nothing of the warm-up runs."""
    blas = open_blas()
    if blas is None or loaded.blas is None:
        return
    import mlx.core as mx

    mx.synchronize()
    blas.set_threads(loaded.blas.prefill_threads)
