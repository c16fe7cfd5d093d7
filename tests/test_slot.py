"""SequenceSlot: a real producer thread, a Trio consumer, arbitrary pushes, consumer delays and
lingers (issue 12: a run under load lets its tokens pile up between receives).

A linger ends on the producer's first push after its tick, on the clock the slot is given: the
tests give it a ``ManualClock`` and move it themselves, so no outcome depends on how fast this
machine is. Consumer delays run on Trio's ``MockClock``. The producer is still a real thread;
since a deadline on a MockClock would jump too, waits on it are bounded on the wall clock
(``wall_deadline``)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, cast

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


@asynccontextmanager
async def receiving(
    slot: SequenceSlot, outputs: list[SequenceOutput], **receive: Any
) -> AsyncIterator[None]:
    """A consumer in one ``slot.receive(**receive)``, already waiting when the body runs; what
    it receives is appended to ``outputs``. The block ends once it has received."""
    async with trio.open_nursery() as nursery:

        async def consumer() -> None:
            outputs.append(await slot.receive(**receive))

        nursery.start_soon(consumer)
        await trio.testing.wait_all_tasks_blocked()
        yield


class ManualClock:
    """The slot's clock, moved by the test (read by the producer thread and the consumer)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_a_lingering_consumer_gets_every_push_before_the_tick_in_one_output() -> None:
    """200 decode steps of 1 ms while the consumer lingers wake nobody; the last push before
    the tick (its next is due after it) wakes it once, with all of them."""
    token = CountingToken()
    clock = ManualClock(0.0)
    slot = SequenceSlot(cast(trio.lowlevel.TrioToken, token), clock)

    def produce(steps: int) -> None:
        for i in range(steps):
            clock.now += 0.001
            slot.push(str(i % 10), 1)

    result: list[SequenceOutput] = []
    with trio.fail_after(10):
        async with receiving(slot, result, linger=0.5):  # the consumer is lingering
            await trio.to_thread.run_sync(produce, 200)
            await trio.testing.wait_all_tasks_blocked()
            assert result == []  # before the tick: every push waits in the slot
            assert token.wakeups == 0  # and none scheduled a wake-up
            clock.now = 0.499
            await trio.to_thread.run_sync(produce, 1)  # the last step before the tick
    assert result[0].new_tokens == 201
    assert result[0].text == "".join(str(i % 10) for i in range(200)) + "0"
    assert token.wakeups == 1


def stepper(slot: SequenceSlot, clock: ManualClock) -> Callable[[float], None]:
    """A decode step ending at ``at`` on ``clock``: the producer pushes its one token."""

    def step(at: float) -> None:
        clock.now = at
        slot.push("x", 1)

    return step


async def test_a_consumer_woken_just_before_its_tick_lingers_to_the_next_one() -> None:
    """Steps of 1 ms against a 25 ms linger: the push at 24.5 ms wakes the consumer (its next
    is due after the tick), which begins its next linger at 24.7 ms, before that tick. The push
    on the tick and the 24 after it wake nobody; the one before the 50 ms tick wakes it with
    all 25. Before, that linger ended on the 25 ms tick again: the push on it woke the
    consumer with one token alone, a third of a lone stream's deltas."""
    token = CountingToken()
    clock = ManualClock(0.0005)
    slot = SequenceSlot(cast(trio.lowlevel.TrioToken, token), clock)
    step = stepper(slot, clock)

    outputs: list[SequenceOutput] = []
    with trio.fail_after(10):
        async with receiving(slot, outputs, linger=0.025):
            for at in range(1, 25):  # 1 ms .. 24 ms: the last one's next is due on the tick
                await trio.to_thread.run_sync(step, at / 1000 + 0.0005)
        assert [o.new_tokens for o in outputs] == [24]
        clock.now = 0.0247  # the consumer has sent its delta: still before the tick
        async with receiving(slot, outputs, linger=0.025):
            for at in range(25, 49):  # 25 ms (on the tick) .. 48 ms: nobody is woken
                await trio.to_thread.run_sync(step, at / 1000 + 0.0005)
                await trio.testing.wait_all_tasks_blocked()
                assert len(outputs) == 1, f"woken by the push at {at} ms"
            await trio.to_thread.run_sync(step, 0.0495)  # the last push before the 50 ms tick
    assert [o.new_tokens for o in outputs] == [24, 25]
    assert token.wakeups == 2


async def test_a_flush_forgets_the_tick_the_next_linger_ends_on_it() -> None:
    """A flush (before a prefill) wakes the consumer 5.5 ms before its 25 ms tick; its next
    linger, begun before that tick, still ends on it, not on the next one."""
    clock = ManualClock(0.0)
    slot = SequenceSlot(trio.lowlevel.current_trio_token(), clock)
    step = stepper(slot, clock)

    outputs: list[SequenceOutput] = []
    with trio.fail_after(10):
        async with receiving(slot, outputs, linger=0.025):
            for at in range(1, 20):  # 1 ms .. 19 ms: all due before the tick
                await trio.to_thread.run_sync(step, at / 1000)
            await trio.testing.wait_all_tasks_blocked()
            assert outputs == []
            clock.now = 0.0195
            await trio.to_thread.run_sync(slot.flush)
        clock.now = 0.0197
        async with receiving(slot, outputs, linger=0.025):
            for at in range(20, 24):
                await trio.to_thread.run_sync(step, at / 1000)
            await trio.testing.wait_all_tasks_blocked()
            assert len(outputs) == 1
            await trio.to_thread.run_sync(step, 0.024)  # its next is due on the tick
    assert [o.new_tokens for o in outputs] == [19, 5]


async def test_a_step_that_would_end_past_the_tick_does_not_hold_the_output() -> None:
    """A slow model: steps of 300 ms against a 500 ms linger. The push at 300 ms wakes the
    consumer, since the next one is due after the tick; its token is not held a step."""
    clock = ManualClock(0.0)
    slot = SequenceSlot(trio.lowlevel.current_trio_token(), clock)
    outputs: list[SequenceOutput] = []
    with trio.fail_after(10):
        async with receiving(slot, outputs, linger=0.5):
            clock.now = 0.3
            await trio.to_thread.run_sync(slot.push, "slow", 1)
    assert [o.text for o in outputs] == ["slow"]


async def test_a_finish_ends_a_linger_at_once() -> None:
    clock = ManualClock(0.0)  # stands still: the tick never comes
    slot = SequenceSlot(trio.lowlevel.current_trio_token(), clock)

    def produce() -> None:
        slot.push("last words", 2)
        slot.push(finish="stop")

    outputs: list[SequenceOutput] = []
    with trio.fail_after(10):
        async with receiving(slot, outputs, linger=3600):  # the consumer is lingering
            await trio.to_thread.run_sync(produce)
    assert outputs[0].text == "last words"
    assert outputs[0].finish == "stop"


async def test_a_flush_ends_a_linger_and_sends_what_waits() -> None:
    """Before a step that may be long (a prefill), the producer flushes: output that waits out
    a linger goes at once; an empty slot wakes nobody, and its next push goes at once."""
    token = CountingToken()
    clock = ManualClock(0.0)  # stands still: only the flush ends the linger
    slot = SequenceSlot(cast(trio.lowlevel.TrioToken, token), clock)
    outputs: list[SequenceOutput] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def consumer() -> None:
                for _ in range(2):
                    outputs.append(await slot.receive(linger=3600))

            nursery.start_soon(consumer)
            await trio.testing.wait_all_tasks_blocked()
            await trio.to_thread.run_sync(slot.push, "held", 1)
            await trio.testing.wait_all_tasks_blocked()
            assert outputs == []
            await trio.to_thread.run_sync(slot.flush)
            await trio.testing.wait_all_tasks_blocked()
            assert [o.text for o in outputs] == ["held"]
            await trio.to_thread.run_sync(slot.flush)  # nothing waits: no wake-up
            await trio.testing.wait_all_tasks_blocked()
            assert token.wakeups == 1
            await trio.to_thread.run_sync(slot.push, "next", 1)
    assert [o.text for o in outputs] == ["held", "next"]
    assert token.wakeups == 2


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


async def test_streams_that_begin_lingering_apart_wake_together_on_the_tick() -> None:
    """Two consumers start their lingers 27 ms apart; the pushes of the steps before the 100 ms
    tick wake neither, the step on the tick wakes both, with everything since."""
    clock = ManualClock(0.013)
    token = trio.lowlevel.current_trio_token()
    slots = {"a": SequenceSlot(token, clock), "b": SequenceSlot(token, clock)}
    outputs: dict[str, list[SequenceOutput]] = {"a": [], "b": []}

    async def stream(name: str) -> None:
        outputs[name].append(await slots[name].receive(linger=0.1))

    def step() -> None:
        for slot in slots.values():
            slot.push("x", 1)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream, "a")
            await trio.testing.wait_all_tasks_blocked()
            clock.now = 0.040
            nursery.start_soon(stream, "b")
            await trio.testing.wait_all_tasks_blocked()
            for now in (0.05, 0.06, 0.07):  # 10 ms steps: the next one is due before 0.1
                clock.now = now
                await trio.to_thread.run_sync(step)
            await trio.testing.wait_all_tasks_blocked()
            assert outputs == {"a": [], "b": []}
            clock.now = 0.1
            await trio.to_thread.run_sync(step)
    assert [o.new_tokens for o in outputs["a"]] == [4]
    assert [o.new_tokens for o in outputs["b"]] == [4]


async def test_a_consumer_that_does_not_want_the_prefill_end_wakes_for_the_first_token() -> None:
    """A response already in progress: the prefill's end wakes nobody; it comes with the first
    token, one wake-up for both. A consumer that wants it (a background response still
    queued) is woken by it alone."""
    token = CountingToken()
    slot = SequenceSlot(cast(trio.lowlevel.TrioToken, token))
    outputs: list[SequenceOutput] = []
    with trio.fail_after(10):
        async with receiving(slot, outputs, prefill=False):
            await trio.to_thread.run_sync(lambda: slot.push(prefill_done=True))
            await trio.testing.wait_all_tasks_blocked()
            assert outputs == []
            assert token.wakeups == 0
            await trio.to_thread.run_sync(lambda: slot.push("first", 1, prefill_done=True))
    assert [(o.text, o.prefill_done) for o in outputs] == [("first", True)]
    assert token.wakeups == 1

    wanting = SequenceSlot(trio.lowlevel.current_trio_token())
    with trio.fail_after(10):
        async with receiving(wanting, outputs):
            await trio.to_thread.run_sync(lambda: wanting.push(prefill_done=True))
    assert (outputs[-1].text, outputs[-1].prefill_done, outputs[-1].new_tokens) == ("", True, 0)


class BrokenDetokenizer:
    """A streaming detokenizer that fails on token 13."""

    def __init__(self) -> None:
        self.text = ""
        self.offset = 0

    def add_token(self, token: int) -> None:
        if token == 13:
            raise ValueError("no token 13")
        self.text += f"<{token}>"

    def finalize(self) -> None:
        pass

    @property
    def last_segment(self) -> str:
        segment, self.offset = self.text[self.offset :], len(self.text)
        return segment


async def test_a_detokenizer_that_fails_on_the_consumer_ends_its_output_with_an_error() -> None:
    """The consumer receives the text before the failing token, then an ``error`` finish and
    nothing more; the slot is not ``finished`` (the sequence is still in the batch, so a
    cancel still reaches it) until the producer's finish."""
    slot = SequenceSlot(trio.lowlevel.current_trio_token())
    slot.detokenize_with(BrokenDetokenizer())
    with trio.fail_after(10):
        slot.push(new_tokens=1, token=7)
        first = await slot.receive()
        assert (first.text, first.finish) == ("<7>", None)
        slot.push(new_tokens=1, token=13)
        failed = await slot.receive()
        assert failed.finish == "error"
        assert "no token 13" in str(failed.error)
        assert failed.text == ""
        assert not slot.finished
        slot.push(new_tokens=1, token=8)  # the batch goes on until the cancel reaches it
        slot.push(finish="cancelled")
        assert slot.finished
        with pytest.raises(trio.EndOfChannel):
            await slot.receive()
