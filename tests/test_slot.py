"""SequenceSlot: a real producer thread, a Trio consumer, arbitrary pushes, consumer delays and
lingers (issue 12: a run under load lets its tokens pile up between receives).

Lingers and delays run on Trio's ``MockClock``: the slot reads only Trio's clock, so a test moves
time itself (``jump``) or lets it jump whenever every task waits (autojump), and no outcome
depends on how fast this machine is. The producer is still a real thread; since a deadline on a
MockClock would jump too, waits on it are bounded on the wall clock (``wall_deadline``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import cast

import pytest
import trio
import trio.testing
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mlx_responses.engine.slot import FinishReason, SequenceOutput, SequenceSlot, tick_after

FINISHES: list[FinishReason] = ["stop", "length", "cancelled", "shutdown", "error"]


@contextmanager
def wall_deadline(seconds: float) -> Iterator[None]:
    """``trio.fail_after`` on the wall clock: a hang guard for a test whose Trio clock is a
    MockClock (that one's deadlines jump or stand still with it)."""
    token = trio.lowlevel.current_trio_token()
    with trio.CancelScope() as scope:

        def expire() -> None:
            try:
                token.run_sync_soon(scope.cancel)
            except trio.RunFinishedError:
                pass

        timer = threading.Timer(seconds, expire)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
    if scope.cancelled_caught:
        raise trio.TooSlowError


async def consume(
    slot: SequenceSlot, delay: float, linger: float = 0.0
) -> tuple[str, int, list[FinishReason]]:
    text, tokens, finishes = "", 0, []
    while True:
        try:
            out = await slot.receive(linger)
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
    linger=st.sampled_from([0.0, 0.0005, 0.003]),
)
def test_everything_pushed_arrives_once_in_order_with_one_finish(
    pieces: list[str], finish: FinishReason, delay: float, linger: float
) -> None:
    async def main() -> None:
        slot = SequenceSlot(trio.lowlevel.current_trio_token())

        def produce() -> None:
            for piece in pieces:
                slot.push(piece, 1)
            slot.push(finish=finish)
            slot.push("after the finish is ignored", 1)

        producer = threading.Thread(target=produce)
        with wall_deadline(10):
            producer.start()
            text, tokens, finishes = await consume(slot, delay, linger)
        producer.join()
        assert text == "".join(pieces)
        assert tokens == len(pieces)
        assert finishes == [finish]

    # Delays and lingers pass as soon as every task waits: the thread races the consumer as
    # it would on a fast machine, and no step waits on the wall clock.
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


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


class CountingToken:
    """A Trio token that counts the wake-ups the producer schedules."""

    def __init__(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self.wakeups = 0

    def run_sync_soon(self, fn: Callable[[], object]) -> None:
        self.wakeups += 1
        self._token.run_sync_soon(fn)


async def test_a_lingering_consumer_gets_every_push_in_one_output_and_costs_no_wakeup(
    mock_clock: trio.testing.MockClock,
) -> None:
    token = CountingToken()
    slot = SequenceSlot(cast(trio.lowlevel.TrioToken, token))

    def produce() -> None:
        for i in range(200):  # 200 decode steps while the consumer lingers
            slot.push(str(i % 10), 1)

    result: list[SequenceOutput] = []
    with wall_deadline(10):
        async with trio.open_nursery() as nursery:

            async def consumer() -> None:
                result.append(await slot.receive(linger=0.5))

            nursery.start_soon(consumer)
            await trio.testing.wait_all_tasks_blocked()  # the consumer is lingering
            await trio.to_thread.run_sync(produce)
            await trio.testing.wait_all_tasks_blocked()
            assert result == []  # the Trio clock stands still: the linger holds every push
            mock_clock.jump(tick_after(trio.current_time(), 0.5) - trio.current_time())
    assert result[0].new_tokens == 200
    assert result[0].text == "".join(str(i % 10) for i in range(200))
    assert token.wakeups == 0  # nobody waited for plain text: no wake-up was scheduled


async def test_a_finish_ends_a_linger_at_once(mock_clock: trio.testing.MockClock) -> None:
    slot = SequenceSlot(trio.lowlevel.current_trio_token())

    def produce() -> None:
        slot.push("last words", 2)
        slot.push(finish="stop")

    outputs: list[SequenceOutput] = []
    began = trio.current_time()
    with wall_deadline(10):
        async with trio.open_nursery() as nursery:

            async def consumer() -> None:
                outputs.append(await slot.receive(linger=3600))

            nursery.start_soon(consumer)
            await trio.testing.wait_all_tasks_blocked()  # the consumer is lingering
            await trio.to_thread.run_sync(produce)
            await trio.testing.wait_all_tasks_blocked()
            # No time passed on the Trio clock: the finish, not the tick, ended the linger.
            assert trio.current_time() == began
            assert outputs, "the finish did not end the linger"
    assert outputs[0].text == "last words"
    assert outputs[0].finish == "stop"


async def test_a_cancelled_linger_leaves_the_output_for_the_next_receive(
    autojump_clock: trio.testing.MockClock,
) -> None:
    slot = SequenceSlot(trio.lowlevel.current_trio_token())
    with trio.move_on_after(0.05):
        await slot.receive(linger=3600)
    slot.push("kept", 1)
    slot.push(finish="length")
    with trio.fail_after(5):
        out = await slot.receive()
    assert (out.text, out.new_tokens, out.finish) == ("kept", 1, "length")


@settings(max_examples=200, deadline=None)
@given(
    now=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    interval=st.sampled_from([0.0005, 0.01, 0.025, 0.09, 0.25]),
)
def test_a_linger_ends_on_the_next_tick_within_one_interval(now: float, interval: float) -> None:
    tick = tick_after(now, interval)
    assert now < tick <= now + interval * (1 + 1e-9)
    later = now + (tick - now) / 2
    assume(later < tick)  # the midpoint can round onto the tick
    assert tick_after(later, interval) == tick  # a later start before the tick: the same tick


async def test_streams_that_begin_lingering_apart_wake_together_on_the_tick(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two consumers start their lingers 27 ms apart and both wake on the 100 ms tick (one
    pass of the event loop for both), then keep waking on the same ticks."""
    woke: dict[str, list[float]] = {"a": [], "b": []}
    token = trio.lowlevel.current_trio_token()
    origin = trio.current_time()

    async def stream(name: str, start: float) -> None:
        slot = SequenceSlot(token)
        await trio.sleep_until(start)
        for _ in range(3):
            slot.push("x", 1)
            await slot.receive(linger=0.1)
            woke[name].append(trio.current_time())

    first_tick = tick_after(origin + 0.1, 0.1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream, "a", first_tick - 0.087)
        nursery.start_soon(stream, "b", first_tick - 0.060)
    assert woke["a"] == woke["b"]
    assert [round(t - first_tick, 6) for t in woke["a"]] == [0.0, 0.1, 0.2]
