"""The response supervisor: a registry of response tasks. Every generation the server runs,
foreground or background, a compaction's summary, a WebSocket warm-up or steering successor,
is a task in its nursery (``response_task.py``: what one task does).

Invariants:
- The supervisor starts tasks and answers lookups; it never touches a response's state. A task
  tells it three things at most: its response exists (``Register``), a job's bytes
  (``Reserve``), and that it ended (``Ended``).
- Lifetimes: a foreground response lives as long as its opener's presence channel is open
  (the HTTP request; when the request ends unfinished the task cancels itself with the reason
  "client disconnected" and stores nothing); a background one ignores its subscribers and ends
  only by itself, by cancel, or at shutdown.
- This task alone owns the registry (id -> entry), the job counts and the job byte budget;
  response tasks and the HTTP layer reach them by message. A closed log is pruned on the next
  message unless it is retained (a ``store: false`` background job's final object).
- A refusal before the response exists (``ApiError`` from preparation or admission, the job
  limits) is the opener's error, and nothing is left: no entry, no job, no admission.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_never

import trio

from ..protocol.events.machine import Compacted
from ..protocol.lifecycle import CancelReason
from ..protocol.objects import JsonObject
from ..protocol.request import CompactRequest, CreateRequest
from ..storage.interface import scoped
from .event_log import EventLog
from .kit import Reply, ask, open_mailbox
from .model import Arrival
from .prompt import PreparedPrompt
from .response_task import (
    Ended,
    Opener,
    Register,
    Reserve,
    TaskEntry,
    compact,
    respond,
)
from .runtime import Actors


class TooManyJobs(RuntimeError):
    """``max_jobs`` background jobs are already active, or the active jobs' estimated bytes
    would pass the response store's byte budget (docs/api.md)."""


# -- messages ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Open:
    """Sender: a transport. Start a response; the reply is its log once it exists.
    ``presence`` (foreground only) ends when the opener leaves. ``arrival``: the request's
    count as on its way to the model, begun by the transport; the response task ends it."""

    request: CreateRequest
    presence: trio.MemoryReceiveChannel[None] | None
    reply: Reply[EventLog]
    arrival: Arrival | None = None


@dataclass(frozen=True, slots=True)
class OpenCompaction:
    """Sender: the compaction route. Run the compaction as a task; the reply is its
    ``response.compaction`` object (or its refusal). ``presence`` ends when the opener leaves."""

    request: CompactRequest
    presence: trio.MemoryReceiveChannel[None] | None
    reply: Reply[JsonObject]


@dataclass(frozen=True, slots=True)
class CancelResponse:
    """Sender: the cancel endpoint (or a WebSocket steer, with ``reason`` "steered"). Reply:
    the running response's log, None if not running."""

    key: str
    reason: CancelReason
    reply: Reply[EventLog | None]


@dataclass(frozen=True, slots=True)
class CancelRunning:
    """Sender: the server's shutdown, once the model's batch is empty. Cancel every running
    response with ``reason`` (one waiting on a hosted call, which no sequence holds); reply:
    how many."""

    reason: CancelReason
    reply: Reply[int]


@dataclass(frozen=True, slots=True)
class Find:
    """Sender: the HTTP layer, history loading. Reply: the response's log, if it is known."""

    key: str
    reply: Reply[EventLog | None]


@dataclass(frozen=True, slots=True)
class Forget:
    """Sender: DELETE. Forget a finished, retained response; reply: whether one was."""

    key: str
    reply: Reply[bool]


@dataclass(frozen=True, slots=True)
class OpenSocket:
    """Sender: the WebSocket route, on an upgrade. Reply: whether ``owner`` is under its limit
    of open connections (then the connection counts until ``CloseSocket``)."""

    owner: str
    reply: Reply[bool]


@dataclass(frozen=True, slots=True)
class CloseSocket:
    """Sender: the WebSocket route, when a counted connection ends."""

    owner: str


@dataclass(frozen=True, slots=True)
class ListRunning:
    """Sender: the status page. Reply: ``owner``'s running responses, oldest first."""

    owner: str
    reply: Reply[tuple[RunningResponse, ...]]


@dataclass(frozen=True, slots=True)
class RunningResponse:
    """A running response as the status page shows it (no content)."""

    response_id: str
    background: bool
    status: str  # queued or in_progress
    age_seconds: float
    prompt_tokens: int
    output_tokens: int


SupervisorMessage = (
    Open
    | OpenCompaction
    | Register
    | Reserve
    | Ended
    | CancelResponse
    | CancelRunning
    | Find
    | Forget
    | OpenSocket
    | CloseSocket
    | ListRunning
)


# What the registry answers without starting a task.
_Answered = (
    Register
    | Reserve
    | Ended
    | CancelResponse
    | CancelRunning
    | Find
    | Forget
    | OpenSocket
    | CloseSocket
    | ListRunning
)


@dataclass(frozen=True, slots=True)
class SupervisorStatistics:
    tasks: int = 0  # response tasks alive (opening, running, ending)
    running: int = 0  # registered responses whose log is still open
    retained: int = 0  # finished responses kept findable (store: false jobs)
    jobs_active: int = 0
    jobs_started: int = 0
    jobs_finished: int = 0
    sockets: int = 0  # open WebSocket connections


@dataclass(frozen=True, slots=True)
class SupervisorSettings:
    max_jobs: int = 64
    max_job_bytes: int = 1 << 62
    ephemeral_ttl_seconds: float = 600.0
    max_sockets_per_tenant: int = 16


class ResponseSupervisorHandle:
    def __init__(
        self, mailbox: trio.MemorySendChannel[SupervisorMessage], settings: SupervisorSettings
    ) -> None:
        self._mailbox = mailbox
        self.max_jobs = settings.max_jobs
        self._stats = SupervisorStatistics()

    @property
    def jobs_enabled(self) -> bool:
        return self.max_jobs > 0

    async def open(
        self,
        request: CreateRequest,
        presence: trio.MemoryReceiveChannel[None] | None,
        arrival: Arrival | None = None,
    ) -> EventLog:
        """Start a response; its log once it exists. Raises ``ApiError`` (refused, nothing
        left) or ``TooManyJobs``. ``arrival``: the transport's count of the request as on its
        way to the model (``ModelHandle.arriving``), handed to the response task."""
        return await ask(self._mailbox, lambda reply: Open(request, presence, reply, arrival))

    async def compact(
        self, request: CompactRequest, presence: trio.MemoryReceiveChannel[None] | None
    ) -> JsonObject:
        """Run a compaction as a task (its summary is a running response meanwhile); the
        ``response.compaction`` object. Raises ``ApiError``."""
        return await ask(self._mailbox, lambda reply: OpenCompaction(request, presence, reply))

    async def cancel(self, response_id: str, owner: str = "") -> EventLog | None:
        """Cancel ``owner``'s running response; its log (None: not running)."""
        key = scoped(owner, response_id)
        return await ask(
            self._mailbox, lambda reply: CancelResponse(key, "cancel requested", reply)
        )

    async def steer(self, response_id: str, owner: str = "") -> EventLog | None:
        """End ``owner``'s running response ``incomplete`` / ``steered`` (a successor follows);
        its log (None: not running)."""
        key = scoped(owner, response_id)
        return await ask(self._mailbox, lambda reply: CancelResponse(key, "steered", reply))

    async def cancel_running(self, reason: CancelReason) -> int:
        """Cancel every running response with ``reason``; how many were."""
        return await ask(self._mailbox, lambda reply: CancelRunning(reason, reply))

    async def find(self, response_id: str, owner: str = "") -> EventLog | None:
        """``owner``'s running (or retained) response ``response_id``."""
        key = scoped(owner, response_id)
        return await ask(self._mailbox, lambda reply: Find(key, reply))

    async def forget(self, response_id: str, owner: str = "") -> bool:
        key = scoped(owner, response_id)
        return await ask(self._mailbox, lambda reply: Forget(key, reply))

    async def open_socket(self, owner: str) -> bool:
        """Count a WebSocket connection of ``owner``; False when it is at its limit."""

        async def uncount(counted: bool) -> None:  # the upgrade was cancelled meanwhile
            if counted:
                await self.close_socket(owner)

        return await ask(self._mailbox, lambda reply: OpenSocket(owner, reply), undo=uncount)

    async def running(self, owner: str = "") -> tuple[RunningResponse, ...]:
        """``owner``'s running responses (foreground and background), oldest first."""
        return await ask(self._mailbox, lambda reply: ListRunning(owner, reply))

    async def close_socket(self, owner: str) -> None:
        with trio.CancelScope(shield=True):
            await self._mailbox.send(CloseSocket(owner))

    def statistics(self) -> SupervisorStatistics:
        return self._stats


async def run_response_supervisor(
    actors: Actors,
    settings: SupervisorSettings,
    *,
    task_status: trio.TaskStatus[ResponseSupervisorHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    send: trio.MemorySendChannel[SupervisorMessage]
    receive: trio.MemoryReceiveChannel[SupervisorMessage]
    send, receive = open_mailbox()
    handle = ResponseSupervisorHandle(send, settings)
    state = _State(settings)
    async with trio.open_nursery() as nursery, receive:
        task_status.started(handle)
        async for message in receive:
            state.prune(trio.current_time())
            match message:
                case Open(request, presence, reply, arrival):
                    entry = state.admit(request, reply)
                    if entry is not None:
                        opener = Opener(presence, arrival, reply)
                        nursery.start_soon(
                            respond, entry, request, opener, actors, handle, send.clone()
                        )
                case OpenCompaction(compaction, presence, answer):
                    state.tasks += 1
                    nursery.start_soon(
                        compact,
                        TaskEntry(background=False, ephemeral=False),
                        compaction,
                        presence,
                        answer,
                        actors,
                        handle,
                        send.clone(),
                    )
                case _:
                    state.answer(message)
            handle._stats = state.statistics()


class _State:
    """What the supervisor task owns."""

    def __init__(self, settings: SupervisorSettings) -> None:
        self.settings = settings
        self.entries: dict[str, TaskEntry] = {}
        self.tasks = 0
        self.jobs_active = 0
        self.jobs_started = 0
        self.jobs_finished = 0
        self.job_bytes = 0
        self.sockets: dict[str, int] = {}  # tenant -> open WebSocket connections

    def answer(self, message: _Answered) -> None:
        """A message the registry answers by itself (no task is started)."""
        settings = self.settings
        match message:
            case Register(entry, log_, reply):
                earlier = entry.log  # a summary that generated before its response
                if earlier is None:
                    self.jobs_started += entry.background
                elif self.entries.get(earlier.key) is entry:
                    del self.entries[earlier.key]
                entry.log = log_
                self.entries[log_.key] = entry
                reply.send(None)
            case Reserve(entry, size, reply):
                if self.job_bytes + size > settings.max_job_bytes:
                    reply.fail(
                        TooManyJobs(
                            "the active background jobs would pass the response store's "
                            f"byte budget ({settings.max_job_bytes} bytes)"
                        )
                    )
                else:
                    entry.size = size
                    self.job_bytes += size
                    reply.send(None)
            case Ended(entry):
                self.ended(entry, trio.current_time())
            case CancelResponse(key, reason, reply):
                found = self.entries.get(key)
                if found is None or found.log is None or found.log.closed:
                    reply.send(None)
                else:
                    found.cancel(reason)
                    reply.send(found.log)
            case CancelRunning(reason, reply):
                running = [e for e in self.entries.values() if e.log and not e.log.closed]
                for entry in running:
                    entry.cancel(reason)
                reply.send(len(running))
            case Find(key, reply):
                found = self.entries.get(key)
                reply.send(None if found is None else found.log)
            case Forget(key, reply):
                found = self.entries.get(key)
                retained = found is not None and found.retain_until is not None
                if retained:
                    del self.entries[key]
                reply.send(retained)
            case OpenSocket(owner, reply):
                count = self.sockets.get(owner, 0)
                allowed = count < settings.max_sockets_per_tenant
                if allowed:
                    self.sockets[owner] = count + 1
                reply.send(allowed)
            case CloseSocket(owner):
                self.sockets[owner] -= 1
                if not self.sockets[owner]:
                    del self.sockets[owner]
            case ListRunning(owner, reply):
                reply.send(self.running(owner, trio.current_time()))
            case _:
                assert_never(message)

    def admit(self, request: CreateRequest, reply: Reply[EventLog]) -> TaskEntry | None:
        background = request.config.background
        if background:
            if self.jobs_active >= self.settings.max_jobs:
                reply.fail(
                    TooManyJobs(f"{self.settings.max_jobs} background jobs are already active")
                )
                return None
            self.jobs_active += 1  # held while it opens; a refusal gives it back
        self.tasks += 1
        return TaskEntry(background, background and not request.config.store)

    def ended(self, entry: TaskEntry, now: float) -> None:
        self.tasks -= 1
        if entry.background:
            self.jobs_active -= 1
            self.jobs_finished += entry.log is not None
            self.job_bytes -= entry.size
        log_ = entry.log
        if log_ is None:
            return
        if entry.ephemeral and self.entries.get(log_.key) is entry:
            entry.retain_until = now + self.settings.ephemeral_ttl_seconds
        elif self.entries.get(log_.key) is entry:
            del self.entries[log_.key]

    def prune(self, now: float) -> None:
        for key in [
            key
            for key, entry in self.entries.items()
            if entry.retain_until is not None and entry.retain_until <= now
        ]:
            del self.entries[key]

    def running(self, owner: str, now: float) -> tuple[RunningResponse, ...]:
        found = [
            RunningResponse(
                e.log.response_id,
                e.background,
                e.log.status,
                now - e.opened_at,
                e.log.prompt_tokens,
                e.log.output_tokens,
            )
            for e in self.entries.values()
            if e.log is not None and not e.log.closed and e.log.owner == owner
        ]
        return tuple(sorted(found, key=lambda r: -r.age_seconds))

    def statistics(self) -> SupervisorStatistics:
        running = sum(1 for e in self.entries.values() if e.log is not None and not e.log.closed)
        return SupervisorStatistics(
            tasks=self.tasks,
            running=running,
            retained=sum(1 for e in self.entries.values() if e.retain_until is not None),
            jobs_active=self.jobs_active,
            jobs_started=self.jobs_started,
            jobs_finished=self.jobs_finished,
            sockets=sum(self.sockets.values()),
        )


__all__ = [
    "Compacted",
    "PreparedPrompt",
    "ResponseSupervisorHandle",
    "RunningResponse",
    "SupervisorSettings",
    "SupervisorStatistics",
    "TooManyJobs",
    "run_response_supervisor",
]
