"""One part of the store actor's handle (responses, conversations, files, the reasoning echo):
the request/reply it shares, and the statistics that come back with each reply.

Invariants:
- Every part sends into the one store actor's mailbox; the actor answers each request exactly
  once with a ``StoreAnswer``: the outcome (a value, or the backend's exception, raised in the
  asking task) and the statistics of the part that answered, as of that answer.
- A part's ``statistics()`` is the newest snapshot a reply brought (``serial`` orders the
  actor's answers, so a task that resumes late never puts an older snapshot back). Nothing
  else is shared: no counter is read across tasks or threads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import outcome
import trio

from ..storage.interface import StoreStatistics
from .kit import Reply, ask

T = TypeVar("T")
M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class StoreAnswer(Generic[T]):
    """The store actor's reply: the result, and the answering part's statistics after it."""

    result: outcome.Outcome[T]
    statistics: StoreStatistics
    serial: int  # the actor's count of answers so far (newer answers are larger)


class StorePart(Generic[M]):
    """The typed handle of one part; its subclasses define the requests."""

    def __init__(self, mailbox: trio.MemorySendChannel[M]) -> None:
        self._mailbox = mailbox
        self._stats = StoreStatistics()
        self._serial = -1

    async def _ask(self, make: Callable[[Reply[StoreAnswer[T]]], M]) -> T:
        answer = await ask(self._mailbox, make)
        if answer.serial > self._serial:
            self._stats, self._serial = answer.statistics, answer.serial
        return answer.result.unwrap()

    async def _tell(self, make: Callable[[Reply[StoreAnswer[None]]], M]) -> None:
        """``_ask`` for a request whose answer has no value (done, or the backend's error)."""
        await self._ask(make)

    def observe(self, statistics: StoreStatistics, serial: int) -> None:
        """Keep ``statistics`` if newer than the snapshot held (the actor, at start, and
        ``_ask`` call it)."""
        if serial > self._serial:
            self._stats, self._serial = statistics, serial

    def statistics(self) -> StoreStatistics:
        """The part's statistics as of the newest reply any task received."""
        return self._stats
