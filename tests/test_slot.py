"""SequenceSlot: a real producer thread, a Trio consumer, arbitrary pushes and consumer delays."""

from __future__ import annotations

import threading

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_responses.model.slot import FinishReason, SequenceSlot

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
