"""The job supervisor: background responses, each a job in its own cancel scope.

Invariants:
- A background response lives here, not under the HTTP request that created it: dropping the
  create connection or a poll cancels nothing. Only the cancel endpoint (through the response's
  own cancel, which removes its sequence from the batch) or shutdown ends a job early.
- Admission is decided in this one task: at most ``max_jobs`` active jobs; a create beyond that
  is refused (429) before anything is created.
- Every admitted job reaches exactly one terminal status: its driver runs the response to its
  terminal event, and if the job is cancelled from outside (shutdown), ``abandon`` ends it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import trio

from .kit import Reply, ask, open_mailbox
from .response import ResponseRun

log = logging.getLogger(__name__)


class TooManyJobs(RuntimeError):
    """``max_jobs`` background jobs are already active, or the active jobs' estimated bytes
    would pass the response store's byte budget (spec 000)."""


@dataclass(frozen=True, slots=True)
class StartJob:
    """Sender: the HTTP layer, for a prepared and admitted background response."""

    run: ResponseRun
    reply: Reply[None]


JobMessage = StartJob


@dataclass(frozen=True, slots=True)
class JobStatistics:
    active: int = 0
    started: int = 0
    finished: int = 0


class JobSupervisorHandle:
    def __init__(
        self, mailbox: trio.MemorySendChannel[JobMessage], max_jobs: int, max_bytes: int
    ) -> None:
        self._mailbox = mailbox
        self.max_jobs = max_jobs
        self.max_bytes = max_bytes
        self._stats = JobStatistics()

    @property
    def enabled(self) -> bool:
        return self.max_jobs > 0

    async def start(self, run: ResponseRun) -> None:
        """Run ``run`` as a job; raises ``TooManyJobs`` when the limit is reached."""
        await ask(self._mailbox, lambda reply: StartJob(run, reply))

    def statistics(self) -> JobStatistics:
        return self._stats


async def _drive(run: ResponseRun) -> None:
    try:
        await run.run_to_end()
    finally:
        run.abandon()


async def run_job_supervisor(
    max_jobs: int,
    max_bytes: int = 1 << 62,
    *,
    task_status: trio.TaskStatus[JobSupervisorHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    send: trio.MemorySendChannel[JobMessage]
    receive: trio.MemoryReceiveChannel[JobMessage]
    send, receive = open_mailbox()
    handle = JobSupervisorHandle(send, max_jobs, max_bytes)
    # The job tasks are this actor's own children (its nursery), so ``active`` stays inside
    # the actor: only the supervisor loop and its jobs touch it, all on one Trio thread.
    active: dict[str, int] = {}  # response id -> its estimated bytes
    counts = {"started": 0, "finished": 0}

    def publish() -> None:
        handle._stats = JobStatistics(len(active), counts["started"], counts["finished"])

    async def job(run: ResponseRun) -> None:
        try:
            await _drive(run)
        except Exception:
            log.exception("background job %s crashed", run.response_id)
        finally:
            active.pop(run.response_id, None)
            counts["finished"] += 1
            publish()

    async with trio.open_nursery() as jobs, receive:
        task_status.started(handle)
        async for message in receive:
            match message:
                case StartJob(run, reply):
                    if len(active) >= max_jobs:
                        reply.fail(TooManyJobs(f"{max_jobs} background jobs are already active"))
                        continue
                    if sum(active.values()) + run.estimated_bytes > max_bytes:
                        reply.fail(
                            TooManyJobs(
                                "the active background jobs would pass the response store's "
                                f"byte budget ({max_bytes} bytes)"
                            )
                        )
                        continue
                    await run.persist_job()  # issue 15: a durable job row until its record
                    active[run.response_id] = run.estimated_bytes
                    counts["started"] += 1
                    publish()
                    jobs.start_soon(job, run)
                    reply.send(None)
