"""How many threads OpenBLAS runs MLX's CPU products on: its default only where
the extra threads pay for the cores they take.

Invariants:
- Chosen once per generation thread, after the model loads and before any sequence: a count
  for decode steps and one for steps that prefill (``BlasThreads``).
- ``auto`` (the default) times decode-shaped forward passes (rows of one token, over a cache
  that grows by one per pass) at each batch size of ``CALIBRATION_ROWS`` (1, 4 and 16
  sequences), one thread and the default count in alternation. A decode step of that many
  sequences or more (up to the next size measured) runs on the default only when it makes a
  pass of that size at least ``MIN_SPEEDUP`` times faster, else on one thread: on a model
  whose products are small, a second thread buys little speed and takes a core from the
  event loop, the clients and the generation thread's own Python. Measured on the 10M bench
  model here, two threads made a pass 1.08-1.20x faster at 1 row, 0.85-0.89x at 4 and
  1.11-1.35x at 16; one count for every size, read at 16 rows, decoded 4 streams 1.26x slower
  on the starts that read above 1.3x (``docs/benchmarks.md``, ninth pass). Each size's
  speedup is from the paired ratios (so a machine whose speed drifts compares like with like):
  their median per block of ``BLOCK_PAIRS``, the best block (a process busy on a core slows
  the threaded passes most; the 10M bench model's 16-row speedup read 1.2-1.66 from one start
  to the next on this shared machine).
- Steps that prefill run on the default, except a short one: a step with at most
  ``SHORT_PREFILL_TOKENS`` prompt tokens still to prefill in the batch (a lone chat turn) runs
  on one thread unless a prefill of that many tokens is at least
  ``MIN_PREFILL_SPEEDUP`` times faster on the default, measured the same way. A prefill holds
  its user's first token, so its bar is lower than decode's; below it the second thread buys
  less than the two count changes (each waits on the stream) and the core it takes from the
  request's own work. Measured here (one thread over two, a 64-token prefill, the best
  block as below): the 0.5M bundled model 1.00-1.13 over ten measurements, the 10M bench
  model 1.27-1.41 over six; at 512-2,048 tokens (medians) 1.07-1.08 and 1.15-1.23.
- The count is process-wide in OpenBLAS and changing it while a product runs is not safe, so
  ``StepThreads`` changes it only between steps and only after the generation stream has
  finished its work (``synchronize``); it changes only when a step needs another count than
  the last one (a burst's prefill begins or ends, the batch crosses a size measured), so the
  batch's pipelining is kept otherwise.
- The first decode step after a step that prefilled keeps the prefill's count, and the change
  waits one step: the first tokens of the sequences that just finished their prompts come out
  of that step, and a change before it would wait for the stream, building the next step only
  after the last one's products are done. Measured on the bench model (two threads for a
  short prefill, one for a lone decode), lone streamed requests, alternating: -0.96 and -1.67
  ms to the first delta, paired (an A/A control -0.10 ms).
- Nothing is measured or changed where OpenBLAS is not loaded, on a GPU, where its default is
  one thread, or where one pass takes longer than ``MAX_PASS_SECONDS`` (a model that large has
  products worth every thread). A fixed count (``--blas-threads N``) is set as given.
- The pure part (``choose_threads``) decides from the timings; ``calibrate`` only measures.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..blas import OPENBLAS, openblas_loaded

log = logging.getLogger(__name__)

MIN_SPEEDUP: Final = 1.3
BLOCK_PAIRS: Final = 6
CALIBRATION_ROWS: Final = (16, 4, 1)  # the widest first: its pass decides whether to measure
CALIBRATION_PAIRS: Final = 18
WARM_UP_PASSES: Final = 4
MAX_PASS_SECONDS: Final = 0.25
SHORT_PREFILL_TOKENS: Final = 64
MIN_PREFILL_SPEEDUP: Final = 1.2
PREFILL_PAIRS: Final = 12
# A model whose short prefill takes longer has products worth every thread; measuring it
# would hold the start for seconds.
MAX_PREFILL_PASS_SECONDS: Final = 0.05


@dataclass(frozen=True, slots=True)
class BlasThreads:
    """What the generation thread runs on: ``threads`` for decode steps (of one sequence, and of
    every size when ``by_rows`` is empty) and ``prefill_threads`` for steps that prefill, of
    OpenBLAS's ``default``; the measured speedup of the default over one thread on a decode
    pass of one sequence (None when nothing was measured) and why. ``by_rows``: per batch size
    measured, ascending, the count and the speedup a decode step of that many sequences or more
    (up to the next size) runs on. ``short_prefill``: the count a step with at most
    ``SHORT_PREFILL_TOKENS`` prompt tokens to prefill runs on, and the speedup measured on a
    prefill that long (None: such steps run on ``prefill_threads`` too)."""

    threads: int
    default: int
    speedup: float | None
    reason: str
    prefill_threads: int
    by_rows: tuple[tuple[int, int, float], ...] = ()
    short_prefill: tuple[int, float] | None = None

    def prefill_count(self, prompt_tokens: int) -> int:
        """The count a step runs on that prefills, with ``prompt_tokens`` still to prefill."""
        if self.short_prefill is not None and prompt_tokens <= SHORT_PREFILL_TOKENS:
            return self.short_prefill[0]
        return self.prefill_threads

    def decode_threads(self, rows: int) -> int:
        """The count a decode step of ``rows`` sequences runs on."""
        count = self.threads
        for size, threads, _ in self.by_rows:
            if rows >= size:
                count = threads
        return count

    def describe(self) -> str:
        text = f"OpenBLAS on {self.threads} of {self.default} threads"
        wider = [(size, n) for size, n, _ in self.by_rows if n != self.threads]
        short = self.short_prefill
        if self.prefill_threads != self.threads or wider:
            text += " for decoding"
            text += "".join(f" ({n} from {size} sequences)" for size, n in wider)
            text += f", {self.prefill_threads} for prefill"
            if short is not None and short[0] != self.prefill_threads:
                text += f" ({short[0]} up to {SHORT_PREFILL_TOKENS} tokens)"
        text += f" ({self.reason}"
        if self.by_rows:
            sizes = " / ".join(str(size) for size, _, _ in self.by_rows)
            gains = " / ".join(f"{gain:.2f}x" for _, _, gain in self.by_rows)
            text += f": {self.default} threads made a decode pass {gains} faster at {sizes} rows"
        elif self.speedup is not None:
            text += f": {self.default} threads made a decode pass {self.speedup:.2f}x faster"
        if short is not None:
            text += (
                f", a prefill of {SHORT_PREFILL_TOKENS} tokens {short[1]:.2f}x"
                f" ({MIN_PREFILL_SPEEDUP}x needed)"
            )
        return text + ")"

    def to_json(self) -> dict[str, Any]:
        return {
            "threads": self.threads,
            "prefill_threads": self.prefill_threads,
            "default_threads": self.default,
            "measured_speedup": None if self.speedup is None else round(self.speedup, 3),
            "decode_by_rows": [
                {"rows": size, "threads": n, "measured_speedup": round(gain, 3)}
                for size, n, gain in self.by_rows
            ],
            "short_prefill": (
                None
                if self.short_prefill is None
                else {
                    "tokens": SHORT_PREFILL_TOKENS,
                    "threads": self.short_prefill[0],
                    "measured_speedup": round(self.short_prefill[1], 3),
                }
            ),
            "reason": self.reason,
        }


class StepThreads:
    """Sets the count each step needs, between steps, after the stream is done (see above)."""

    def __init__(
        self,
        set_threads: Callable[[int], None],
        choice: BlasThreads,
        synchronize: Callable[[], None],
        current: int,
    ) -> None:
        self._set = set_threads
        self._choice = choice
        self._synchronize = synchronize
        self.current = current
        self.changes = 0
        self._prefilled = False  # whether the last step prefilled

    def before_step(self, prefilling: bool, rows: int = 1, prompt_tokens: int = 0) -> None:
        """Before a step that prefills (``prompt_tokens`` still to prefill in the batch), or
        decodes ``rows`` sequences (right after a prefill, on the prefill's count)."""
        after_prefill, self._prefilled = self._prefilled, prefilling
        if after_prefill and not prefilling:
            return
        choice = self._choice
        wanted = choice.prefill_count(prompt_tokens) if prefilling else choice.decode_threads(rows)
        if wanted != self.current:
            self._synchronize()  # no product of an earlier step is still running
            self._set(wanted)
            self.current = wanted
            self.changes += 1


def choose_threads(
    one: Sequence[float],
    many: Sequence[float],
    default: int,
    min_speedup: float = MIN_SPEEDUP,
    block: int = BLOCK_PAIRS,
) -> tuple[int, float]:
    """The thread count to run on, and the measured speedup, from paired pass times: ``one[i]``
    on one thread, ``many[i]`` on ``default`` threads, measured next to each other. The speedup
    is the best block's median ratio (``block`` consecutive pairs): another process busy on a
    core slows the threaded passes most, so the least disturbed block is the model's own."""
    ratios = [a / b for a, b in zip(one, many, strict=True) if a > 0 and b > 0]
    if not ratios or default <= 1:
        return max(default, 1), 1.0
    speedup = max(
        statistics.median(ratios[start : start + block])
        for start in range(0, len(ratios), max(block, 1))
    )
    return (default if speedup >= min_speedup else 1), speedup


class OpenBlas:
    """The loaded library's thread-count calls."""

    def __init__(self) -> None:
        self._lib = ctypes.CDLL(OPENBLAS)
        self._lib.openblas_get_num_threads.restype = ctypes.c_int
        self._lib.openblas_set_num_threads.argtypes = [ctypes.c_int]
        # Its own count, before this server set any.
        self.default = self.threads()

    def threads(self) -> int:
        return int(self._lib.openblas_get_num_threads())

    def set_threads(self, count: int) -> None:
        self._lib.openblas_set_num_threads(count)


@functools.cache
def open_blas() -> OpenBlas | None:
    """The OpenBLAS MLX computes with, or None (not loaded, or MLX runs on a GPU)."""
    import mlx.core as mx

    if "gpu" in str(mx.default_device()).lower() or not openblas_loaded():
        return None
    try:
        return OpenBlas()
    except (OSError, AttributeError):
        return None


# What ``auto`` measured, per model folder: a restarted generation thread (or another server
# in this process, as in the test suite) reuses it instead of measuring again.
_measured: dict[str, BlasThreads] = {}
_measuring = threading.Lock()


def set_blas_threads(
    model: Any, wanted: int | None, key: str = "", *, sharded: bool = False
) -> BlasThreads | None:
    """Choose the counts for ``model`` (None: ``auto``; ``key`` names its folder) and leave
    OpenBLAS on the prefill count (a batch's first step prefills); the choice, or None where
    OpenBLAS does not compute. Runs on the generation thread before it serves. ``sharded``
    (a split model): never measured, since a measurement runs as many passes as time allows and
    each pass of a split model is an exchange every rank must join alike."""
    blas = open_blas()
    if blas is None:
        return None
    if wanted is not None:
        blas.set_threads(wanted)
        return BlasThreads(wanted, blas.default, None, "--blas-threads", wanted)
    if sharded:
        blas.set_threads(blas.default)
        return BlasThreads(blas.default, blas.default, None, "sharded: not measured", blas.default)
    with _measuring:
        kept = _measured.get(key) if key else None
        if kept is None:
            kept = _measure(blas, model)
            if kept.speedup is None or not key:
                return kept  # nothing measured (or nowhere to keep it)
            _measured[key] = kept
        blas.set_threads(kept.prefill_threads)
        return kept


def _measure(blas: OpenBlas, model: Any) -> BlasThreads:
    """``auto``: measure and choose; OpenBLAS is left on its own count (prefill's)."""
    default = blas.default
    blas.set_threads(default)
    if default <= 1:
        return BlasThreads(default, default, None, "its default is one thread", default)
    chosen: list[tuple[int, int, float]] = []
    try:
        for rows in CALIBRATION_ROWS:
            one, many = calibrate(model, blas.set_threads, default, rows)
            if not one:  # the widest pass is too slow: products worth every thread
                blas.set_threads(default)
                reason = "a pass is too slow to measure"
                return BlasThreads(default, default, None, reason, default)
            chosen.append((rows, *choose_threads(one, many, default)))
    except Exception as exc:  # never a reason not to serve: the default stays
        blas.set_threads(default)
        return BlasThreads(default, default, None, f"not measured: {exc!r}", default)
    short_prefill = _measure_short_prefill(blas, model)
    blas.set_threads(default)  # prefill's count, where the first step (a prefill) starts
    by_rows = tuple(sorted(chosen))
    _, threads, speedup = by_rows[0]
    reason = f"measured, {MIN_SPEEDUP}x needed"
    return BlasThreads(threads, default, speedup, reason, default, by_rows, short_prefill)


def _measure_short_prefill(blas: OpenBlas, model: Any) -> tuple[int, float] | None:
    """The count and speedup for a prefill of ``SHORT_PREFILL_TOKENS`` tokens, or None where
    a pass is too slow to measure or the measurement fails (the default runs it: never a
    reason not to serve)."""
    try:
        one, many = calibrate(
            model,
            blas.set_threads,
            blas.default,
            1,
            tokens=SHORT_PREFILL_TOKENS,
            pairs=PREFILL_PAIRS,
            max_seconds=MAX_PREFILL_PASS_SECONDS,
        )
    except Exception:
        log.exception("the short prefill's OpenBLAS count was not measured")
        return None
    if not one:
        return None
    return choose_threads(one, many, blas.default, MIN_PREFILL_SPEEDUP)


def calibrate(
    model: Any,
    set_threads: Callable[[int], None],
    default: int,
    rows: int,
    *,
    tokens: int = 1,
    pairs: int = CALIBRATION_PAIRS,
    max_seconds: float = MAX_PASS_SECONDS,
) -> tuple[list[float], list[float]]:
    """Paired times of a pass of ``rows`` sequences of ``tokens`` tokens on one thread and on
    ``default`` threads; empty when one pass takes longer than ``max_seconds``. One token: a
    decode pass, over a cache that grows by one per pass; more: a prefill, over an empty one."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    step = mx.zeros((rows, tokens), dtype=mx.int32)

    def timed(threads: int) -> float:
        set_threads(threads)
        fresh = cache if tokens == 1 else make_prompt_cache(model)
        began = time.perf_counter()
        mx.eval(model(step, cache=fresh))
        return time.perf_counter() - began

    # The second pass on the default (the first one warms up) decides whether to measure.
    timed(default)
    if timed(default) > max_seconds:
        return [], []
    for _ in range(WARM_UP_PASSES // 2):
        timed(1)
        timed(default)
    one: list[float] = []
    many: list[float] = []
    for pair in range(pairs):
        if pair % 2:  # alternate which goes first
            one.append(timed(1))
            many.append(timed(default))
        else:
            many.append(timed(default))
            one.append(timed(1))
    return one, many
