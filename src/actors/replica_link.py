"""The replica link: what one replica of a shared PostgreSQL store does with the
others: cancels, live job events and its lease.

```
replica link actor (Trio task)      its inbox: CancelArrived | ProgressArrived
 ├─ listener thread                 LISTEN mlx_cancel, mlx_progress; renews the lease and
 │                                  sweeps dead replicas' jobs every lease/3 seconds
 └─ worker StorageThread            publish a job's events, read another's, send a cancel
```

Invariants:
- Every database call runs on one of the link's two threads, each with its own connection;
  Trio never blocks. The listener wakes Trio with ``TrioToken.run_sync_soon`` and an unbounded
  inbox (a notification is never dropped, never blocks the thread).
- A stored background job running here is published while it runs (``publish``): each batch
  of new events, with the job's snapshot, is one transaction on ``job_events`` / ``jobs`` that
  notifies ``mlx_progress`` (``key\\tlast sequence number``). A batch is whatever the log
  gained while the previous one was written, so a slow database coalesces, never lags behind
  by more than one write. Publishing stops when the log closes (the record is stored by then
  and replaces the events) or the job's row is gone.
- ``follow`` on another replica reads those rows in sequence order, waking on
  ``mlx_progress`` (or every ``POLL_SECONDS``); once the job's row is gone it finishes from the
  stored record's replay, whose events are the same, so the stream equals the original one.
- ``cancel`` of a job running elsewhere notifies ``mlx_cancel`` (``{"owner", "id"}``); each
  replica's listener hands it to its own response supervisor, which cancels the job if it runs
  there (the others find nothing). The asker then waits for the record the owner stores.
- Tenant scoping: every lookup is by ``scoped(owner, id)``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, assert_never

import psycopg
import trio

from ..protocol.events.sse import encode_sse
from ..storage.choice import StoreChoice
from ..storage.interface import JsonObject, StoredResponse, StoreLimits, scoped
from ..storage.postgres import PgResponseStorage, register_replica
from ..storage.postgres_jobs import publish_events, read_events, read_job, send_cancel
from ..storage.postgres_schema import CANCEL_CHANNEL, PROGRESS_CHANNEL, PgDatabase, connect
from ..storage.thread import StorageThread
from .event_log import EventLog
from .response_store import ResponseStoreHandle

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5
"""A follower re-reads at least this often, notification or not."""
TERMINAL = {"response.completed", "response.failed", "response.incomplete", "response.cancelled"}


@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    url: str
    replica_id: str
    lease_seconds: float
    responses: StoreLimits


@dataclass(frozen=True, slots=True)
class CancelArrived:
    """Sender: the listener thread. Some replica asked to cancel ``owner``'s ``response_id``."""

    owner: str
    response_id: str


@dataclass(frozen=True, slots=True)
class ProgressArrived:
    """Sender: the listener thread. Job ``key`` published events (or ended)."""

    key: str


LinkMessage = CancelArrived | ProgressArrived
Canceller = Callable[[str, str], Awaitable[object]]


class ReplicaLink:
    """The handle: used by the response supervisor (publish) and the HTTP layer."""

    def __init__(self, settings: ReplicaSettings, store: ResponseStoreHandle) -> None:
        self.settings = settings
        self.replica_id = settings.replica_id
        self._store = store
        self._worker = StorageThread("replica-worker")
        self._conn: psycopg.Connection[Any] | None = None
        self._changed: dict[str, trio.Event] = {}
        self._cancel: Canceller | None = None
        self.cancels_received = 0

    def bind(self, cancel: Canceller) -> None:
        """Where cancels from other replicas go: ``cancel(response_id, owner)``."""
        self._cancel = cancel

    async def _run(self, fn: Callable[[psycopg.Connection[Any]], Any]) -> Any:
        def job() -> Any:
            if self._conn is None:
                self._conn = connect(self.settings.url)
            return fn(self._conn)

        return await self._worker.run(job)

    def _event(self, key: str) -> trio.Event:
        event = self._changed.get(key)
        if event is None:
            event = self._changed[key] = trio.Event()
        return event

    def _wake(self, key: str) -> None:
        event = self._changed.pop(key, None)
        if event is not None:
            event.set()

    # -- on the replica running a job --

    async def publish(self, log_: EventLog) -> None:
        """Publish ``log_``'s events and snapshot while it runs (a stored background job)."""
        position = 0
        try:
            while events := await log_.wait_after(position):
                if log_.closed:
                    return  # its record is stored; followers read that
                snapshot = log_.snapshot()
                kept = await self._run(
                    partial(
                        publish_events,
                        key=log_.key,
                        first=position,
                        events=events,
                        snapshot=snapshot,
                    )
                )
                if not kept:
                    return
                position += len(events)
        except (psycopg.Error, OSError):
            log.warning(
                "cannot publish the events of %s to other replicas", log_.response_id, exc_info=True
            )

    # -- on any replica --

    async def job(self, response_id: str, owner: str = "") -> JsonObject | None:
        """The latest snapshot of ``owner``'s job running on some replica, if one is."""
        found = await self._run(lambda conn: read_job(conn, scoped(owner, response_id)))
        return None if found is None else found[1]

    async def cancel(self, response_id: str, owner: str = "") -> bool:
        """Ask the replica running ``owner``'s job to cancel it; False if none runs it."""
        key = scoped(owner, response_id)
        return bool(await self._run(lambda conn: send_cancel(conn, key, owner, response_id)))

    async def wait_record(self, response_id: str, owner: str = "") -> StoredResponse:
        """The job's stored record, once its replica has put it (cancel's caller bounds it)."""
        key = scoped(owner, response_id)
        while True:
            changed = self._event(key)
            record = await self._store.get(response_id, owner)
            if record is not None:
                return record
            with trio.move_on_after(POLL_SECONDS):
                await changed.wait()

    async def follow(self, response_id: str, owner: str, start: int) -> AsyncIterator[bytes]:
        """SSE of the job's events from ``start`` on, live, until its terminal event."""
        key = scoped(owner, response_id)
        position = start
        while True:
            changed = self._event(key)
            events, running = await self._run(partial(read_events, key=key, start=position))
            if events:
                position += len(events)
                yield b"".join(encode_sse(event) for event in events)
                if events[-1].get("type") in TERMINAL:
                    return
                continue
            if not running:
                record = await self._store.get(response_id, owner)
                rest = [] if record is None else list(record.events[position:])
                if rest:
                    yield b"".join(encode_sse(event) for event in rest)
                elif record is not None and record.events:
                    # Ended another way (its replica stopped): its terminal event, in sequence.
                    yield encode_sse({**record.events[-1], "sequence_number": position})
                return
            with trio.move_on_after(POLL_SECONDS):
                await changed.wait()

    # -- the actor's loop --

    def _handle(self, message: LinkMessage, nursery: trio.Nursery) -> None:
        match message:
            case CancelArrived(owner, response_id):
                self.cancels_received += 1
                if self._cancel is not None:
                    nursery.start_soon(self._cancel, response_id, owner)
            case ProgressArrived(key):
                self._wake(key)
            case _:
                assert_never(message)

    def _close_worker(self) -> None:
        if self._conn is not None:
            release_replica_conn(self._conn, self.replica_id)
            self._conn.close()


def release_replica_conn(conn: psycopg.Connection[Any], replica_id: str) -> None:
    with conn.transaction():
        conn.execute("DELETE FROM replicas WHERE id = %s", (replica_id,))


def _listen(
    settings: ReplicaSettings,
    deliver: Callable[[LinkMessage], None],
    stopping: threading.Event,
) -> None:
    """The listener thread: notifications in, lease renewed, dead replicas swept. A database
    error is logged and the thread reconnects (its lease is renewed again as soon as it can)."""
    while not stopping.is_set():
        try:
            _listen_once(settings, deliver, stopping)
        except Exception:
            if stopping.is_set():
                return
            log.exception("the replica link lost its database connection; reconnecting")
            stopping.wait(min(settings.lease_seconds / 3, 1.0))


def _listen_once(
    settings: ReplicaSettings,
    deliver: Callable[[LinkMessage], None],
    stopping: threading.Event,
) -> None:
    interval = max(settings.lease_seconds / 3, 0.05)
    listener = connect(settings.url)
    db = PgDatabase(settings.url)
    try:
        sweeper = PgResponseStorage(db, settings.responses)
        listener.execute(f"LISTEN {CANCEL_CHANNEL}")
        listener.execute(f"LISTEN {PROGRESS_CHANNEL}")
        while not stopping.is_set():
            register_replica(db, settings.replica_id, settings.lease_seconds)
            try:
                if sweeper.sweep_dead_replicas():
                    log.warning("failed the jobs of a replica whose lease expired")
            except psycopg.errors.DeadlockDetected:
                pass  # another replica's write won; the next sweep retries
            for note in listener.notifies(timeout=min(interval, 0.2)):
                if note.channel == CANCEL_CHANNEL:
                    body = json.loads(note.payload)
                    deliver(CancelArrived(str(body["owner"]), str(body["id"])))
                else:
                    deliver(ProgressArrived(note.payload.rsplit("\t", 1)[0]))
    finally:
        listener.close()
        db.close()


def _register_lease(settings: ReplicaSettings) -> None:
    """Take this replica's lease once, on a worker thread (the listener renews it)."""
    db = PgDatabase(settings.url)
    try:
        register_replica(db, settings.replica_id, settings.lease_seconds)
    finally:
        db.close()


def new_replica_id() -> str:
    """This process's replica id: host name, pid and a random part (unique per start)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


async def start_replica_link(
    nursery: trio.Nursery,
    choice: StoreChoice,
    store: ResponseStoreHandle,
    *,
    replica_id: str,
    lease_seconds: float,
    limits: StoreLimits,
) -> ReplicaLink | None:
    """The replica link, started in ``nursery``, with a ``postgresql://`` store; else None."""
    if choice.kind != "postgresql":
        return None
    settings = ReplicaSettings(choice.path, replica_id, lease_seconds, limits)
    link: ReplicaLink = await nursery.start(run_replica_link, settings, store)
    return link


async def run_replica_link(
    settings: ReplicaSettings,
    store: ResponseStoreHandle,
    *,
    task_status: trio.TaskStatus[ReplicaLink] = trio.TASK_STATUS_IGNORED,
) -> None:
    link = ReplicaLink(settings, store)
    send: trio.MemorySendChannel[LinkMessage]
    receive: trio.MemoryReceiveChannel[LinkMessage]
    send, receive = trio.open_memory_channel(math.inf)
    token = trio.lowlevel.current_trio_token()
    stopping = threading.Event()

    def put(message: LinkMessage) -> None:  # on Trio's thread; must never raise there
        try:
            send.send_nowait(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the link is closing

    def deliver(message: LinkMessage) -> None:
        try:
            token.run_sync_soon(put, message)
        except trio.RunFinishedError:
            pass

    # The lease exists before this replica takes its first job, so no other replica's sweep can
    # take a job of a replica that is starting for one whose lease is missing.
    await trio.to_thread.run_sync(_register_lease, settings)
    listener = threading.Thread(
        target=_listen, args=(settings, deliver, stopping), name="replica-listener", daemon=True
    )
    listener.start()
    try:
        async with trio.open_nursery() as nursery, receive:
            task_status.started(link)
            async for message in receive:
                link._handle(message, nursery)
    finally:
        stopping.set()
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await link._worker.run(link._close_worker)
            await trio.to_thread.run_sync(listener.join, 5)
        link._worker.stop()


__all__ = ["ReplicaLink", "ReplicaSettings", "run_replica_link"]
