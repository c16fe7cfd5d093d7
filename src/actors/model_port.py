"""The Trio side of the engine's port (``model/thread.py``): one generation thread with its
fact stream (``_Worker``), and what Trio tasks count for it (``_Engine``).

Invariants:
- Touched only on the Trio thread. The generation thread hears of anything here by message
  (``Arrivals``) and reports by its ``FactStream``, which ``_Worker.forward`` moves into the
  model actor's mailbox in order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

from ..engine.port import (
    Arrivals,
    BatchFact,
    Exited,
    FactStream,
    GenerationThread,
    Inbound,
    Loaded,
    LoadedModel,
    ModelStatistics,
    SizeFlags,
    ThreadSettings,
)
from .model_types import ModelSettings

M = TypeVar("M")


class _Engine:
    """The Trio side of the thread's port: the current worker and what Trio tasks count for it
    (touched only on the Trio thread). The thread hears of ``arriving`` in each ``Admit``
    (``admitting``), and by ``Arrivals(0)`` when a count an ``Admit`` carried has dropped to
    none: all it asks is whether an idle batch that got a sequence should gather."""

    def __init__(self, worker: _Worker) -> None:
        self.worker = worker
        self.admitted = 0
        # Requests on their way to the model (``ModelHandle.arriving``).
        self.arriving = 0
        # The thread was last told some are on their way (an Admit's count, or ``Arrivals``).
        self._told = False

    def send(self, message: Inbound) -> None:
        self.worker.thread.send(message)

    def arrive(self, change: int, *, tell: bool = True) -> None:
        """Count requests on their way; tell the thread when the count it was told drops to
        none (a lone request's arrival sends nothing; nor does one whose ``Admit``, carrying
        the count, is sent next: ``tell`` False)."""
        self.arriving += change
        if self.arriving == 0 and self._told:
            self._told = False
            if tell:
                self.send(Arrivals(0))

    def admitting(self) -> int:
        """The count an ``Admit`` sent now carries."""
        self._told = self._told or self.arriving > 0
        return self.arriving

    def tell_arriving(self) -> None:
        """A new thread hears the count (``Arrivals``), when there is one."""
        if self.arriving:
            self._told = True
            self.send(Arrivals(self.arriving))

    def latest(self) -> ModelStatistics:
        return self.worker.facts.latest()


class Arrival:
    """One request counted as on its way to the model (``ModelHandle.arriving``) until
    ``done``, which may be called more than once."""

    __slots__ = ("_counted", "_engine")

    def __init__(self, engine: _Engine) -> None:
        self._engine = engine
        self._counted = True
        engine.arrive(+1)

    def done(self) -> None:
        if self._counted:
            self._counted = False
            self._engine.arrive(-1)

    def admitted(self) -> None:
        """``done``, as the request's ``Admit`` is sent: that carries the new count, so the
        thread is not told it apart (an ``Arrivals(0)`` just before the ``Admit`` could end a
        gather with the last of a burst left out)."""
        if self._counted:
            self._counted = False
            self._engine.arrive(-1, tell=False)


def size_flags(settings: ModelSettings) -> SizeFlags:
    """The batch sizes the flags set (None: the device's default)."""
    return SizeFlags(
        settings.prefill_step_size, settings.completion_batch_size, settings.prefill_batch_size
    )


def thread_settings(settings: ModelSettings) -> ThreadSettings:
    """What the generation thread is told of the model's settings (a follower rank's too)."""
    return ThreadSettings(
        settings.model_path,
        prefill_step_size=settings.prefill_step_size,
        completion_batch_size=settings.completion_batch_size,
        prefill_batch_size=settings.prefill_batch_size,
        prompt_cache_bytes=settings.prompt_cache_bytes,
        prompt_cache_entries=settings.prompt_cache_entries,
        prompt_cache_dir=settings.prompt_cache_dir,
        prompt_cache_disk_bytes=settings.prompt_cache_disk_bytes,
        prompt_cache_disk_ttl=settings.prompt_cache_disk_ttl,
        blas_threads=settings.blas_threads,
        solo_decode=settings.solo_decode,
        sharding=settings.sharding,
        kv_quant=settings.kv_quant,
        seed=settings.seed,
    )


class _Worker:
    """One generation thread and its fact stream."""

    def __init__(self, settings: ModelSettings) -> None:
        self.facts = FactStream(trio.lowlevel.current_trio_token())
        self.loaded = False  # it reported its model loaded
        self.thread: GenerationThread = settings.thread_factory(
            thread_settings(settings), self.facts
        )
        self.thread.start()

    async def wait_loaded(self, path: str) -> LoadedModel:
        """The first worker's load, before the actor serves (its first fact)."""
        fact = await self.facts.receive()
        match fact:
            case Loaded(loaded, error) if loaded is not None:
                self.loaded = True
                return loaded
            case Loaded(_, error):
                raise RuntimeError(f"could not load model {path!r}: {error}") from error
            case _:
                raise RuntimeError(f"could not load model {path!r}: {fact}")

    async def forward(
        self, mailbox: trio.MemorySendChannel[M], wrap: Callable[[_Worker, BatchFact], M]
    ) -> None:
        """This thread's facts into the actor's mailbox, in order, up to its exit."""
        async with mailbox:
            while True:
                fact = await self.facts.receive()
                try:
                    await mailbox.send(wrap(self, fact))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return  # the actor is gone
                if isinstance(fact, Exited):
                    return
