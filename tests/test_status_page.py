"""Issue 16: the live status page at ``/``, in a real headless Chromium against the real server.

The browser is Debian's ``chromium`` (``make test`` installs it), driven over the DevTools
Protocol (``tests/browser.py``) on a worker thread while the server serves. Generation is slowed
by a sleep before each batch step (the real model, the real batch: only slower; 0.2 s a step
makes the counting answer run for about a minute), so a response is still running when the
page has loaded and its cancel button is clicked, however slow the machine.

Set ``MLX_RESPONSES_STATUS_SCREENSHOT=docs/status-page.png`` to write the screenshot kept in
the docs (otherwise it goes to the test's temporary folder).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx2 as httpx
import mlx.core as mx
import trio

from mlx_responses.engine.thread import GenerationThread
from mlx_responses.http.auth import load_api_keys
from mlx_responses.server import ServerHandle, serve

from .browser import Page, open_browser
from .conftest import MODEL, START_DEADLINE, server_settings, wait_until
from .rawhttp import open_stream, read_until

DEADLINE = 200
COUNT = {"model": MODEL, "input": "Count from 1 to 110.", "temperature": 0}
T = TypeVar("T")


class SlowSteps:
    """Generation threads that sleep ``delay`` seconds before each batch step while ``slow``
    is set (only while sequences run: an idle thread takes no steps)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.slow = threading.Event()
        self.slow.set()

    def factory(self, *args: Any, **kwargs: Any) -> GenerationThread:
        steps = self

        class SlowThread(GenerationThread):
            def _step(self, generator: Any) -> None:
                if steps.slow.is_set():
                    time.sleep(steps.delay)
                super()._step(generator)

        return SlowThread(*args, **kwargs)


async def start_server(nursery: trio.Nursery, steps: SlowSteps, **changes: Any) -> ServerHandle:
    settings = dataclasses.replace(server_settings(thread_factory=steps.factory), **changes)
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    return handle


async def on_thread(call: Callable[..., T], *args: Any) -> T:
    return await trio.to_thread.run_sync(call, *args)


class Browser:
    """The browser opened and closed on worker threads (each of its calls has a deadline)."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()

    async def __aenter__(self) -> Page:
        return await on_thread(self._stack.enter_context, open_browser())

    async def __aexit__(self, *_: object) -> None:
        await on_thread(self._stack.close)


def row(response_id: str) -> str:
    return f'#responses tr[data-id="{response_id}"]'


def shown(response_id: str) -> str:
    """JS: the page lists the response as running (queued or in progress)."""
    return (
        f"(() => {{ const r = document.querySelector({json.dumps(row(response_id))});"
        " return !!r && /in progress|queued/.test(r.querySelector('.status').textContent); })()"
    )


SCREENSHOT = os.environ.get("MLX_RESPONSES_STATUS_SCREENSHOT")
PROMPTS = ("Say yes.", "Name three colors.", "What is the capital of France?", "Reply with: hello")


def screenshot_path(tmp_path: Path) -> Path:
    return Path(SCREENSHOT) if SCREENSHOT else tmp_path / "status-page.png"


async def traffic(http: httpx.AsyncClient, seconds: float) -> None:
    """For the docs' screenshot only: a minute of varied requests, so the charts have a
    history (four clients, short and long answers, repeated prompts for the cache)."""

    async def client(index: int) -> None:
        for turn in range(10_000):
            prompt = PROMPTS[(index + turn) % len(PROMPTS)] if turn % 3 else COUNT["input"]
            await http.post("/v1/responses", json={**COUNT, "input": prompt})
            await trio.sleep(0.2 * (turn % 4))

    with trio.move_on_after(seconds):
        async with trio.open_nursery() as clients:
            for index in range(4):
                clients.start_soon(client, index)


async def response_status(http: httpx.AsyncClient, response_id: str, **headers: str) -> str:
    status: str = (await http.get(f"/v1/responses/{response_id}", headers=headers)).json()["status"]
    return status


async def test_status_page_shows_running_responses_and_cancels_them(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    steps = SlowSteps(0.2)
    server = await start_server(nursery, steps)
    model = server.model
    base = server.base_url
    async with httpx.AsyncClient(base_url=base, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            # A finished request first, so the charts, the percentiles and the request list
            # have something in them.
            done = await http.post("/v1/responses", json={**COUNT, "input": "Say yes."})
            assert done.json()["status"] == "completed"
            if SCREENSHOT:
                steps.slow.clear()
                await traffic(http, 60)
                await model.wait_idle()
                steps.slow.set()
            cancelled_before = model.statistics().sequences_cancelled
            job = (await http.post("/v1/responses", json={**COUNT, "background": True})).json()
            stream = await open_stream(base, "/v1/responses", {**COUNT, "stream": True})
            async with stream:
                head = await read_until(stream, b"event: response.output_text.delta")
                foreground = head.split(b'"id":"', 1)[1].split(b'"', 1)[0].decode()
                await wait_until(lambda: model.statistics().active == 2)
                async with Browser() as page:
                    await on_thread(page.goto, f"{base}/")
                    await on_thread(page.wait_for, shown(job["id"]), 30)
                    await on_thread(page.wait_for, shown(foreground), 30)
                    assert await on_thread(page.evaluate, "$('conn').textContent") == "live"
                    kinds = await on_thread(
                        page.evaluate,
                        "[...document.querySelectorAll('#responses tbody tr .kind')]"
                        ".map(e => e.textContent).sort()",
                    )
                    assert kinds == ["job", "stream"]
                    # The finished request is in the list; the model and its window are shown.
                    await on_thread(page.wait_for, "$('requests').tBodies[0].rows.length >= 3", 10)
                    text = await on_thread(page.evaluate, "document.body.innerText")
                    assert MODEL in text
                    assert str(model.info.context_window) in text.replace(",", "")
                    await on_thread(page.wait_for, "$('ttft-count').textContent !== '0'", 10)
                    # The KV bytes the two running sequences hold, and the batch's sizes with
                    # their source (no flag: the device's).
                    await on_thread(
                        page.wait_for, "/KV held [1-9]/.test($('batch-capacity').textContent)", 10
                    )
                    assert "512 (cpu default)" in text
                    await on_thread(page.screenshot, screenshot_path(tmp_path))

                    # The job's cancel button: the job ends cancelled, its sequence leaves.
                    await on_thread(page.click, f"{row(job['id'])} button.cancel")
                    await on_thread(
                        page.wait_for,
                        f"document.querySelector('{row(job['id'])} button').textContent"
                        " === 'Cancelled'",
                        20,
                    )
                    await wait_until(lambda: model.statistics().active == 1)
                    assert await response_status(http, job["id"]) == "cancelled"

                    # The stream's: its client reads response.cancelled, the batch is empty.
                    await on_thread(page.click, f"{row(foreground)} button.cancel")
                    await read_until(stream, b"event: response.cancelled")
                    await model.wait_idle()
                    # Both rows leave the page once the server no longer lists them.
                    await on_thread(
                        page.wait_for, "$('responses').tBodies[0].rows.length === 0", 20
                    )
            assert await response_status(http, foreground) == "cancelled"
    stats = model.statistics()
    assert stats.active == 0
    assert stats.admitted == 0
    assert stats.sequences_cancelled - cancelled_before == 2
    books = server.responses.statistics()
    assert books.running == 0
    assert books.jobs_active == 0


async def test_status_page_with_keys_shows_each_tenant_only_its_own(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-alice alice\nsk-bob bob\n")
    steps = SlowSteps(0.2)
    server = await start_server(nursery, steps, api_keys=load_api_keys([], str(keys)))
    model = server.model
    alice = {"Authorization": "Bearer sk-alice"}
    bob = {"Authorization": "Bearer sk-bob"}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            job = {**COUNT, "background": True}
            mine = (await http.post("/v1/responses", json=job, headers=alice)).json()
            theirs = (await http.post("/v1/responses", json=job, headers=bob)).json()
            await wait_until(lambda: model.statistics().active == 2)
            # The page loads without a key; its data do not.
            assert (await http.get("/")).status_code == 200
            assert (await http.get("/status")).status_code == 401
            async with Browser() as page:
                await on_thread(page.goto, f"{server.base_url}/")
                await on_thread(page.wait_for, "$('conn').textContent === 'API key needed'", 20)
                assert await on_thread(page.evaluate, "$('responses').tBodies[0].rows.length") == 0
                assert await on_thread(page.evaluate, "$('requests').tBodies[0].rows.length") == 0

                await on_thread(page.type_into, "#key", "sk-wrong")
                await on_thread(page.click, "#connect")
                await on_thread(page.wait_for, "$('conn').textContent === 'key refused'", 20)

                await on_thread(page.evaluate, "$('key').value = ''")
                await on_thread(page.type_into, "#key", "sk-alice")
                await on_thread(page.click, "#connect")
                await on_thread(page.wait_for, shown(mine["id"]), 30)
                await on_thread(page.wait_for, "$('requests').tBodies[0].rows.length >= 1", 10)
                text = await on_thread(page.evaluate, "document.body.innerText")
                assert mine["id"] in text
                assert theirs["id"] not in text
                assert "bob" not in text
                # Bob's job is in the whole server's counts, anonymously.
                assert "2 running" in await on_thread(page.evaluate, "$('totals').textContent")

                await on_thread(page.click, f"{row(mine['id'])} button.cancel")
                await wait_until(lambda: model.statistics().active == 1)
                assert await response_status(http, mine["id"], **alice) == "cancelled"
                assert await response_status(http, theirs["id"], **bob) == "in_progress"
            await http.post(f"/v1/responses/{theirs['id']}/cancel", headers=bob)
            await model.wait_idle()
    assert model.statistics().active == 0
    assert model.statistics().sequences_cancelled == 2


async def test_status_data_are_per_tenant(nursery: trio.Nursery, tmp_path: Path) -> None:
    """``GET /status``: each tenant's running responses and requests, the batch for all."""
    keys = tmp_path / "keys"
    keys.write_text("sk-alice alice\nsk-bob bob\n")
    steps = SlowSteps(0.2)
    server = await start_server(nursery, steps, api_keys=load_api_keys([], str(keys)))
    alice = {"Authorization": "Bearer sk-alice"}
    bob = {"Authorization": "Bearer sk-bob"}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            job = {**COUNT, "background": True}
            mine = (await http.post("/v1/responses", json=job, headers=alice)).json()
            await wait_until(lambda: server.model.statistics().tokens_generated > 2)
            as_alice = (await http.get("/status", headers=alice)).json()
            as_bob = (await http.get("/status", headers=bob)).json()
            await http.post(f"/v1/responses/{mine['id']}/cancel", headers=alice)
            await server.model.wait_idle()
    assert [r["id"] for r in as_alice["responses"]] == [mine["id"]]
    running = as_alice["responses"][0]
    assert running["kind"] == "background"
    assert running["status"] == "in_progress"
    assert running["prompt_tokens"] > 0
    assert running["output_tokens"] > 0
    assert [line["response_id"] for line in as_alice["requests"]] == [mine["id"]]
    assert as_alice["tenant"] == "alice"
    assert as_bob["responses"] == []
    assert as_bob["requests"] == []
    assert as_bob["totals"]["running"] == 1
    assert as_bob["batch"]["active"] == 1
    assert as_bob["server"]["model"] == MODEL
    # The device is the model actor's fact, asked of MLX on the generation thread at load.
    assert as_bob["server"]["backend"].startswith(f"MLX {mx.__version__} on Device(")


async def test_an_open_status_stream_ends_when_the_server_shuts_down(
    nursery: trio.Nursery,
) -> None:
    # A long grace: without the stream ending by itself the deadline below would pass first.
    settings = dataclasses.replace(server_settings(), graceful_timeout=60)
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, settings)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(30):
            async with http.stream("GET", "/status/events") as reply:
                assert reply.status_code == 200
                assert reply.headers["content-type"].startswith("text/event-stream")
                views = 0
                async for text in reply.aiter_lines():
                    if text.startswith("data: "):
                        view = json.loads(text.removeprefix("data: "))
                        assert view["object"] == "mlx.status"
                        views += 1
                        if views == 2:
                            server.shutdown()
    assert views >= 2
