"""The model actor's values (all re-exported by ``actors.model``): its settings, what it
tells of its model, what a response task submits, its refusals and a response task's view of
its admitted sequence.

Invariants:
- Nothing here runs or holds MLX; ``GenerationSequence`` reads its slot and asks the model
  actor (through a ``SequenceControl``, its handle) for anything else.
- This module imports nothing of the actor: the actor and its port import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..engine.port import (
    DEFAULT_DISK_BYTES,
    DEFAULT_MAX_ENTRIES,
    DEFAULT_TTL_SECONDS,
    GenerationThread,
    KvQuant,
    SequenceOutput,
    SequenceSlot,
    SequenceSpec,
    Sharding,
)

ThreadFactory = Callable[..., GenerationThread]


@dataclass(frozen=True, slots=True)
class ModelSettings:
    model_path: str
    alias: str
    # --prefill-step-size, --decode-concurrency, --prompt-concurrency (None: the device's
    # default, chosen at load: ``engine/sizing.py``; ``ModelHandle.sizes`` has what was chosen).
    prefill_step_size: int | None = None
    completion_batch_size: int | None = None
    prefill_batch_size: int | None = None
    max_sequences: int = 256
    # --ctx-size: the context window the server enforces and compaction plans with; None: the
    # model's own (its config's max_position_embeddings or the like).
    context_size: int | None = None
    # --prompt-cache-bytes (None: a fraction of the machine's memory; 0 disables) and
    # --prompt-cache-entries.
    prompt_cache_bytes: int | None = None
    prompt_cache_entries: int = DEFAULT_MAX_ENTRIES
    # The prompt cache's disk tier: --prompt-cache-dir (None: none; the command line defaults
    # to prompt-cache under --data-dir), --prompt-cache-disk-bytes, -disk-ttl-secs.
    prompt_cache_dir: str | None = None
    prompt_cache_disk_bytes: int = DEFAULT_DISK_BYTES
    prompt_cache_disk_ttl: float = DEFAULT_TTL_SECONDS
    # --blas-threads (None: measured at load, model.blas_threads).
    blas_threads: int | None = None
    # --solo-decode: a sequence alone decodes outside the generator (engine/batch.py).
    solo_decode: bool = True
    # --kv-bits / --kv-group-size: the KV cache quantized (engine/kv_quant.py; None: not).
    kv_quant: KvQuant | None = None
    # --tool-format: a ``formats`` name that overrides the detected format (None: detected).
    tool_format: str | None = None
    # This server is rank 0 of a model split over several ranks (None: one process).
    sharding: Sharding | None = None
    # --seed: where MLX's random keys start once the model is warm (None: from the clock).
    seed: int | None = None
    # The seam for fault injection: tests install a GenerationThread subclass here.
    thread_factory: ThreadFactory = GenerationThread


# A rendered prompt and its sampling settings: what a response task submits is exactly what
# the generation thread is told (``model/inbound.py``), its grammar named by its text.
GenerationRequest = SequenceSpec


class SequenceControl(Protocol):
    """What a sequence asks of the model actor (``ModelHandle``) once admitted."""

    async def cancel(self, seq_id: int) -> None: ...

    async def stop(self, seq_id: int) -> None: ...


class ModelUnavailable(RuntimeError):
    """The model is shutting down or has stopped; no new sequence is admitted."""


class ModelOverloaded(RuntimeError):
    """Too many sequences are admitted already."""


class GenerationSequence:
    """A response task's view of its sequence in the batch (its output slot)."""

    def __init__(
        self, handle: SequenceControl, seq_id: int, prompt_tokens: int, slot: SequenceSlot
    ):
        self.seq_id = seq_id
        self.prompt_tokens = prompt_tokens
        self._handle = handle
        self._slot = slot

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the prompt cache served (known once the first output arrived)."""
        return self._slot.cached_tokens

    @property
    def ended(self) -> bool:
        """The thread reported the sequence's finish (it holds nothing of it any more)."""
        return self._slot.finished

    async def receive(self, linger: float = 0.0, *, prefill: bool = True) -> SequenceOutput:
        """The next coalesced output; ``trio.EndOfChannel`` after the finish was received.
        ``linger``: let output pile up for that long first (a finish ends it at once).
        ``prefill`` False: the prefill's end alone wakes nobody (it comes with the first
        token)."""
        return await self._slot.receive(linger, prefill=prefill)

    async def cancel(self) -> None:
        """Remove the sequence from the batch at the next step (no-op once it ended)."""
        if not self._slot.finished:
            await self._handle.cancel(self.seq_id)

    async def stop(self) -> None:
        """End the sequence with ``stop`` at the next step, its work kept for the next turn
        (no-op once it ended)."""
        if not self._slot.finished:
            await self._handle.stop(self.seq_id)
