"""The generation thread, idle, gathers a burst (issue 12): while requests are still on their
way to the model (``Arrivals`` on its inbound stream), the first sequence waits for them, so
that the burst is prefilled together; a lone request does not wait, and a count that never
drops does not stall the batch. A new request's admission and prefill may outlast a decode
step, so the thread first sends the running sequences' lingering output (issue 37). The real
thread on the bundled model."""

from __future__ import annotations

import queue
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_responses.actors.model_port import Arrival, _Engine
from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH
from mlx_responses.engine.inbound import Admit, Arrivals, Inbound, SequenceSpec, Shutdown, Step
from mlx_responses.engine.loader import LoadedModel
from mlx_responses.engine.outbound import FactStream, Loaded
from mlx_responses.engine.slot import SequenceSlot
from mlx_responses.engine.thread import (
    GATHER_FLOOR_SECONDS,
    GATHER_SECONDS,
    GenerationThread,
    ThreadSettings,
    gather_bound,
)


class Thread:
    def __init__(self) -> None:
        self.facts = FactStream(trio.lowlevel.current_trio_token())
        self.loaded: LoadedModel | None = None
        # What the thread applied, in order, and its steps between.
        self.journal: queue.SimpleQueue[Inbound] = queue.SimpleQueue()
        self.thread = GenerationThread(
            ThreadSettings(str(BUNDLED_MODEL_PATH), prompt_cache_bytes=0),
            self.facts,
            journal=self.journal,
        )

    def insert(
        self,
        seq_id: int,
        arriving: int = 0,
        *,
        max_tokens: int = 4,
        clock: Callable[[], float] = time.perf_counter,
        prompt: tuple[int, ...] | None = None,
    ) -> SequenceSlot:
        """Admit a sequence, as the model actor does, telling the thread how many requests
        are still on their way. (The bundled model runs its prompt, by default a short one, to
        ``max_tokens``.)"""
        assert self.loaded is not None
        slot = SequenceSlot(trio.lowlevel.current_trio_token(), clock)
        if prompt is None:
            prompt = tuple(self.loaded.tokenizer.encode(f"Say hello {seq_id}."))
        spec = SequenceSpec(prompt, max_tokens, 0.0, 1.0)
        self.thread.send(Admit(seq_id, spec, slot, arriving=arriving))
        return slot

    def arriving(self, count: int) -> None:
        self.thread.send(Arrivals(count))

    def applied(self) -> list[Inbound]:
        out: list[Inbound] = []
        while not self.journal.empty():
            out.append(self.journal.get_nowait())
        return out

    def worked(self) -> bool:
        """Whether any step so far prefilled or decoded something."""
        latest = self.facts.latest()
        return bool(latest.prompt_tokens_processed or latest.tokens_generated)


@asynccontextmanager
async def running(arriving: int = 0) -> AsyncIterator[Thread]:
    model = Thread()
    model.arriving(arriving)
    model.thread.start()
    try:
        with trio.fail_after(120):
            fact = await model.facts.receive()
        assert isinstance(fact, Loaded), fact
        assert fact.loaded is not None, fact
        model.loaded = fact.loaded
        yield model
    finally:
        model.thread.send(Shutdown())
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


async def test_an_idle_batch_waits_for_a_burst_and_prefills_it_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    long_bound(monkeypatch)  # only the count ends the gathering
    async with running() as model:
        with trio.fail_after(60):
            slots = [model.insert(1, arriving=2)]
            await trio.sleep(0.05)  # the first would have been prefilled alone by now
            assert not model.worked(), "stepped while requests were on the way"
            slots.append(model.insert(2, arriving=2))  # another one set off meanwhile
            await trio.sleep(0.05)
            assert not model.worked(), "stepped while requests were on the way"
            model.arriving(1)  # an Arrivals between Admits counts too
            slots.append(model.insert(3, arriving=1))
            await trio.sleep(0.05)
            assert not model.worked(), "stepped while requests were on the way"
            model.arriving(0)  # the last one refused: the count drops to none
            ends = [await finish(slot) for slot in slots]
    assert ends == [("length", 4)] * 3
    assert model.worked()
    # One prefill for the burst: the thread took all three in before its first step.
    applied = model.applied()
    first_step = next(i for i, m in enumerate(applied) if isinstance(m, Step))
    admitted = [m.seq_id for m in applied[:first_step] if isinstance(m, Admit)]
    assert admitted == [1, 2, 3]


async def test_a_lone_request_does_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    long_bound(monkeypatch)
    async with running(0) as model:
        with trio.fail_after(60):  # far below the gathering bound
            await finish(model.insert(1))


async def test_a_count_that_never_drops_delays_the_batch_only_by_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(GenerationThread, "_gather_bound", lambda *_: 0.2)
    async with running() as model:
        with trio.fail_after(60):
            await finish(model.insert(1, arriving=5))
            await finish(model.insert(2, arriving=5))  # and again after the batch went idle
    assert model.facts.latest().sequences_finished == 2


async def test_a_new_request_first_sends_the_output_a_linger_holds() -> None:
    """The first sequence's consumer lingers on a clock that stands still, so no tick ever ends
    its linger; a second request arrives: before the admission and the prefill the thread
    flushes, and the consumer gets the tokens so far while its sequence still runs."""
    async with running() as model:
        with trio.fail_after(60):
            lingering = model.insert(1, max_tokens=300, clock=lambda: 0.0)
            first = await lingering.receive()  # the prefill's end or the first token, unheld
            assert first.finish is None
            await trio.sleep(0.02)  # decode steps: their tokens wait out the linger
            other = model.insert(2)
            held = await lingering.receive(linger=3600)
            assert held.finish is None, "the linger held the output until the sequence ended"
            assert first.new_tokens + held.new_tokens < 300
            assert await finish(other) == ("length", 4)
            assert await finish(lingering) == ("length", 300 - first.new_tokens - held.new_tokens)


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
    however often ``done`` is called (the ``arriving`` block calls it again at its end). The
    thread hears the count in each ``Admit`` (``admitting``) and, once a count it was told
    drops to none, ``Arrivals(0)``; arrivals it was never told of send nothing."""
    sent: list[Inbound] = []

    class Port:
        send = sent.append

    class Worker:
        thread = Port()

    engine = _Engine(Worker())  # type: ignore[arg-type]
    lone = Arrival(engine)
    lone.done()
    assert sent == []  # a lone request: its Admit carries 0, nothing else is sent
    first, second = Arrival(engine), Arrival(engine)
    assert engine.arriving == 2
    assert engine.admitting() == 2  # an Admit sent now tells the thread of two
    first.done()
    first.done()
    assert engine.arriving == 1
    second.done()
    assert engine.arriving == 0
    assert sent == [Arrivals(0)]
    # The last of a burst, admitted: its Admit (sent next) carries the count, nothing before it.
    first, second = Arrival(engine), Arrival(engine)
    assert engine.admitting() == 2
    first.admitted()
    second.admitted()
    second.done()
    assert engine.arriving == 0
    assert sent == [Arrivals(0)]


def record_sent(
    monkeypatch: pytest.MonkeyPatch, on_admit: Callable[[], object] | None = None
) -> list[str]:
    """What the model actor sends the real thread about arrivals, in order (``Admit(count)``,
    ``Arrivals(count)``); ``on_admit`` runs on the Trio thread after each ``Admit``."""
    sent: list[str] = []
    send = GenerationThread.send
    token = trio.lowlevel.current_trio_token()

    def recording(self: GenerationThread, message: Inbound) -> None:
        if isinstance(message, Arrivals):
            sent.append(f"Arrivals({message.count})")
        elif isinstance(message, Admit):
            sent.append(f"Admit({message.arriving})")
            if on_admit is not None:
                token.run_sync_soon(on_admit)
        send(self, message)

    monkeypatch.setattr(GenerationThread, "send", recording)
    return sent


async def test_a_request_is_no_longer_on_its_way_when_its_sequence_reaches_the_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the real server: the model actor marks a request's arrival done as it sends the
    request's ``Admit``, which tells the thread that none is on its way: one message, and the
    thread steps at once rather than gathering until the response task's own ``done``."""
    import httpx2 as httpx

    from mlx_responses.server import ServerHandle, serve

    from .conftest import MODEL, START_DEADLINE, server_settings

    sent = record_sent(monkeypatch)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(START_DEADLINE):
            server: ServerHandle = await nursery.start(serve, server_settings())
        with trio.fail_after(60):
            async with httpx.AsyncClient(base_url=server.base_url) as http:
                body = {"model": MODEL, "input": "Say hello.", "max_output_tokens": 2}
                assert (await http.post("/v1/responses", json=body)).status_code == 200
        server.shutdown()
    assert sent == ["Admit(0)"]


async def test_a_request_being_prepared_counts_as_on_its_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the real server: a create counts as on its way to the model once its body has
    been read, before its response task exists. The event loop prepares a burst's requests one
    after another; here the second one's opening waits until the first has reached the
    thread, which it tells that one more is coming (so it gathers for it), and the second's
    ``Admit`` follows with nothing sent between. Before, a create counted only once its
    response task began, and a burst's first request prefilled alone."""
    import httpx2 as httpx

    from mlx_responses.actors.supervisor import ResponseSupervisorHandle
    from mlx_responses.server import ServerHandle, serve

    from .conftest import MODEL, START_DEADLINE, server_settings

    first_sent, second_opening = trio.Event(), trio.Event()
    sent = record_sent(monkeypatch, on_admit=first_sent.set)
    opening = ResponseSupervisorHandle.open

    async def late_second(self: ResponseSupervisorHandle, request: Any, *args: Any) -> Any:
        if "second" in repr(request.input):
            second_opening.set()
            await first_sent.wait()  # the loop is still busy with the first
        return await opening(self, request, *args)

    monkeypatch.setattr(ResponseSupervisorHandle, "open", late_second)
    statuses: list[int] = []
    async with trio.open_nursery() as nursery:
        with trio.fail_after(START_DEADLINE):
            server: ServerHandle = await nursery.start(serve, server_settings())
        with trio.fail_after(60):
            async with (
                httpx.AsyncClient(base_url=server.base_url) as http,
                trio.open_nursery() as both,
            ):

                async def create(text: str) -> None:
                    body = {"model": MODEL, "input": text, "max_output_tokens": 2}
                    statuses.append((await http.post("/v1/responses", json=body)).status_code)

                both.start_soon(create, "Say hello, second.")
                await second_opening.wait()  # its body is read; its opening waits
                both.start_soon(create, "Say hello, first.")
        server.shutdown()
    assert statuses == [200, 200]
    assert sent == ["Admit(1)", "Admit(0)"]


async def test_a_burst_that_fills_a_prefill_does_not_wait_for_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The count says more requests are on their way and never drops, and no bound ends the
    gathering; once a prefill's worth of sequences (``prefill_batch_size``) is in, the thread
    steps: the rest would prefill after those anyway."""
    long_bound(monkeypatch)
    async with running() as model:
        assert model.loaded is not None
        assert model.loaded.sizes is not None
        size = model.loaded.sizes.prefill_batch_size
        with trio.fail_after(30):  # far below the gathering bound
            slots = [model.insert(seq_id, arriving=size) for seq_id in range(1, size + 1)]
            ends = [await finish(slot) for slot in slots]
    assert all(reason in ("length", "stop") for reason, _ in ends), ends
    applied = model.applied()
    first_step = next(i for i, m in enumerate(applied) if isinstance(m, Step))
    assert [m.seq_id for m in applied[:first_step] if isinstance(m, Admit)] == list(
        range(1, size + 1)
    )
