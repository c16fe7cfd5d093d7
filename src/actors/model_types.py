"""What a response task holds of the model actor: its refusals and its view of its admitted
sequence (imported from ``actors.model``).

Invariants:
- Nothing here runs or holds MLX; ``GenerationSequence`` reads its slot and asks the model
  actor (through its handle) for anything else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..model.slot import SequenceOutput, SequenceSlot

if TYPE_CHECKING:
    from .model import ModelHandle


class ModelUnavailable(RuntimeError):
    """The model is shutting down or has stopped; no new sequence is admitted."""


class ModelOverloaded(RuntimeError):
    """Too many sequences are admitted already."""


class GenerationSequence:
    """A response task's view of its sequence in the batch (its output slot)."""

    def __init__(self, handle: ModelHandle, seq_id: int, prompt_tokens: int, slot: SequenceSlot):
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

    async def receive(self, linger: float = 0.0) -> SequenceOutput:
        """The next coalesced output; ``trio.EndOfChannel`` after the finish was received.
        ``linger``: let output pile up for that long first (a finish ends it at once)."""
        return await self._slot.receive(linger)

    async def cancel(self) -> None:
        """Remove the sequence from the batch at the next step (no-op once it ended)."""
        if not self._slot.finished:
            await self._handle.cancel(self.seq_id)

    async def stop(self) -> None:
        """End the sequence with ``stop`` at the next step, its work kept for the next turn
        (no-op once it ended)."""
        if not self._slot.finished:
            await self._handle.stop(self.seq_id)
