"""The generation thread, idle, gathers a burst (issue 12): while requests are still on their
way to the model (``arriving``), the first sequence waits for them, so that the burst is
prefilled together; a lone request does not wait, and a count that never drops does not
stall the batch. The real thread on the bundled model."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_responses.actors.model import Arrival, _Board
from mlx_responses.model.bundled_model import BUNDLED_MODEL_PATH
from mlx_responses.model.loader import LoadedModel
from mlx_responses.model.slot import SequenceSlot
from mlx_responses.model.thread import (
    GATHER_FLOOR_SECONDS,
    GATHER_SECONDS,
    GenerationThread,
    InsertSequence,
    ModelStatistics,
    StopGeneration,
    ThreadSettings,
    gather_bound,
)

from .conftest import wait_until


class Thread:
    def __init__(self, arriving: Callable[[], int]) -> None:
        self.snapshots: list[ModelStatistics] = []
        self.ready = threading.Event()
        self.loaded: LoadedModel | None = None

        def on_loaded(loaded: LoadedModel | None, _error: BaseException | None) -> None:
            self.loaded = loaded
            self.ready.set()

        self.thread = GenerationThread(
            ThreadSettings(str(BUNDLED_MODEL_PATH), prompt_cache_bytes=0),
            on_loaded=on_loaded,
            on_ended=lambda _seq_id: None,
            on_statistics=self.snapshots.append,  # list.append: safe from the thread
            on_exit=lambda _error: None,
            arriving=arriving,
        )

    def insert(self, seq_id: int) -> SequenceSlot:
        assert self.loaded is not None
        slot = SequenceSlot(trio.lowlevel.current_trio_token())
        prompt = tuple(self.loaded.tokenizer.encode(f"Say hello {seq_id}."))
        self.thread.send(InsertSequence(seq_id, prompt, 4, 0.0, 1.0, slot))
        return slot


@asynccontextmanager
async def running(arriving: Callable[[], int]) -> AsyncIterator[Thread]:
    model = Thread(arriving)
    model.thread.start()
    try:
        with trio.fail_after(120):
            await trio.to_thread.run_sync(model.ready.wait)
        assert model.loaded is not None
        yield model
    finally:
        model.thread.send(StopGeneration())
        await trio.to_thread.run_sync(model.thread.join, 60)


async def finish(slot: SequenceSlot) -> tuple[str | None, int]:
    """Read the slot to its end: its finish reason and the tokens it generated."""
    finish_reason: str | None = None
    tokens = 0
    while True:
        try:
            out = await slot.receive()
        except trio.EndOfChannel:
            return finish_reason, tokens
        tokens += out.new_tokens
        finish_reason = out.finish or finish_reason


def long_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten minutes of gathering allowed: whatever ends it earlier is the count."""
    monkeypatch.setattr(GenerationThread, "_gather_bound", lambda *_: 600.0)


def worked(snapshots: list[ModelStatistics]) -> bool:
    """Whether any step so far prefilled or decoded something."""
    return any(s.prefilling or s.decoding for s in list(snapshots))


async def test_an_idle_batch_waits_for_a_burst_and_prefills_it_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    long_bound(monkeypatch)  # only the count ends the gathering
    on_the_way = [2]
    reads = [0]

    def arriving() -> int:
        reads[0] += 1  # the thread reads the count only while its idle batch gathers
        return on_the_way[0]

    async with running(arriving) as model:
        with trio.fail_after(60):
            slots = [model.insert(1)]
            for seq_id in (2, 3):
                # The thread goes on gathering, holding what it has, rather than prefilling it
                # alone: it reads the count again and again (a pass of its inbox poll each).
                before = reads[0]
                await wait_until(lambda: reads[0] >= before + 10)  # noqa: B023 - awaited here
                assert not worked(model.snapshots), "stepped while requests were on the way"
                slots.append(model.insert(seq_id))
                on_the_way[0] -= 1
            ends = [await finish(slot) for slot in slots]
    assert ends == [("length", 4)] * 3
    assert worked(model.snapshots)


async def test_a_lone_request_does_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    long_bound(monkeypatch)
    async with running(lambda: 0) as model:
        with trio.fail_after(60):  # far below the gathering bound
            await finish(model.insert(1))


async def test_a_count_that_never_drops_delays_the_batch_only_by_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(GenerationThread, "_gather_bound", lambda *_: 0.2)
    async with running(lambda: 5) as model:
        with trio.fail_after(60):
            await finish(model.insert(1))
            await finish(model.insert(2))  # and again after the batch went idle
    assert model.snapshots[-1].sequences_finished == 2


@settings(max_examples=200, deadline=None)
@given(
    seconds=st.floats(min_value=0, max_value=1e4, allow_nan=False),
    measured=st.integers(min_value=0, max_value=10**7),
    tokens=st.integers(min_value=0, max_value=10**6),
)
def test_the_gathering_bound_is_the_first_prefill_between_the_floor_and_the_cap(
    seconds: float, measured: int, tokens: int
) -> None:
    bound = gather_bound(seconds, measured, tokens)
    assert GATHER_FLOOR_SECONDS <= bound <= GATHER_SECONDS
    if measured and seconds:
        estimate = seconds / measured * max(tokens, 1)
        if GATHER_FLOOR_SECONDS <= estimate <= GATHER_SECONDS:
            assert bound == estimate
        else:  # a prefill cheaper than the floor waits the floor; a dearer one the cap
            assert bound == (
                GATHER_FLOOR_SECONDS if estimate < GATHER_FLOOR_SECONDS else GATHER_SECONDS
            )
        assert gather_bound(seconds, measured, tokens + 1) >= bound  # a longer prefill, longer
    else:
        assert bound == GATHER_SECONDS  # nothing measured yet: the cap


def test_an_arrival_counts_once_until_done() -> None:
    """A compacting request calls ``done`` before its summary generates; the count drops once,
    however often ``done`` is called (the ``arriving`` block calls it again at its end)."""
    board = _Board()
    first, second = Arrival(board), Arrival(board)
    assert board.arriving == 2
    first.done()
    first.done()
    assert board.arriving == 1
    second.done()
    assert board.arriving == 0
