"""Issue 25: a background job followed with the SDK's ``client.responses.stream(response_id=...)``
always ends with ``response.completed``, while many clients follow and poll it and another
process loads the machine.

The race this reproduces: a job's final record waited for the response store behind every
follower's and poller's read (a ``GET`` read the store first, even for a running job), past the
run's store deadline; the run then published ``response.failed`` ("could not be stored") to
its live followers while its record, still queued, landed ``completed`` a moment later. The
SDK's followers raised "Didn't receive a `response.completed` event"."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import trio
from openai import AsyncOpenAI

from mlx_responses.server import ServerHandle, serve
from mlx_responses.storage.choice import StoreChoice
from mlx_responses.storage.interface import StoredResponse
from mlx_responses.storage.memory import MemoryResponseStorage

from .conftest import MODEL, START_DEADLINE, server_settings

DEADLINE = 900
JOBS = 50  # issue 25: fifty runs in a row
FOLLOWERS = 4  # SDK stream helpers on the live job
POLLERS = 16  # clients replaying and polling the job until it ends
JOB = {"model": MODEL, "input": "Count from 1 to 10.", "temperature": 0, "max_output_tokens": 200}


@contextmanager
def busy_process() -> Iterator[None]:
    """A second process spinning on a core: every step of the server gets slower."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


async def follow(client: AsyncOpenAI, response_id: str, texts: list[str]) -> None:
    async with client.responses.stream(response_id=response_id) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_response()  # raises without response.completed
    texts.append(final.output_text)


async def poll(client: AsyncOpenAI, response_id: str) -> None:
    """Replay the job's stream and poll it, again and again, until it has ended."""
    while True:
        stream = await client.responses.retrieve(response_id, stream=True)
        async for _ in stream:
            pass
        if (await client.responses.retrieve(response_id)).status not in ("queued", "in_progress"):
            return


async def test_sdk_followers_of_a_background_job_always_see_it_complete(
    nursery: trio.Nursery,
) -> None:
    # The CLI's default store: SQLite, on the store actor's own thread.
    folder = tempfile.mkdtemp(prefix="mlx-responses-followers-")
    settings = dataclasses.replace(
        server_settings(), store=StoreChoice("sqlite", os.path.join(folder, "store.sqlite3"))
    )
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, settings)
    async with AsyncOpenAI(
        base_url=f"{server.base_url}/v1", api_key="sk-local", max_retries=0, timeout=DEADLINE
    ) as client:
        with busy_process(), trio.fail_after(DEADLINE):
            for _ in range(JOBS):
                job = await client.responses.create(**JOB, background=True)  # type: ignore[call-overload]
                texts: list[str] = []
                async with trio.open_nursery() as clients:
                    for _ in range(FOLLOWERS):
                        clients.start_soon(follow, client, job.id, texts)
                    for _ in range(POLLERS):
                        clients.start_soon(poll, client, job.id)
                assert len(texts) == FOLLOWERS
                assert len(set(texts)) == 1
                assert (await client.responses.retrieve(job.id)).status == "completed"
    assert server.responses.statistics().jobs_active == 0


# -- the mechanism, made certain --------------------------------------------------------------

# Longer than the five seconds a run used to wait for the store before it told its followers
# ``failed`` (the write, still queued, then landed ``completed``).
SLOW_WRITE_SECONDS = 6


# Long enough for the followers to be on the live job when it ends.
LONG_JOB = {"model": MODEL, "input": "Count from 1 to 110.", "temperature": 0}


class _SlowStorage(MemoryResponseStorage):
    """A store under load: a finished response's write takes ``SLOW_WRITE_SECONDS`` (it runs
    on the store actor's own thread, as a durable backend's commit does)."""

    slow = threading.Event()

    def put(self, record: StoredResponse) -> None:
        if self.slow.is_set() and record.response["status"] == "completed":
            time.sleep(SLOW_WRITE_SECONDS)
        super().put(record)


async def test_a_job_whose_store_write_is_slow_completes_for_its_followers(
    nursery: trio.Nursery,
) -> None:
    limits = server_settings().responses_store
    settings = dataclasses.replace(server_settings(), response_storage=lambda: _SlowStorage(limits))
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, settings)
    _SlowStorage.slow.set()
    try:
        async with AsyncOpenAI(
            base_url=f"{server.base_url}/v1", api_key="sk-local", max_retries=0, timeout=120
        ) as client:
            with trio.fail_after(120):
                job = await client.responses.create(**LONG_JOB, background=True)  # type: ignore[call-overload]
                texts: list[str] = []
                async with trio.open_nursery() as clients:
                    for _ in range(FOLLOWERS):
                        clients.start_soon(follow, client, job.id, texts)
                stored = await client.responses.retrieve(job.id)
    finally:
        _SlowStorage.slow.clear()
    assert len(texts) == FOLLOWERS  # every follower saw response.completed
    assert stored.status == "completed"
    assert stored.output_text == texts[0]
