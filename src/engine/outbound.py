"""The generation thread's outbound stream of whole-batch facts.

Invariants:
- Per-sequence output (text, tokens, logprobs, finish, cache report, errors) goes to each
  sequence's ``SequenceSlot``; everything about the batch as a whole comes here: the load
  result (first), which sequences ended, the statistics, the thread's exit
  (last).
- The producer (the generation thread) never blocks: it appends under a lock held for a few
  microseconds and wakes a waiting Trio consumer with ``TrioToken.run_sync_soon`` (which does
  not wait), only when the stream goes from empty to non-empty.
- Statistics are a latest value, not a queue: a new snapshot (the thread builds one when the
  batch changed, else every ``STATISTICS_INTERVAL_SECONDS``) replaces the last and wakes
  nobody; ``latest()`` reads it from any thread. Facts (``Loaded``, ``Ended``, ``Exited``) are
  delivered once each, in order.
- One consumer: a Trio task (``receive``) or a plain thread (``get``).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field

import trio

from .cache_stats import PrefixCacheStats
from .loader import LoadedModel


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    """A snapshot of the batch. ``active`` counts the sequences the thread holds; ``admitted``
    (filled in by the model actor) the sequences admitted and not yet reported ended."""

    active: int = 0
    queued: int = 0
    prefilling: int = 0
    decoding: int = 0
    active_ids: frozenset[int] = field(default_factory=frozenset)
    tokens_generated: int = 0
    prompt_tokens_processed: int = 0
    sequences_finished: int = 0
    sequences_cancelled: int = 0
    sequences_failed: int = 0
    steps: int = 0
    peak_decoding: int = 0
    admitted: int = 0
    prompt_cache: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    # KV bytes the running batch's caches hold (``kv_bytes.py``); 0 with no sequence.
    batch_kv_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Loaded:
    """First: the model loaded (``loaded``), or could not be (``error``)."""

    loaded: LoadedModel | None
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class Ended:
    """These sequences received their finish (their slots hold it): release their admission."""

    seq_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Exited:
    """Last: the thread ended (``error``: what ended it, None at a shutdown)."""

    error: BaseException | None = None


BatchFact = Loaded | Ended | Exited


class FactStream:
    """Thread-safe, non-blocking for the producer; see the module's invariants."""

    def __init__(self, trio_token: trio.lowlevel.TrioToken | None = None) -> None:
        self._token = trio_token
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._facts: collections.deque[BatchFact] = collections.deque()
        self._latest = ModelStatistics()
        self._waiting = False  # a Trio consumer waits (under the lock)
        self._event: trio.Event | None = None  # touched only on the Trio thread

    # -- producer (the generation thread) ---------------------------------------------------

    def put(self, fact: BatchFact) -> None:
        with self._lock:
            self._facts.append(fact)
            self._arrived.notify()
            wake = self._waiting
            self._waiting = False
        if wake and self._token is not None:
            try:
                self._token.run_sync_soon(self._wake)
            except trio.RunFinishedError:
                pass  # nobody is left to wake

    def publish(self, statistics: ModelStatistics) -> None:
        with self._lock:
            self._latest = statistics

    # -- consumer ----------------------------------------------------------------------------

    def latest(self) -> ModelStatistics:
        with self._lock:
            return self._latest

    def _wake(self) -> None:
        if self._event is not None:
            self._event.set()

    async def receive(self) -> BatchFact:
        """The next fact (Trio thread; the stream was made with its token)."""
        while True:
            with self._lock:
                if self._facts:
                    return self._facts.popleft()
                self._waiting = True
                self._event = event = trio.Event()
            try:
                await event.wait()
            finally:
                with self._lock:
                    self._waiting = False

    def get(self, timeout: float | None = None) -> BatchFact:
        """The next fact (a plain thread); raises ``TimeoutError`` after ``timeout``."""
        with self._lock:
            if not self._arrived.wait_for(lambda: bool(self._facts), timeout):
                raise TimeoutError("no fact from the generation thread in time")
            return self._facts.popleft()
