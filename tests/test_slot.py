"""SequenceSlot: a real producer thread, a Trio consumer, arbitrary pushes and consumer delays."""

from __future__ import annotations

import threading

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_responses.model.slot import FinishReason, SequenceSlot, wake_together

FINISHES: list[FinishReason] = ["stop", "length", "cancelled", "shutdown", "error"]


async def consume(slot: SequenceSlot, delay: float) -> tuple[str, int, list[FinishReason]]:
    text, tokens, finishes = "", 0, []
    while True:
        try:
            out = await slot.receive()
        except trio.EndOfChannel:
            return text, tokens, finishes
        text += out.text
        tokens += out.new_tokens
        if out.finish is not None:
            finishes.append(out.finish)
        await trio.sleep(delay)


@settings(max_examples=30, deadline=None)
@given(
    pieces=st.lists(st.text(max_size=5), max_size=40),
    finish=st.sampled_from(FINISHES),
    delay=st.sampled_from([0.0, 0.0005, 0.002]),
)
def test_everything_pushed_arrives_once_in_order_with_one_finish(
    pieces: list[str], finish: FinishReason, delay: float
) -> None:
    async def main() -> None:
        slot = SequenceSlot(trio.lowlevel.current_trio_token())

        def produce() -> None:
            for piece in pieces:
                slot.push(piece, 1)
            slot.push(finish=finish)
            slot.push("after the finish is ignored", 1)

        producer = threading.Thread(target=produce)
        with trio.fail_after(10):
            producer.start()
            text, tokens, finishes = await consume(slot, delay)
        producer.join()
        assert text == "".join(pieces)
        assert tokens == len(pieces)
        assert finishes == [finish]

    trio.run(main)


async def test_a_slow_consumer_gets_coalesced_output_and_never_blocks_the_producer() -> None:
    slot = SequenceSlot(trio.lowlevel.current_trio_token())
    for i in range(1000):  # the producer runs ahead; no consumer is waiting
        slot.push(str(i % 10), 1)
    with trio.fail_after(5):
        first = await slot.receive()
    assert first.new_tokens == 1000
    assert len(first.text) == 1000
    slot.push(finish="stop")
    with trio.fail_after(5):
        last = await slot.receive()
        assert last.finish == "stop"
        with pytest.raises(trio.EndOfChannel):
            await slot.receive()


@settings(max_examples=30, deadline=None)
@given(
    steps=st.lists(st.lists(st.text(max_size=4), min_size=3, max_size=3), max_size=20),
    delay=st.sampled_from([0.0, 0.001]),
)
def test_slots_woken_together_once_per_step_lose_nothing(
    steps: list[list[str]], delay: float
) -> None:
    """A producer that defers its wake-ups and wakes a step's slots in one call (as the
    generation thread does) delivers every piece to every consumer, in order, once."""

    async def main() -> None:
        token = trio.lowlevel.current_trio_token()
        slots = [SequenceSlot(token) for _ in range(3)]

        def produce() -> None:
            for step in steps:
                owed = [
                    s for s, piece in zip(slots, step, strict=True) if s.push(piece, 1, defer=True)
                ]
                wake_together(owed)
            wake_together([s for s in slots if s.push(finish="stop", defer=True)])

        results: list[tuple[str, int, list[FinishReason]]] = [("", 0, [])] * 3
        producer = threading.Thread(target=produce)
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for i, slot in enumerate(slots):

                    async def one(i: int = i, slot: SequenceSlot = slot) -> None:
                        results[i] = await consume(slot, delay)

                    nursery.start_soon(one)
                producer.start()
        producer.join()
        for i, (text, tokens, finishes) in enumerate(results):
            assert text == "".join(step[i] for step in steps)
            assert tokens == len(steps)
            assert finishes == ["stop"]

    trio.run(main)


def test_a_deferred_push_owes_one_wake_up_until_the_consumer_takes() -> None:
    async def main() -> None:
        slot = SequenceSlot(trio.lowlevel.current_trio_token())
        assert slot.push("a", 1, defer=True) is True
        assert slot.push("b", 1, defer=True) is False  # the first one's wake-up covers it
        wake_together([slot])
        with trio.fail_after(5):
            out = await slot.receive()
        assert (out.text, out.new_tokens) == ("ab", 2)
        assert slot.push("c", 1, defer=True) is True  # taken: a new wake-up is owed
        assert slot.push("d", 1) is False  # not deferred: scheduled by push itself
        wake_together([])  # nothing to wake is fine

    trio.run(main)
