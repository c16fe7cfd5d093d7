"""The actor kit: bounded mailboxes, one-shot replies and request/reply.

Invariants:
- A mailbox is a bounded Trio memory channel (capacity 0 or a small constant): a sender that
  outpaces an actor waits, it never grows a queue without bound.
- A request that expects an answer carries a ``Reply``; the actor answers exactly once with a
  value or an exception (an ``outcome``), and ``ask`` unwraps it in the caller's task, so an
  actor's refusal raises where the request was made and the actor keeps running.
- If the actor is gone (its mailbox closed), ``ask`` raises ``ActorGone``.
- An asker cancelled after its request left may still be answered (the actor reads the request
  later, or answered in the same step): with ``undo``, that late answer is taken and undone
  rather than dropped (a sequence admitted for a client that left must leave the batch).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import outcome
import trio

T = TypeVar("T")
M = TypeVar("M")

MAILBOX_SIZE = 16
# How long a cancelled asker waits for the late answer it must undo: actors answer as they
# read a request, so this bounds only an actor that stopped with the request unread.
UNDO_DEADLINE_SECONDS = 5


class ActorGone(RuntimeError):
    """The actor addressed has stopped."""


def open_mailbox(
    size: int = MAILBOX_SIZE,
) -> tuple[trio.MemorySendChannel[M], trio.MemoryReceiveChannel[M]]:
    """A bounded mailbox; the actor owns the receive side, handles hold clones of the send side."""
    return trio.open_memory_channel[M](size)


@dataclass(frozen=True, slots=True)
class Reply(Generic[T]):
    """A one-shot reply address carried inside a request message."""

    _channel: trio.MemorySendChannel[outcome.Outcome[T]]

    def send(self, value: T) -> None:
        self._deliver(outcome.Value(value))

    def deliver(self, result: outcome.Outcome[T]) -> None:
        """Answer with a value or an exception already captured."""
        self._deliver(result)

    def fail(self, error: BaseException) -> None:
        self._deliver(outcome.Error(error))

    def _deliver(self, result: outcome.Outcome[T]) -> None:
        # The channel has room for exactly one answer, so this never blocks; a caller that
        # gave up (cancelled) has closed its end, which is not the actor's problem.
        try:
            self._channel.send_nowait(result)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
            pass


async def ask(
    mailbox: trio.MemorySendChannel[M],
    make: Callable[[Reply[T]], M],
    *,
    undo: Callable[[T], Awaitable[None]] | None = None,
) -> T:
    """Send ``make(reply)`` to an actor and wait for its answer. With ``undo``, an asker
    cancelled once the request left waits (shielded, bounded) for the answer and undoes it."""
    send, receive = trio.open_memory_channel[outcome.Outcome[T]](1)
    with send, receive:
        try:
            await mailbox.send(make(Reply(send)))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ActorGone("the actor has stopped") from exc
        try:
            result = await receive.receive()
        except trio.EndOfChannel as exc:  # pragma: no cover - the actor dropped the reply
            raise ActorGone("the actor stopped before answering") from exc
        except trio.Cancelled:
            if undo is not None:
                await _undo_late(receive, undo)
            raise
    return result.unwrap()


async def _undo_late(
    receive: trio.MemoryReceiveChannel[outcome.Outcome[T]], undo: Callable[[T], Awaitable[None]]
) -> None:
    """The answer to a request whose asker was cancelled, undone if it is a value."""
    with trio.CancelScope(shield=True), trio.move_on_after(UNDO_DEADLINE_SECONDS):
        late = await receive.receive()
        if isinstance(late, outcome.Value):
            await undo(late.value)
