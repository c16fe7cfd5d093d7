"""Running responses: each one's event log, and the registry actor that finds them by id.

Invariants:
- An ``EventLog`` has exactly one writer, the response actor that owns it; any number of
  readers (a replaying ``GET ?stream=true``) wait on it. Events are only appended, never
  changed; ``close`` is final and wakes every reader.
- The registry actor is the only owner of the id -> log index; others ask by message. A closed
  log is pruned on the next message (unless it is retained for a while, as a ``store: false``
  background job's final object is), so the registry rarely answers with a finished response;
  when it does, the log holds every event up to the terminal one. A stored response's final
  object is in the response store before its log closes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from ..storage.interface import scoped
from .kit import Reply, ask, open_mailbox

JsonObject = dict[str, Any]


class EventLog:
    """The events of one running response, in order (single writer, many readers)."""

    def __init__(
        self,
        response_id: str,
        snapshot: Callable[[], JsonObject],
        cancel: Callable[[], None],
        owner: str = "",
    ) -> None:
        self.response_id = response_id
        self.owner = owner
        self.key = scoped(owner, response_id)
        self._snapshot = snapshot
        self._cancel = cancel
        self._events: list[JsonObject] = []
        self._closed = False
        self._changed = trio.Event()
        # A closed log stays findable until then (trio clock), e.g. a store: false job's
        # final object (spec 000: --responses-background-ephemeral-ttl-secs).
        self.retain_until: float | None = None

    def request_cancel(self) -> None:
        """Ask the owning response to cancel (the cancel endpoint). Never blocks."""
        if not self._closed:
            self._cancel()

    async def wait_closed(self) -> None:
        while not self._closed:
            await self._changed.wait()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def events(self) -> tuple[JsonObject, ...]:
        return tuple(self._events)

    def snapshot(self) -> JsonObject:
        """The response object as it stands now (a fresh copy)."""
        return self._snapshot()

    def append(self, events: Sequence[JsonObject]) -> None:
        if self._closed:
            raise RuntimeError(f"event log of {self.response_id} is closed")
        if events:
            self._events.extend(events)
            self._wake()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    async def wait_after(self, position: int) -> list[JsonObject]:
        """Events from ``position`` on, waiting for some; ``[]`` once closed and read out."""
        while position >= len(self._events) and not self._closed:
            await self._changed.wait()
        return self._events[position:]


def _expired(log: EventLog, now: float) -> bool:
    return log.closed and (log.retain_until is None or log.retain_until <= now)


@dataclass(frozen=True, slots=True)
class Track:
    """Sender: the response actor, before its first event."""

    log: EventLog
    reply: Reply[None]


@dataclass(frozen=True, slots=True)
class Find:
    """Sender: the HTTP layer (GET of a response that may still be running)."""

    response_id: str
    reply: Reply[EventLog | None]


RegistryMessage = Track | Find


@dataclass(frozen=True, slots=True)
class RegistryStatistics:
    running: int = 0


class LiveRegistryHandle:
    def __init__(self, mailbox: trio.MemorySendChannel[RegistryMessage]) -> None:
        self._mailbox = mailbox
        self._stats = RegistryStatistics()

    async def track(self, log: EventLog) -> None:
        await ask(self._mailbox, lambda reply: Track(log, reply))

    async def find(self, response_id: str, owner: str = "") -> EventLog | None:
        """``owner``'s running response ``response_id`` (another tenant's is absent)."""
        key = scoped(owner, response_id)
        return await ask(self._mailbox, lambda reply: Find(key, reply))

    def statistics(self) -> RegistryStatistics:
        return self._stats


async def run_live_registry(
    *, task_status: trio.TaskStatus[LiveRegistryHandle] = trio.TASK_STATUS_IGNORED
) -> None:
    send: trio.MemorySendChannel[RegistryMessage]
    receive: trio.MemoryReceiveChannel[RegistryMessage]
    send, receive = open_mailbox()
    handle = LiveRegistryHandle(send)
    logs: dict[str, EventLog] = {}
    async with receive:
        task_status.started(handle)
        async for message in receive:
            now = trio.current_time()
            for response_id in [k for k, log in logs.items() if _expired(log, now)]:
                del logs[response_id]
            match message:
                case Track(log, reply):
                    logs[log.key] = log
                    reply.send(None)
                case Find(response_id, reply):
                    reply.send(logs.get(response_id))
            handle._stats = RegistryStatistics(len(logs))
