"""A sequence's finish reaches its consumer only after the generation thread has published
statistics without it: a response that has ended (its client answered) is never still counted
by its model's statistics (``/health``, ``/metrics``, the status page). The real thread on the
bundled model; each slot notes the latest published statistics as its finish is pushed."""

from __future__ import annotations

from typing import Any

import trio

from mlx_responses.engine.inbound import Admit, Cancel, SequenceSpec
from mlx_responses.engine.outbound import FactStream, ModelStatistics
from mlx_responses.engine.slot import SequenceSlot

from .test_gather import Thread, finish, running


class Noting(SequenceSlot):
    """A slot that notes the statistics published when its finish is pushed."""

    def __init__(self, facts: FactStream) -> None:
        super().__init__(trio.lowlevel.current_trio_token())
        self.facts = facts
        self.seen: ModelStatistics | None = None

    def push(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("finish") is not None and self.seen is None:
            self.seen = self.facts.latest()  # on the generation thread, as the finish goes
        super().push(*args, **kwargs)


def admit(model: Thread, seq_id: int, max_tokens: int) -> Noting:
    assert model.loaded is not None
    slot = Noting(model.facts)
    prompt = tuple(model.loaded.tokenizer.encode(f"Say hello {seq_id}."))
    model.thread.send(Admit(seq_id, SequenceSpec(prompt, max_tokens, 0.0, 1.0), slot))
    return slot


async def test_a_finished_sequence_is_out_of_the_statistics_when_its_finish_arrives() -> None:
    async with running() as model:
        with trio.fail_after(60):
            slots = {seq_id: admit(model, seq_id, 3 + seq_id) for seq_id in (1, 2)}
            for seq_id, slot in slots.items():
                reason, _ = await finish(slot)
                assert reason in ("length", "stop")
                assert slot.seen is not None
                assert seq_id not in slot.seen.active_ids, slot.seen


async def test_a_cancelled_sequence_is_out_of_the_statistics_when_its_finish_arrives() -> None:
    async with running() as model:
        with trio.fail_after(60):
            slot = admit(model, 1, 100_000)
            while (await slot.receive()).new_tokens == 0:  # decoding
                pass
            model.thread.send(Cancel(1))
            reason, _ = await finish(slot)
            assert reason == "cancelled"
            assert slot.seen is not None
            assert 1 not in slot.seen.active_ids, slot.seen
            assert slot.seen.active == 0
