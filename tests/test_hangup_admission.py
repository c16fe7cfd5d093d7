"""A client that leaves while its sequence is being admitted leaves nothing in the batch, and
one that leaves while its WebSocket connection is being counted leaves no count behind.

The window: a response task has sent its ``Submit`` to the model actor and waits for the
answer when its client hangs up (its task is cancelled). The model actor, which has not read
the ``Submit`` yet, admits the sequence and answers a task that is gone. Nobody reads or cancels
that sequence: it generates to its end and holds one of ``--max-sequences`` admissions all that
time, so a hang-up storm at a small ``--max-sequences`` refuses later requests with 503. The
asker must take the late answer and cancel the sequence.

Both orders of the two events are driven exactly: the asker's cancellation runs before the
actor answers, or the actor answers in the same step as the cancellation (the answer then
waits in the reply channel of a task that is already cancelled).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from mlx_responses.actors.kit import Reply, ask
from mlx_responses.actors.model import GenerationRequest, ModelHandle, Submit
from mlx_responses.actors.supervisor import OpenSocket
from mlx_responses.server import ServerHandle

from .conftest import WAIT_DEADLINE

DEADLINE = 60


@pytest.mark.parametrize("answer_first", [False, True])
async def test_an_answer_that_comes_after_the_asker_was_cancelled_is_undone(
    answer_first: bool,
) -> None:
    send, receive = trio.open_memory_channel[Reply[str]](1)
    undone: list[str] = []

    async def undo(value: str) -> None:
        undone.append(value)

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()

            async def asker() -> None:
                with scope:
                    await ask(send, lambda reply: reply, undo=undo)
                    raise AssertionError("the asker was cancelled: it gets no answer")

            nursery.start_soon(asker)
            reply = await receive.receive()  # the request is in hand, not answered
            scope.cancel()
            if not answer_first:
                await trio.testing.wait_all_tasks_blocked()  # the asker saw its cancellation
            reply.send("sequence 1")
    assert undone == ["sequence 1"]


async def test_a_refusal_after_the_asker_was_cancelled_needs_no_undo() -> None:
    send, receive = trio.open_memory_channel[Reply[str]](1)
    undone: list[str] = []

    async def undo(value: str) -> None:
        undone.append(value)

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()

            async def asker() -> None:
                with scope:
                    await ask(send, lambda reply: reply, undo=undo)

            nursery.start_soon(asker)
            reply = await receive.receive()
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            reply.fail(RuntimeError("the queue is full"))
    assert undone == []


async def _submit_cancelled_in_flight(model: ModelHandle, answer_first: bool) -> None:
    """``model.submit`` whose task is cancelled after its ``Submit`` left and before the model
    actor read it: the message is held here, then handed to the actor."""
    held, holding = trio.open_memory_channel[Any](1)
    actor = model._mailbox
    prompt = tuple(
        await model.prompts.render([{"role": "user", "content": "Count from 1 to 110."}])
    )
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def client() -> None:
            with scope:
                await model.submit(GenerationRequest(prompt, 400, 0.0, 1.0))

        model._mailbox = held
        try:
            nursery.start_soon(client)
            submit = await holding.receive()
        finally:
            model._mailbox = actor
        assert isinstance(submit, Submit)
        scope.cancel()
        if not answer_first:
            await trio.testing.wait_all_tasks_blocked()
        await actor.send(submit)


@pytest.mark.parametrize("answer_first", [False, True])
async def test_a_sequence_admitted_for_a_client_that_left_leaves_the_batch(
    server: ServerHandle, answer_first: bool
) -> None:
    model = server.model
    before = model.statistics()
    with trio.fail_after(DEADLINE):
        await _submit_cancelled_in_flight(model, answer_first)
    with trio.fail_after(WAIT_DEADLINE):
        await model.wait_idle()
    after = model.statistics()
    # It was admitted, then cancelled; it did not generate to its end unread.
    assert after.sequences_cancelled - before.sequences_cancelled == 1
    assert after.sequences_finished == before.sequences_finished
    assert after.admitted == 0


@pytest.mark.parametrize("answer_first", [False, True])
async def test_a_websocket_counted_for_a_client_that_left_is_uncounted(
    server: ServerHandle, answer_first: bool
) -> None:
    """The same window on the connection limit: an upgrade cancelled while the supervisor
    counts it would hold one of the tenant's connections for good (429s after the limit)."""
    responses = server.responses
    held, holding = trio.open_memory_channel[Any](1)
    supervisor = responses._mailbox
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()

            async def upgrade() -> None:
                with scope:
                    await responses.open_socket("tenant")

            responses._mailbox = held
            try:
                nursery.start_soon(upgrade)
                message = await holding.receive()
            finally:
                responses._mailbox = supervisor
            assert isinstance(message, OpenSocket)
            scope.cancel()
            if not answer_first:
                await trio.testing.wait_all_tasks_blocked()
            await supervisor.send(message)
        await responses.running()  # answered after everything the upgrade sent
    assert responses.statistics().sockets == 0
