"""One response task: every generation the server runs is one, under the response supervisor.

Invariants:
- A response task owns everything of its response: preparation, admission (its model
  sequence), the parsers, the event machine, the event log, and the store write at the
  terminal event. Nobody else touches them; subscribers only read the log.
- Its life is one pass through the table of ``protocol/lifecycle.py``: preparing (nothing
  exists; a refusal is the opener's error), waiting for admission, prefilling, decoding (and a
  server tool's call and continuation), finishing (the records are written), ended (the
  terminal event is out, the log closed). The ``ResponseRun`` holds the phase and moves it only
  by the table; the task opens the run, then lets the table say what comes next
  (``ResponseRun.drive``), doing the compaction a route needs itself.
- Every way a response ends gives exactly one terminal event: finished, refused after it was
  announced (a background job's compaction), cancelled (the cancel endpoint, the client leaving,
  shutdown, a steer) or an exception inside it (``failed`` / ``server_error``).
- The task's cancel scope (``TaskEntry.scope``) and its opener's presence cover its whole life,
  preparation and admission included: a client that leaves while a summary generates before
  its response exists (automatic compaction) takes the summary out of the batch at once.
- The task talks to its supervisor four times at most: ``Register`` once its response exists
  (it becomes findable, cancellable and counted), ``Reserve`` (a background job's bytes),
  ``Ended``, last, always; and before those, ``Register`` of the summary a create's automatic
  compaction generates before its response exists (the response's own ``Register`` then
  replaces it).
- A compaction (``POST /v1/responses/compact``) is a task of the same kind: its summary is a
  response registered like any other (listed on ``/status``, cancellable by its id, awaited at
  shutdown); the compaction object is the task's answer to its opener. So is a create's
  summary: cancelled by its id, the create is answered ``cancelled`` (400).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import trio

from ..protocol.errors import ApiError, invalid_request
from ..protocol.lifecycle import CANCEL_INPUT, Action, CancelReason, Input
from ..protocol.objects import JsonObject
from ..protocol.request import CompactRequest, CreateRequest
from ..storage.interface import StoredResponse
from .admission import Admission, admit_ready
from .compaction import compact_history, compact_now, compacted, plan
from .event_log import EventLog
from .kit import Reply, ask
from .model import Arrival
from .prompt import ReadyPrompt, prepare_response
from .run import Ending, ResponseRun, refusal
from .runtime import Actors, RunningResponses
from .timings import report_cancel

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class TaskEntry:
    """One response task's record in the supervisor (mutated only by the supervisor, except
    ``reason`` and ``scope``, which the task's own presence watcher may set and cancel)."""

    background: bool
    ephemeral: bool  # a store: false background job: its final object is kept for a while
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    reason: CancelReason | None = None
    log: EventLog | None = None
    size: int = 0
    retain_until: float | None = None
    opened_at: float = field(default_factory=trio.current_time)  # its age, on /status

    def cancel(self, reason: CancelReason) -> None:
        if self.reason is None:
            self.reason = reason
        self.scope.cancel()


# -- what a task tells its supervisor ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Register:
    """Sender: a response task, once its response exists. It becomes findable."""

    entry: TaskEntry
    log: EventLog
    reply: Reply[None]


@dataclass(frozen=True, slots=True)
class Reserve:
    """Sender: a background response task. Hold ``size`` bytes of the job budget."""

    entry: TaskEntry
    size: int
    reply: Reply[None]


@dataclass(frozen=True, slots=True)
class Ended:
    """Sender: a response task, last (after its terminal event, or after a refusal)."""

    entry: TaskEntry


TaskMessage = Register | Reserve | Ended
Mailbox = trio.MemorySendChannel[TaskMessage]


@dataclass(frozen=True, slots=True)
class Opener:
    """What a transport hands the response task it opens (``supervisor.Open``): its presence
    (foreground only; it ends when the opener leaves), the request's count as on its way to
    the model (ended by the task), and where the log goes once the response exists."""

    presence: trio.MemoryReceiveChannel[None] | None
    arrival: Arrival | None
    reply: Reply[EventLog]


# -- a response --------------------------------------------------------------------------------


async def respond(
    entry: TaskEntry,
    request: CreateRequest,
    opener: Opener,
    actors: Actors,
    running: RunningResponses,
    mailbox: Mailbox,
) -> None:
    presence = opener.presence
    async with mailbox:
        run: ResponseRun | None = None
        try:
            # Cancelled by the supervisor (the cancel endpoint, shutdown, a steer) or, from the
            # first step, by the client leaving: a summary that generates before the response
            # exists (automatic compaction) leaves the batch with it.
            with entry.scope:
                async with trio.open_nursery() as nursery:
                    if presence is not None:
                        nursery.start_soon(_watch_presence, presence, entry)
                    run = await _open(entry, request, opener, actors, running, mailbox)
                    if run is not None:
                        await _drive_published(entry, run, actors)
                    nursery.cancel_scope.cancel()
            if run is not None and not run.terminal:
                await _end_cancelled(entry, run, actors)
        finally:
            if presence is not None:
                presence.close()
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await mailbox.send(Ended(entry))


async def _open(
    entry: TaskEntry,
    request: CreateRequest,
    opener: Opener,
    actors: Actors,
    running: RunningResponses,
    mailbox: Mailbox,
) -> ResponseRun | None:
    """Preparing and waiting for admission: everything that can refuse the request. The run
    once its response exists (announced to the opener), or None after a refusal (told to the
    opener; nothing is left)."""
    opened = opener.reply
    run: ResponseRun | None = None
    try:
        run = await _exist(entry, request, opener.arrival, actors, running, mailbox)
        await ask(mailbox, lambda reply: Register(entry, run.log, reply))
        if entry.background:
            await _persist_job(run, actors)  # a durable job row before the create answers
    except BaseException as exc:
        if run is not None:
            await run.refused()  # its sequence, if one was admitted, leaves the batch
        if isinstance(exc, Exception):
            opened.fail(exc)
            return None
        # Cancelled (the server stopping; its compaction's summary cancelled by id; the
        # client gone): the opener still gets an answer.
        opened.fail(_cancelled("The response", entry.reason))
        raise
    opened.send(run.log)
    return run


async def _exist(
    entry: TaskEntry,
    request: CreateRequest,
    counted: Arrival | None,
    actors: Actors,
    running: RunningResponses,
    mailbox: Mailbox,
) -> ResponseRun:
    """Prepared and, unless its route admits it later, admitted: the run. On its way to the
    model until admitted or refused (counted by its transport as it opened the response,
    ``counted``, when the transport counted it): an idle batch that gets another request's sequence
    meanwhile waits for this one (a burst is prefilled together). A foreground create that
    compacts takes its own way: its summary generates first (not an arrival), registered
    under its own id, so it is listed and cancellable."""

    async def register(summary: EventLog) -> None:
        await ask(mailbox, lambda reply: Register(entry, summary, reply))

    with actors.model.arriving(counted) as arrival:
        ready = await prepare_response(request, actors, running)
        admitting: ReadyPrompt | None = ready
        if ready.compacting:  # its own route: not an arrival
            arrival.done()
            admitting = None
            if ready.request.compact_now:  # refused now when it cannot be done at all
                await plan(ready.prepared, actors, None)
            elif not entry.background:  # a background job compacts inside the job
                admitting = await compacted(ready.request, ready.prepared, actors, register)
        if entry.background:
            await ask(mailbox, lambda reply: Reserve(entry, ready.job_bytes, reply))
        admission: Admission | None = None
        if admitting is not None:  # the compacted prompt, if it was compacted first
            admission = await admit_ready(admitting, actors.model, arrival)
    return ResponseRun(ready.request, ready.prepared, actors, admission=admission)


async def _persist_job(run: ResponseRun, actors: Actors) -> None:
    """A stored background job is written to the store as it starts (its queued object and
    input), and stays there until its record is put; a restart in between ends it ``failed``
    instead of leaving it queued forever. Never raises: a job whose row could not be written
    still runs (a restart then forgets it)."""
    store = actors.store
    if not (run.request.config.store and store.enabled):
        return
    queued = StoredResponse(run.snapshot(), run.prepared.all_items, (), run.request.owner)
    try:
        await store.job_started(queued)
    except Exception:
        log.exception("could not record background job %s", run.response_id)


async def _drive(run: ResponseRun, actors: Actors) -> None:
    """From waiting (or prefilling) to its terminal event, unless it is cancelled first: the
    table says what comes next; the compaction a route needs is done here."""

    async def compact_whole(run: ResponseRun) -> None:
        try:
            step, usage = await compact_now(run.request, run.prepared, actors)
        except ApiError as error:
            await run.end(Input.FAILED, refusal(error))
            return
        run.start(step)  # the compaction item is the whole output; the usage the summary's
        await run.end(Input.FINISHED, Ending(usage=usage))

    async def compact_then_admit(run: ResponseRun) -> None:
        try:
            ready = await compacted(run.request, run.prepared, actors)
            run.attach(await admit_ready(ready, actors.model))
        except ApiError as error:  # the job ends failed: invalid_prompt for a refusal
            await run.end(Input.FAILED, refusal(error))

    routes = {Action.COMPACT_WHOLE: compact_whole, Action.COMPACT_THEN_ADMIT: compact_then_admit}
    try:
        await run.drive(routes)
    except Exception:
        log.exception("response %s failed", run.response_id)
        await run.end(Input.FAILED)


async def _end_cancelled(entry: TaskEntry, run: ResponseRun, actors: Actors) -> None:
    """A run cancelled before its terminal event: one terminal event all the same (what the
    cancel's reason makes of it is the table's)."""
    report_cancel(actors.timings, entry.reason)  # cancellations by reason
    await run.end(CANCEL_INPUT[entry.reason])


async def _drive_published(
    entry: TaskEntry,
    run: ResponseRun,
    actors: Actors,
) -> None:
    """``_drive``; with replicas, a stored background job's events are published to the
    shared store while it runs, so any replica can follow it."""
    replica = actors.replica
    if replica is None or not entry.background or entry.ephemeral:
        await _drive(run, actors)
        return
    async with trio.open_nursery() as nursery:
        nursery.start_soon(replica.publish, run.log)
        await _drive(run, actors)
        nursery.cancel_scope.cancel()  # its record is stored: followers read that


async def _watch_presence(presence: trio.MemoryReceiveChannel[None], entry: TaskEntry) -> None:
    """The opener's presence ends when its request does: a foreground response unfinished by
    then has lost its client."""
    async for _ in presence:
        pass
    entry.cancel("client disconnected")


# -- a compaction ------------------------------------------------------------------------------


async def compact(
    entry: TaskEntry,
    request: CompactRequest,
    presence: trio.MemoryReceiveChannel[None] | None,
    answer: Reply[JsonObject],
    actors: Actors,
    running: RunningResponses,
    mailbox: Mailbox,
) -> None:
    """``POST /v1/responses/compact`` as a task: its summary response is registered while it
    generates; the answer is the compaction object, or the error that ended it."""

    async def register(summary: EventLog) -> None:
        await ask(mailbox, lambda reply: Register(entry, summary, reply))

    async with mailbox:
        try:
            with entry.scope:
                async with trio.open_nursery() as nursery:
                    if presence is not None:
                        nursery.start_soon(_watch_presence, presence, entry)
                    result = await compact_history(request, actors, running, register)
                    nursery.cancel_scope.cancel()
                answer.send(result)
        except Exception as exc:
            answer.fail(exc)
        finally:
            answer.fail(_cancelled("The compaction", entry.reason))  # unless answered already
            if presence is not None:
                presence.close()
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await mailbox.send(Ended(entry))


def _cancelled(what: str, reason: CancelReason | None) -> ApiError:
    if reason == "shutdown" or reason is None:
        return ApiError(
            503, "server_error", "The server is shutting down.", code="server_shutting_down"
        )
    return invalid_request(f"{what} was cancelled ({reason}).", None, code="cancelled")
