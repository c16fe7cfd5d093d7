"""The generation thread: the only place MLX runs, driven by one inbound stream.

Invariants:
- Every MLX call (load included) happens on this one ``threading.Thread``; MLX streams and
  unevaluated arrays are bound to the thread that made them (platform notes). At its end the
  thread calls ``mx.synchronize(); mx.clear_streams()`` so the process exits cleanly.
- The port: the thread is told everything through ``send`` (the messages of ``inbound.py``,
  applied in order) and reports through each sequence's ``SequenceSlot`` and one
  ``FactStream`` of whole-batch facts (``outbound.py``: loaded, ended, statistics, exited).
  Nothing else is shared with another thread. The statistics are rebuilt after every applied
  message and after a step that changed the batch's members or phases; after other steps only
  every ``STATISTICS_INTERVAL_SECONDS`` (their counters lag at most that).
- A free-running thread alternates intake and one batch step (``Batch.step``: at most one
  prefill chunk and one decode step) while it holds sequences. Messages are drained before
  every step, so a new sequence joins the running batch at the next step and a cancelled one
  leaves it before the next step: cancel latency is one step, or one prefill chunk.
- With a ``journal``, every message the thread applied (``plain``, without its slot) and a
  ``Step`` for every step it took go there, in the order they happened. A ``lockstep`` thread
  steps only on a ``Step`` message and never gathers, so a journal sent to one replays the
  batch exactly (``tests/test_engine_replay.py``).
- The batch's sizes (prefill chunk, decode and prompt batch) are chosen once, at load, on
  this thread: the flags', else the device's (``sizing.py``); ``Loaded`` reports them.
- Only an error of the batch itself (the model's forward pass) ends the thread; every
  sequence it held ends with ``error`` then, and ``Exited`` carries the error.
- With ``ThreadSettings.sharding`` the thread joins the other ranks at load and keeps
  its share of the model; on rank 0 its journal is the ``Broadcaster``, on another rank it is a
  lockstep thread whose inbox is the ``Receiver`` (``distributed.py``), and an idle rank 0
  sends heartbeats instead of blocking for good (one at once when it falls idle, so that every
  rank's emptied batch reaches it).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, assert_never

from .batch import Batch
from .blas_threads import set_blas_threads
from .disk_tier import DEFAULT_TTL_SECONDS, DiskTier, layout_fingerprint, model_fingerprint
from .distributed import Broadcaster, Link, Receiver, open_link, shard_model, topology
from .inbound import (
    Admit,
    Arrivals,
    Cancel,
    ClearPromptCache,
    Inbound,
    Shutdown,
    Step,
    StopMatched,
    plain,
)
from .kv_quant import KvQuant
from .loader import LoadedModel, load_model
from .outbound import Ended, Exited, FactStream, Loaded, ModelStatistics
from .prompt_cache import DEFAULT_MAX_ENTRIES, PromptCache, default_max_bytes
from .sizing import SizeFlags, Sizes, choose_sizes, detect_device
from .slot import FinishReason
from .topology import RankBatch, Sharding
from .warm_up import warm_up

__all__ = ["GenerationThread", "ModelStatistics", "ThreadSettings", "gather_bound"]

log = logging.getLogger(__name__)

# When the batch is idle and a sequence arrives while more requests are on their way
# to the model (a burst: the event loop prepares them one after another), the thread waits for
# them, so that the burst is prefilled together as the engine alone would, instead of its first
# sequence alone while the rest queue behind that prefill. It waits at most as long as that
# prefill would take (``gather_bound``), but at least GATHER_FLOOR_SECONDS: a prefill step has a
# fixed cost the per-token rate does not show (on the bundled model most of a 10-13 ms step),
# and a 16-request burst reaches the model over 15-20 ms; never more than GATHER_SECONDS. A
# lone request never waits: nothing else is on its way. Nor does a burst once it fills a
# prefill (``prefill_batch_size`` sequences): the rest of it would prefill after that one.
GATHER_SECONDS = 0.05
GATHER_FLOOR_SECONDS = 0.02

# How old the published statistics may grow while the batch's members and phases stay the
# same (their counters: tokens, steps, the caches' bytes). Building them per step was ~10 us of
# a tiny model's ~1 ms decode step at one stream, and grows with the batch.
STATISTICS_INTERVAL_SECONDS = 0.02


def gather_bound(prompt_seconds: float, prompt_tokens: int, tokens: int) -> float:
    """How long an idle batch may wait for a burst behind a first sequence that prefills
    ``tokens``: the time the batch took per prompt token so far (``prompt_seconds`` over
    ``prompt_tokens``) times ``tokens``, at least ``GATHER_FLOOR_SECONDS``, at most
    ``GATHER_SECONDS`` (also before any prefill)."""
    if prompt_tokens <= 0 or prompt_seconds <= 0:
        return GATHER_SECONDS
    estimate = prompt_seconds / prompt_tokens * max(tokens, 1)
    return min(GATHER_SECONDS, max(GATHER_FLOOR_SECONDS, estimate))


class Inbox(Protocol):
    """Where the thread's messages wait: a queue, or a follower rank's ``Receiver``."""

    def put(self, message: Inbound) -> None: ...

    def get(self, block: bool = True, timeout: float | None = None) -> Inbound: ...

    def get_nowait(self) -> Inbound: ...

    def empty(self) -> bool: ...


class Journal(Protocol):
    """Where a thread writes what it applied: a queue, or rank 0's ``Broadcaster``."""

    def put(self, message: Inbound) -> None: ...


@dataclass(frozen=True, slots=True)
class ThreadSettings:
    model_path: str
    # The batch's sizes as the flags give them (None: the device's default, ``sizing.py``).
    prefill_step_size: int | None = None
    completion_batch_size: int | None = None
    prefill_batch_size: int | None = None
    # None: a fraction of the machine's memory (prompt_cache.default_max_bytes); 0 disables.
    prompt_cache_bytes: int | None = None
    prompt_cache_entries: int = DEFAULT_MAX_ENTRIES
    # --blas-threads: OpenBLAS's thread count; None measures (blas_threads.set_blas_threads).
    blas_threads: int | None = None
    # --solo-decode: a sequence alone decodes outside the generator (batch.py's header).
    solo_decode: bool = True
    # This process is one rank of a model split over several (None: the whole model).
    sharding: Sharding | None = None
    # The prompt cache's disk tier (docs/prompt-cache.md): its directory (None: no disk tier),
    # its byte budget (0: none) and how long an unused entry is kept.
    prompt_cache_dir: str | None = None
    prompt_cache_disk_bytes: int = 0
    prompt_cache_disk_ttl: float = DEFAULT_TTL_SECONDS
    # --kv-bits / --kv-group-size: the batch's and the prompt cache's KV layers quantized
    # (kv_cache.py); None keeps them at the model's precision.
    kv_quant: KvQuant | None = None
    # --seed: MLX's random key sequence starts here once the model is loaded and warm, so
    # requests that give no ``seed`` of their own sample alike from one start to the next
    # (None: MLX's own start, from the clock). A split model's ranks agree on rank 0's.
    seed: int | None = None


class GenerationThread:
    """Owns the model and the batch; driven only through ``send`` (see the module header)."""

    # The seam for fault injection: tests install a Batch subclass here.
    batch_class: type[Batch] = Batch

    def __init__(
        self,
        settings: ThreadSettings,
        facts: FactStream,
        *,
        lockstep: bool = False,
        journal: Journal | None = None,
    ) -> None:
        self._settings = settings
        self._facts = facts
        self._lockstep = lockstep
        self._journal = journal
        self._inbox: Inbox = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name="mlx-generation", daemon=True)
        self._statistics = ModelStatistics()
        self._arriving = 0  # the latest ``Arrivals`` count
        self._batch: Batch | None = None  # while it serves (tests look at its BLAS counts)
        self._link: Link | None = None  # this rank's exchange with the others
        self._broadcaster: Broadcaster | None = None  # rank 0's journal
        self._applied = 0  # messages applied so far (the loop publishes only after a change)
        self._statistics_due = 0.0  # when a step builds the statistics even with no change
        self._reported = True  # the ranks have heard this rank's latest batch
        cache_bytes = settings.prompt_cache_bytes
        self._prompt_cache = PromptCache(
            default_max_bytes() if cache_bytes is None else cache_bytes,
            settings.prompt_cache_entries,
        )

    def start(self) -> None:
        self._thread.start()

    def send(self, message: Inbound) -> None:
        """Thread-safe and non-blocking."""
        self._inbox.put(message)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # -- the thread ---------------------------------------------------------------------------

    def _main(self) -> None:
        import mlx.core as mx

        error: BaseException | None = None
        try:
            try:
                loaded = self._load()
                # Before any sequence: the count is process-wide (blas_threads).
                # A split model is never measured (set_blas_threads' ``sharded``).
                sharded = {} if self._link is None else {"sharded": True}
                blas = set_blas_threads(
                    loaded.model, self._settings.blas_threads, self._settings.model_path, **sharded
                )
                loaded = replace(
                    loaded,
                    blas=blas,
                    sizes=self._sizes(loaded),
                    kv_quant=self._check_kv_quant(loaded),
                )
            except BaseException as exc:
                self._facts.put(Loaded(None, exc))
                error = exc
                return
            if self._link is None:  # a split model's steps are every rank's (warm_up.py)
                seconds = warm_up(loaded)
                if seconds is not None:
                    log.info("warm-up: %.0f ms", seconds * 1000)
                if self._settings.seed is not None:  # after the warm-up's own draws
                    mx.random.seed(self._settings.seed)
            self._attach_disk(loaded)
            self._facts.put(Loaded(loaded))
            self._serve(loaded)
        except BaseException as exc:
            log.exception("generation thread crashed")
            # A collective that failed means a rank is gone: say which.
            error = exc if self._link is None else self._link.explain(exc)
        finally:
            mx.synchronize()
            mx.clear_streams()
            self._facts.put(Exited(error))

    def _check_kv_quant(self, loaded: LoadedModel) -> KvQuant | None:
        """A model that cannot read a quantized cache fails its load, naming the flags
        (``kv_cache.check_model``). A split model is not probed: a forward pass there is a
        collective every rank would have to join."""
        quant = self._settings.kv_quant
        if quant is None or self._link is not None:
            return quant
        import mlx.core as mx

        from .kv_cache import check_model

        with mx.stream(mx.new_stream(mx.default_device())):
            layers = check_model(loaded.model, quant)
        log.info(
            "KV cache: %d layers quantized to %d bits (group %d)",
            layers,
            quant.bits,
            quant.group_size,
        )
        return quant

    def _load(self) -> LoadedModel:
        sharding = self._settings.sharding
        if sharding is None:
            return load_model(self._settings.model_path)
        # Join the ranks, load this rank's share; rank 0 broadcasts what it applies
        # (its journal), a follower steps in lockstep on what it receives (its inbox).
        self._link = link = open_link(sharding, self._facts, self._settings.seed)
        shares: list[tuple[int, int]] = []

        def split(model: object) -> None:
            shares.append(shard_model(sharding, link.group, model))

        loaded = load_model(self._settings.model_path, split)
        # Every rank evicts alike: rank 0's byte bound (its machine's memory, unless given),
        # counted against whole entries (``PromptCache``'s share).
        kib = link.from_rank0(self._prompt_cache.stats.max_bytes // 1024)
        entries = link.from_rank0(self._settings.prompt_cache_entries)
        self._prompt_cache = PromptCache(kib * 1024, entries, shares[0], follower=link.rank > 0)
        if link.rank == 0:
            self._journal = self._broadcaster = broadcaster = Broadcaster(link)
        else:
            self._lockstep = True
            self._inbox = Receiver(link)
        shape = topology(link, sharding, broadcaster.traffic if link.rank == 0 else None)
        return replace(loaded, topology=shape)

    def _attach_disk(self, loaded: LoadedModel) -> None:
        """Give the prompt cache its disk tier (``ThreadSettings.prompt_cache_dir``): one
        folder per model under it, each rank its own files (the rank is in their names)."""
        settings, cache = self._settings, self._prompt_cache
        if not (settings.prompt_cache_dir and settings.prompt_cache_disk_bytes > 0):
            return
        if not cache.enabled:
            return
        model = model_fingerprint(settings.model_path)
        rank = 0 if self._link is None else self._link.rank
        tier = DiskTier(
            Path(settings.prompt_cache_dir) / model[:16],
            settings.prompt_cache_disk_bytes,
            settings.prompt_cache_disk_ttl,
            model,
            layout_fingerprint(loaded.model, cache.share, loaded.kv_quant),
            rank,
        )
        tier.open()
        self._prompt_cache = cache.with_disk(tier)

    def _sizes(self, loaded: LoadedModel) -> Sizes:
        """The flags' sizes, else the device's (``sizing.py``); every rank of a split model
        runs rank 0's, so that their batches step alike."""
        settings = self._settings
        flags = SizeFlags(
            settings.prefill_step_size, settings.completion_batch_size, settings.prefill_batch_size
        )
        sizes = choose_sizes(flags, detect_device(loaded.model))
        link = self._link
        if link is None:
            return sizes
        return replace(
            sizes,
            prefill_step_size=link.from_rank0(sizes.prefill_step_size),
            completion_batch_size=link.from_rank0(sizes.completion_batch_size),
            prefill_batch_size=link.from_rank0(sizes.prefill_batch_size),
        )

    def _serve(self, loaded: LoadedModel) -> None:
        sizes = loaded.sizes
        assert sizes is not None  # set at load (``_main``)
        batch = self.batch_class(
            loaded,
            self._prompt_cache,
            prefill_step_size=sizes.prefill_step_size,
            completion_batch_size=sizes.completion_batch_size,
            prefill_batch_size=sizes.prefill_batch_size,
            solo=self._settings.solo_decode,
        )
        self._batch = batch
        if self._link is not None:
            self._link.stream = batch.stream
        crashed: BaseException | None = None
        try:
            while True:
                applied = self._applied
                if self._intake(batch):
                    return
                if self._applied != applied:  # else the last step's publish still holds
                    self._publish(batch)
                if batch.live and not self._lockstep:
                    self._step(batch)
        except BaseException as exc:
            crashed = exc
            raise
        finally:
            reason: FinishReason = "error" if crashed is not None else "shutdown"
            batch.close(reason, repr(crashed) if crashed else None)
            self._publish(batch)

    def _step(self, batch: Batch) -> None:
        if self._journal is not None:
            self._journal.put(Step())
        if self._link is None:
            batch.step()
        else:  # a step of a sharded model waits on every rank; a silent one is timed
            with self._link.guard():
                batch.step()
        self._publish(batch, every_time=False)
        if self._link is not None:  # what the next header tells the other ranks
            self._link.batch = RankBatch(batch.totals.steps, batch.sequences, batch.cached_tokens)
            self._reported = False

    def _publish(self, batch: Batch, *, every_time: bool = True) -> None:
        """The ended sequences, and the statistics: after a step (``every_time`` False) only
        when a sequence came, went or changed phase, or the last ones are
        ``STATISTICS_INTERVAL_SECONDS`` old (the counters may lag that much; the members and
        phases never do): building them is the batch's size in work, most steps change nothing.
        The ended sequences' slots get their finish last, so their consumers never see
        statistics that still count them."""
        try:
            ended = batch.take_ended()
            if ended:
                self._facts.put(Ended(ended))
            changed = batch.take_changed()
            now = time.monotonic()
            if every_time or changed or ended or now >= self._statistics_due:
                self._statistics = batch.statistics(self._statistics)
                self._facts.publish(self._statistics)
                self._statistics_due = now + STATISTICS_INTERVAL_SECONDS
        finally:
            batch.release_finishes()

    # -- intake: one function per mode, the journal and the messages' effects written once ----

    def _intake(self, batch: Batch) -> bool:
        """Apply the messages due before the next step; True means stop."""
        if self._lockstep:
            return self._intake_lockstep(batch)
        return self._intake_free(batch)

    def _intake_lockstep(self, batch: Batch) -> bool:
        """Lockstep (a follower rank, or a replayed journal): block for each message and apply
        it, until a ``Step``, which this thread takes then, never gathering a burst."""
        while True:
            if self._link is not None:
                # A follower's figure after what it applied (the next header's).
                self._link.batch = RankBatch(
                    batch.totals.steps, batch.sequences, batch.cached_tokens
                )
            message = self._inbox.get()
            if isinstance(message, Step):
                self._step(batch)  # journals the Step
                return False
            message = self._record(batch, message)
            if self._apply(batch, message):
                return True

    def _intake_free(self, batch: Batch) -> bool:
        """Free-running: apply every pending message. An idle batch blocks for the first one
        (rank 0 of a sharded model settles first), then gathers the rest of a burst until the
        deadline its first ``Admit`` sets (``gather_bound``) while requests are on their way."""
        block = not batch.live
        if block and self._broadcaster is not None:
            self._settle(batch, self._broadcaster)
        gather_until = math.inf
        while (message := self._next_free(block, gather_until)) is not None:
            block = False
            message = self._record(batch, message)
            if isinstance(message, Admit) and not batch.live and gather_until == math.inf:
                gather_until = time.monotonic() + self._gather_bound(batch, message)
            if self._apply(batch, message):
                return True
            if gather_until != math.inf and batch.prefill_full:
                return False  # the first prefill is full: the rest would wait for it anyway
        return False

    def _next_free(self, block: bool, gather_until: float) -> Inbound | None:
        """A free-running thread's next message, or None when it should step (or idle again):
        blocking when idle (rank 0 of a sharded model beats when its wait times out), waiting
        until ``gather_until`` while requests are on their way, else only a pending one."""
        try:
            if block:
                return self._inbox.get(timeout=self._beat_seconds())
            if self._arriving > 0 and gather_until != math.inf:
                timeout = gather_until - time.monotonic()
                if timeout <= 0:
                    return None
                return self._inbox.get(timeout=timeout)
            # Most steps find nothing: no ``queue.Empty`` raised and caught for them.
            return None if self._inbox.empty() else self._inbox.get_nowait()
        except queue.Empty:
            if block and self._link is not None:
                self._link.beat()  # idle rank 0, alive (distributed.py)
            return None

    def _apply(self, batch: Batch, message: Inbound) -> bool:
        """One message's effect on the batch; True means stop. A ``Step`` has none here: a
        free-running thread steps on its own, a lockstep one in ``_intake_lockstep``."""
        self._applied += 1
        match message:
            case Admit():
                self._arriving = message.arriving
                batch.admit(message)
            case Cancel(seq_id):
                batch.cancel(seq_id)
            case StopMatched(seq_id):
                batch.stop(seq_id)
            case ClearPromptCache():
                batch.clear_cache()
            case Arrivals(count):
                self._arriving = count
            case Step():
                pass
            case Shutdown():
                return True
            case _:
                assert_never(message)
        return False

    def _record(self, batch: Batch, message: Inbound) -> Inbound:
        """``message`` as the journal keeps it (without its slot), put there. An ``Admit`` is
        met with the prompt cache first (``Batch.lookup``): the pixels of the images its
        cached prefix holds are neither recorded nor broadcast."""
        if isinstance(message, Admit):
            message = batch.lookup(message)
        if self._journal is not None and not isinstance(message, Step):
            self._journal.put(plain(message))
        return message

    def _settle(self, batch: Batch, broadcaster: Broadcaster) -> None:
        """Rank 0 falls idle. What it applied since its last step (a cancel that
        emptied the batch) reaches every rank now rather than with the next request, and one
        heartbeat carries every rank's batch after it, rather than a beat period later."""
        assert self._link is not None
        if broadcaster.flush() or not self._reported:
            self._link.batch = RankBatch(batch.totals.steps, batch.sequences, batch.cached_tokens)
            self._link.beat()
            self._reported = True

    def _beat_seconds(self) -> float | None:
        """How long an idle rank 0 of a sharded model waits before a heartbeat (else None)."""
        if self._link is None or self._lockstep:
            return None
        return self._link.beat_seconds

    def _gather_bound(self, batch: Batch, first: Admit) -> float:
        totals = batch.totals
        return gather_bound(totals.prompt_seconds, totals.prompt_tokens, len(first.spec.prompt))
