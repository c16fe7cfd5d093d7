"""A storage thread: one OS thread that runs a durable backend's blocking I/O, in order.

Invariants:
- A store actor with a durable backend owns exactly one ``StorageThread``; the backend is
  opened, used and closed only on it (``sqlite3`` connections belong to the thread that made
  them, and ``trio.to_thread.run_sync`` does not pin one), so Trio never blocks on disk I/O.
- Jobs run one at a time in submission order; ``run`` waits for the answer without blocking
  Trio (the thread wakes it with ``TrioToken.run_sync_soon``). A caller cancelled while
  waiting stops waiting, but the job still runs to its end (a commit is never torn).
- An exception raised by a job is raised in the caller, and the thread keeps running.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Protocol, TypeVar

import outcome
import trio

T = TypeVar("T")
CLOSE_DEADLINE_SECONDS = 10


class StorageThread:
    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` run on the thread; its value, or its exception raised here."""
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        box: list[outcome.Outcome[T]] = []

        def job() -> None:
            box.append(outcome.capture(fn))
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass

        self._jobs.put(job)
        await done.wait()
        return box[0].unwrap()

    def stop(self) -> None:
        """Let the thread end after the jobs already submitted (never blocks)."""
        self._jobs.put(None)


class Closeable(Protocol):
    def close(self) -> None: ...


B = TypeVar("B", bound=Closeable)


@asynccontextmanager
async def storage_runner(
    name: str, open_backend: Callable[[], B] | None
) -> AsyncIterator[tuple[B | None, Callable[[Callable[[], T]], Awaitable[T]] | None]]:
    """``(backend, run)`` for a store actor: with ``open_backend``, a ``StorageThread`` named
    ``name``, the backend opened on it (migrations included) and its ``run``; on exit the
    backend is closed on the thread (shielded, bounded) and the thread ends. Without it,
    ``(None, None)``: the actor serves its in-memory backend in its own task."""
    if open_backend is None:
        yield None, None
        return
    thread = StorageThread(name)
    try:
        backend = await thread.run(open_backend)
        try:
            yield backend, thread.run
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_DEADLINE_SECONDS):
                await thread.run(backend.close)
    finally:
        thread.stop()
