"""The response supervisor: every response, foreground or background, is a task in its nursery.

Invariants:
- A response task owns everything of its response: preparation, admission (its model
  sequence), the parsers, the event machine, the event log, and the store write at the
  terminal event. Nobody else touches them; subscribers only read the log.
- Every way a response ends gives exactly one terminal event: finished, refused after it was
  announced (a background job's compaction), cancelled (the cancel endpoint, the client leaving,
  shutdown) or an exception inside it (``failed`` / ``server_error``, stored and pollable).
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

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Literal, assert_never

import trio

from ..protocol.errors import ApiError
from ..protocol.machine import Compacted, Fail
from ..protocol.objects import ResponseErrorCode
from ..protocol.request import CreateRequest
from ..storage.interface import scoped
from .admission import Admission, admit, constrain, output_budget
from .compaction import compact_for_request, compact_now, plan
from .event_log import EventLog
from .kit import Reply, ask, open_mailbox
from .prompt import PreparedPrompt, context_exceeded, needs_compaction, prepare_prompt
from .prompt_limit import prompt_limit
from .run import ResponseRun
from .runtime import Actors
from .timings import report_cancel

log = logging.getLogger(__name__)

CancelReason = Literal["cancel requested", "client disconnected", "shutdown", "steered"]


class TooManyJobs(RuntimeError):
    """``max_jobs`` background jobs are already active, or the active jobs' estimated bytes
    would pass the response store's byte budget (spec 000)."""


# -- messages ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Open:
    """Sender: a transport. Start a response; the reply is its log once it exists.
    ``presence`` (foreground only) ends when the opener leaves."""

    request: CreateRequest
    presence: trio.MemoryReceiveChannel[None] | None
    reply: Reply[EventLog]


@dataclass(frozen=True, slots=True)
class Register:
    """Sender: a response task, once its response exists. It becomes findable."""

    entry: _Entry
    log: EventLog
    reply: Reply[None]


@dataclass(frozen=True, slots=True)
class Reserve:
    """Sender: a background response task. Hold ``size`` bytes of the job budget."""

    entry: _Entry
    size: int
    reply: Reply[None]


@dataclass(frozen=True, slots=True)
class Ended:
    """Sender: a response task, last (after its terminal event, or after a refusal)."""

    entry: _Entry


@dataclass(frozen=True, slots=True)
class CancelResponse:
    """Sender: the cancel endpoint (or a WebSocket steer, with ``reason`` "steered"). Reply:
    the running response's log, None if not running."""

    key: str
    reason: CancelReason
    reply: Reply[EventLog | None]


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
    """Sender: the status page (issue 16). Reply: ``owner``'s running responses, oldest first."""

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
    | Register
    | Reserve
    | Ended
    | CancelResponse
    | Find
    | Forget
    | OpenSocket
    | CloseSocket
    | ListRunning
)


@dataclass(slots=True, eq=False)
class _Entry:
    """One response task's record in the supervisor (mutated only by the supervisor, except
    ``reason`` and ``scope``, which the task's own presence watcher may set and cancel)."""

    background: bool
    ephemeral: bool  # a store: false background job: its final object is kept for a while
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    reason: CancelReason | None = None
    log: EventLog | None = None
    size: int = 0
    retain_until: float | None = None
    opened_at: float = field(default_factory=trio.current_time)  # issue 16: its age

    def cancel(self, reason: CancelReason) -> None:
        if self.reason is None:
            self.reason = reason
        self.scope.cancel()


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
        self, request: CreateRequest, presence: trio.MemoryReceiveChannel[None] | None
    ) -> EventLog:
        """Start a response; its log once it exists. Raises ``ApiError`` (refused, nothing
        left) or ``TooManyJobs``."""
        return await ask(self._mailbox, lambda reply: Open(request, presence, reply))

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

    async def find(self, response_id: str, owner: str = "") -> EventLog | None:
        """``owner``'s running (or retained) response ``response_id``."""
        key = scoped(owner, response_id)
        return await ask(self._mailbox, lambda reply: Find(key, reply))

    async def forget(self, response_id: str, owner: str = "") -> bool:
        key = scoped(owner, response_id)
        return await ask(self._mailbox, lambda reply: Forget(key, reply))

    async def open_socket(self, owner: str) -> bool:
        """Count a WebSocket connection of ``owner``; False when it is at its limit."""
        return await ask(self._mailbox, lambda reply: OpenSocket(owner, reply))

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
                case Open(request, presence, reply):
                    entry = state.admit(request, reply)
                    if entry is not None:
                        nursery.start_soon(
                            _respond, entry, request, presence, reply, actors, handle, send.clone()
                        )
                case Register(entry, log_, reply):
                    entry.log = log_
                    state.jobs_started += entry.background
                    state.entries[log_.key] = entry
                    reply.send(None)
                case Reserve(entry, size, reply):
                    if state.job_bytes + size > settings.max_job_bytes:
                        reply.fail(
                            TooManyJobs(
                                "the active background jobs would pass the response store's "
                                f"byte budget ({settings.max_job_bytes} bytes)"
                            )
                        )
                    else:
                        entry.size = size
                        state.job_bytes += size
                        reply.send(None)
                case Ended(entry):
                    state.ended(entry, trio.current_time())
                case CancelResponse(key, reason, reply):
                    found = state.entries.get(key)
                    if found is None or found.log is None or found.log.closed:
                        reply.send(None)
                    else:
                        found.cancel(reason)
                        reply.send(found.log)
                case Find(key, reply):
                    found = state.entries.get(key)
                    reply.send(None if found is None else found.log)
                case Forget(key, reply):
                    found = state.entries.get(key)
                    retained = found is not None and found.retain_until is not None
                    if retained:
                        del state.entries[key]
                    reply.send(retained)
                case OpenSocket(owner, reply):
                    count = state.sockets.get(owner, 0)
                    allowed = count < settings.max_sockets_per_tenant
                    if allowed:
                        state.sockets[owner] = count + 1
                    reply.send(allowed)
                case CloseSocket(owner):
                    state.sockets[owner] -= 1
                    if not state.sockets[owner]:
                        del state.sockets[owner]
                case ListRunning(owner, reply):
                    reply.send(state.running(owner, trio.current_time()))
                case _:
                    assert_never(message)
            handle._stats = state.statistics()


class _State:
    """What the supervisor task owns."""

    def __init__(self, settings: SupervisorSettings) -> None:
        self.settings = settings
        self.entries: dict[str, _Entry] = {}
        self.tasks = 0
        self.jobs_active = 0
        self.jobs_started = 0
        self.jobs_finished = 0
        self.job_bytes = 0
        self.sockets: dict[str, int] = {}  # tenant -> open WebSocket connections

    def admit(self, request: CreateRequest, reply: Reply[EventLog]) -> _Entry | None:
        background = request.config.background
        if background:
            if self.jobs_active >= self.settings.max_jobs:
                reply.fail(
                    TooManyJobs(f"{self.settings.max_jobs} background jobs are already active")
                )
                return None
            self.jobs_active += 1  # held while it opens; a refusal gives it back
        self.tasks += 1
        return _Entry(background, background and not request.config.store)

    def ended(self, entry: _Entry, now: float) -> None:
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


# -- one response task -------------------------------------------------------------------------


async def _respond(
    entry: _Entry,
    request: CreateRequest,
    presence: trio.MemoryReceiveChannel[None] | None,
    opened: Reply[EventLog],
    actors: Actors,
    supervisor: ResponseSupervisorHandle,
    mailbox: trio.MemorySendChannel[SupervisorMessage],
) -> None:
    async with mailbox:
        try:
            run = await _open(entry, request, opened, actors, supervisor, mailbox)
            if run is not None:  # run.request: with the tools its history loaded
                await _drive_published(entry, run, run.request, presence, actors)
        finally:
            if presence is not None:
                presence.close()
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await mailbox.send(Ended(entry))


async def _open(
    entry: _Entry,
    request: CreateRequest,
    opened: Reply[EventLog],
    actors: Actors,
    supervisor: ResponseSupervisorHandle,
    mailbox: trio.MemorySendChannel[SupervisorMessage],
) -> ResponseRun | None:
    """Everything that can refuse the request; the run once its response exists (announced to
    the opener), or None after a refusal (told to the opener; nothing is left)."""
    admission: Admission | None = None
    model = actors.model
    try:
        # On its way to the model until admitted or refused: an idle batch that gets another
        # request's sequence meanwhile waits for this one (a burst is prefilled together).
        with model.arriving() as arrival:
            limit = prompt_limit(request, model)
            prepared = await prepare_prompt(request, actors, supervisor, limit)
            if prepared.tools is not None:  # a search in the history loaded tools (issue 13)
                request = dataclasses.replace(request, tools=prepared.tools)
            window = model.info.context_window
            if request.compact_now:  # issue 28: refused now when it cannot be done at all
                arrival.done()
                await plan(prepared, actors, None)
            compacting = request.compact_now or needs_compaction(
                request, len(prepared.prompt), window
            )
            if not compacting and len(prepared.prompt) >= window:
                raise context_exceeded(prepared.prompt, window)  # before compiling any grammar
            grammar = None if request.compact_now else await constrain(request, model)
            run = ResponseRun(request, prepared, actors)
            if entry.background:
                budget = output_budget(request, len(prepared.prompt), window)
                size = run.estimated_bytes(max(budget, 0))
                await ask(mailbox, lambda reply: Reserve(entry, size, reply))
            if not request.generate:
                # A warm-up: prefill the prompt (the prompt cache keeps it for the
                # continuation), output nothing.
                one_token = dataclasses.replace(
                    request, config=dataclasses.replace(request.config, max_output_tokens=1)
                )
                admission = await admit(one_token, prepared, model, None)
            elif request.compact_now:
                pass  # the summary generates in the response's task (cancellable, supervised)
            elif compacting and entry.background:
                pass  # compacted and admitted inside the job (a refusal ends it failed)
            elif compacting:
                # The summary generates first, a whole response: not an arrival to wait for.
                arrival.done()
                compacted, step = await compact_for_request(request, prepared, actors)
                admission = await admit(request, compacted, model, grammar, step)
            else:
                admission = await admit(request, prepared, model, grammar)
        if admission is not None:
            run.attach(admission)
        await ask(mailbox, lambda reply: Register(entry, run.log, reply))
        if entry.background:
            await run.persist_job()  # issue 15: a durable job row before the create answers
    except BaseException as exc:
        if admission is not None:
            with trio.CancelScope(shield=True):
                await admission.sequence.cancel()
        if isinstance(exc, Exception):
            opened.fail(exc)
            return None
        # Cancelled (the server is stopping): the opener still gets an answer.
        opened.fail(
            ApiError(
                503, "server_error", "The server is shutting down.", code="server_shutting_down"
            )
        )
        raise
    opened.send(run.log)
    if run.admission is None:
        run.grammar = grammar  # for the deferred admission
    return run


async def _drive(
    entry: _Entry,
    run: ResponseRun,
    request: CreateRequest,
    presence: trio.MemoryReceiveChannel[None] | None,
    actors: Actors,
) -> None:
    """Run the response to its one terminal event, whatever happens."""
    with entry.scope:
        try:
            async with trio.open_nursery() as nursery:
                if presence is not None:
                    nursery.start_soon(_watch_presence, presence, entry)
                if not request.generate:
                    await run.warm_up()
                    nursery.cancel_scope.cancel()
                    return
                if request.compact_now:
                    await _compact_now(run, request, actors)
                    nursery.cancel_scope.cancel()
                    return
                if run.admission is None and not await _admit_later(run, request, actors):
                    nursery.cancel_scope.cancel()
                    return
                await run.generate()
                nursery.cancel_scope.cancel()
        except Exception:
            log.exception("response %s failed", run.response_id)
            await run.end_failed("The server had an internal error while generating this response.")
    if run.terminal:
        return
    report_cancel(actors.timings, entry.reason)  # issue 16: cancellations by reason
    if entry.reason == "steered":
        await run.end_steered()
    else:  # cancelled
        await run.end_cancelled(record=entry.reason != "client disconnected")


async def _drive_published(
    entry: _Entry,
    run: ResponseRun,
    request: CreateRequest,
    presence: trio.MemoryReceiveChannel[None] | None,
    actors: Actors,
) -> None:
    """``_drive``; with replicas (issue 15), a stored background job's events are published
    to the shared store while it runs, so any replica can follow it."""
    replica = actors.replica
    if replica is None or not entry.background or entry.ephemeral:
        await _drive(entry, run, request, presence, actors)
        return
    async with trio.open_nursery() as nursery:
        nursery.start_soon(replica.publish, run.log)
        await _drive(entry, run, request, presence, actors)
        nursery.cancel_scope.cancel()  # its record is stored: followers read that


async def _admit_later(run: ResponseRun, request: CreateRequest, actors: Actors) -> bool:
    """A background job's automatic compaction and admission; False when it was refused (the
    run then ended ``failed``: ``invalid_prompt`` for a refused compaction or render)."""
    try:
        compacted, step = await compact_for_request(request, run.prepared, actors)
        run.attach(await admit(request, compacted, actors.model, run.grammar, step))
    except ApiError as error:
        code: ResponseErrorCode = "invalid_prompt" if error.status == 400 else "server_error"
        await run.end(Fail(code, error.message, None))
        return False
    return True


async def _compact_now(run: ResponseRun, request: CreateRequest, actors: Actors) -> None:
    """A ``compaction_trigger`` (issue 28): the summary generates, then the response ends with
    the compaction item as its only output; a summary that does not shorten the history ends it
    ``failed`` (``invalid_prompt``), as an automatic compaction in a background job does."""
    try:
        step, usage = await compact_now(request, run.prepared, actors)
    except ApiError as error:
        code: ResponseErrorCode = "invalid_prompt" if error.status == 400 else "server_error"
        await run.end(Fail(code, error.message, None))
        return
    await run.finish_compacted(step, usage)


async def _watch_presence(presence: trio.MemoryReceiveChannel[None], entry: _Entry) -> None:
    """The opener's presence ends when its request does: a foreground response unfinished by
    then has lost its client."""
    async for _ in presence:
        pass
    entry.cancel("client disconnected")


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
