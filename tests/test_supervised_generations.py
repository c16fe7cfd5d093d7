"""Issue 25: every generation is a response task under the supervisor. A compaction
(``POST /v1/responses/compact``) and a WebSocket warm-up (``generate: false``) show on
``/status`` as running responses, are cancellable by id, and shutdown waits for them."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx2 as httpx
import pytest
import trio
import websockets.sync.client as ws_client

from mlx_responses.engine.thread import GenerationThread
from mlx_responses.server import ServerHandle, serve

from .conftest import MODEL, START_DEADLINE, server_settings, wait_until

DEADLINE = 120
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Count from 1 to 40."},
    {"role": "assistant", "content": " ".join(str(n) for n in range(1, 41))},
    {"role": "user", "content": "Reply with: goodbye"},
    {"role": "assistant", "content": "goodbye"},
    {"role": "user", "content": "Say something short."},
]
COMPACT = {"model": MODEL, "input": HISTORY, "keep_tokens": 10, "max_output_tokens": 64}


class Gate:
    """Generation threads that step only while the gate is open: a test holds a generation
    where it can look at it (the step itself is mlx-lm's, unchanged)."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()

    def factory(self, *args: Any, **kwargs: Any) -> GenerationThread:
        gate = self

        class GatedThread(GenerationThread):
            def _step(self, generator: Any) -> None:
                gate.open.wait(timeout=DEADLINE)
                super()._step(generator)

        return GatedThread(*args, **kwargs)


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
async def gated(nursery: trio.Nursery, gate: Gate) -> ServerHandle:
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(
            serve, server_settings(thread_factory=gate.factory)
        )
    return handle


async def running_ids(http: httpx.AsyncClient) -> list[str]:
    status = (await http.get("/status")).json()
    return [line["id"] for line in status["responses"]]


async def wait_running(server: ServerHandle) -> str:
    """The one running response's id, once the supervisor lists it."""
    await wait_until(lambda: server.responses.statistics().running > 0, poll=0.01)
    (only,) = await server.responses.running("")
    return only.response_id


async def cancel_the_summary(
    server: ServerHandle, gate: Gate, path: str, body: dict[str, Any]
) -> tuple[httpx.Response, httpx.Response]:
    """POST ``body`` to ``path``, whose summary generates first, and cancel that summary by the
    id ``/status`` lists it under: the cancel's answer and the opener's."""
    answer: list[httpx.Response] = []
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            gate.open.clear()  # the summary is admitted and waits for its first step
            async with trio.open_nursery() as nursery:

                async def open_it() -> None:
                    answer.append(await http.post(path, json=body))

                nursery.start_soon(open_it)
                summary_id = await wait_running(server)
                assert await running_ids(http) == [summary_id]  # on /status
                cancelled = await http.post(f"/v1/responses/{summary_id}/cancel")
                gate.open.set()
            await server.model.wait_idle()
    (reply,) = answer
    return cancelled, reply


def assert_cancelled_leaving_nothing(
    server: ServerHandle, cancelled: httpx.Response, reply: httpx.Response
) -> None:
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["code"] == "cancelled"
    stats = server.responses.statistics()
    assert (stats.tasks, stats.running) == (0, 0)
    assert server.store.statistics().entries == 0  # a summary is never stored
    assert server.model.statistics().sequences_cancelled == 1  # the summary left the batch


async def test_a_compaction_is_a_running_response_cancellable_by_id(
    gated: ServerHandle, gate: Gate
) -> None:
    cancelled, reply = await cancel_the_summary(gated, gate, "/v1/responses/compact", COMPACT)
    assert_cancelled_leaving_nothing(gated, cancelled, reply)


async def test_a_compaction_whose_client_leaves_ends_with_its_summary(
    gated: ServerHandle, gate: Gate
) -> None:
    server = gated
    with trio.fail_after(DEADLINE):
        gate.open.clear()
        async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
            async with trio.open_nursery() as nursery:

                async def compact() -> None:
                    await http.post("/v1/responses/compact", json=COMPACT)

                nursery.start_soon(compact)
                await wait_running(server)
                nursery.cancel_scope.cancel()  # the client hangs up
        gate.open.set()
        await wait_until(lambda: server.responses.statistics().tasks == 0, poll=0.01)
        await server.model.wait_idle()
    assert server.model.statistics().sequences_cancelled == 1


async def test_shutdown_waits_for_a_compaction_and_answers_it(gate: Gate) -> None:
    answer: list[httpx.Response] = []
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as serving:  # ends when the server has stopped
            server: ServerHandle = await serving.start(
                serve, server_settings(thread_factory=gate.factory)
            )
            async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
                gate.open.clear()
                async with trio.open_nursery() as nursery:

                    async def compact() -> None:
                        answer.append(await http.post("/v1/responses/compact", json=COMPACT))

                    nursery.start_soon(compact)
                    await wait_running(server)
                    server.shutdown()
                    gate.open.set()
    # The compaction was answered before the server stopped, not cut off: its summary ended
    # with the shutdown (or just before it).
    (reply,) = answer
    if reply.status_code == 200:
        assert reply.json()["object"] == "response.compaction"
    else:
        assert reply.status_code in (500, 503), reply.text
        assert reply.json()["error"]["type"] == "server_error"
    assert server.responses.statistics().running == 0


async def test_a_websocket_warm_up_is_a_running_response_cancellable_by_id(
    gated: ServerHandle, gate: Gate
) -> None:
    server = gated
    url = server.base_url.replace("http://", "ws://") + "/v1/responses"
    events: list[dict[str, Any]] = []

    def warm_up() -> None:
        with ws_client.connect(url) as socket:
            create = {"type": "response.create", "generate": False, "input": "Say hi."}
            socket.send(json.dumps({**create, "model": MODEL}))
            while True:
                events.append(json.loads(socket.recv(timeout=DEADLINE)))
                if events[-1]["type"] in ("response.completed", "response.cancelled", "error"):
                    return

    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            gate.open.clear()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, warm_up)
                warm_id = await wait_running(server)
                assert await running_ids(http) == [warm_id]
                cancelled = await http.post(f"/v1/responses/{warm_id}/cancel")
                gate.open.set()
    assert cancelled.status_code == 200, cancelled.text
    assert events[-1]["type"] == "response.cancelled"
    assert events[-1]["response"]["id"] == warm_id
    assert server.responses.statistics().tasks == 0


async def test_a_steering_successor_is_a_running_response_cancellable_by_id(
    gated: ServerHandle, gate: Gate
) -> None:
    server = gated
    url = server.base_url.replace("http://", "ws://") + "/v1/responses"
    count = {"model": MODEL, "input": "Count from 1 to 110.", "temperature": 0}
    events: list[dict[str, Any]] = []
    target: list[str] = []

    def steer_then_follow() -> None:
        with ws_client.connect(url) as socket:
            socket.send(json.dumps({"type": "response.create", **count}))
            while True:
                event = json.loads(socket.recv(timeout=DEADLINE))
                events.append(event)
                if event["type"] == "response.created" and not target:
                    target.append(event["response"]["id"])
                if event["type"] == "response.output_text.delta" and gate.open.is_set():
                    gate.open.clear()  # the successor will wait, admitted, for its first step
                    steer = {"previous_response_id": target[0], "input": "Reply with: hello"}
                    socket.send(json.dumps({"type": "response.steer", **steer}))
                response = event.get("response") or {}
                if event["type"] == "response.cancelled" and response.get("id") != target[0]:
                    return

    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, steer_then_follow)
                await wait_until(lambda: bool(target), poll=0.01)

                await wait_until(
                    lambda: (
                        any(e["type"] == "response.incomplete" for e in events)
                        and server.responses.statistics().running == 1
                    ),
                    poll=0.01,
                )
                (listed,) = await server.responses.running("")
                successor = listed.response_id
                assert successor != target[0]
                assert successor in await running_ids(http)  # on /status
                cancelled = await http.post(f"/v1/responses/{successor}/cancel")
                gate.open.set()
    assert cancelled.status_code == 200, cancelled.text
    steered = next(e for e in events if e["type"] == "response.incomplete")
    assert steered["response"]["incomplete_details"] == {"reason": "steered"}
    assert events[-1]["response"]["id"] == successor
    assert server.responses.statistics().tasks == 0


async def test_a_compacting_creates_summary_is_a_running_response_cancellable_by_id(
    gate: Gate, nursery: trio.Nursery
) -> None:
    """Automatic compaction: a foreground create's summary generates before its response
    exists. The summary is listed on ``/status`` while it runs, and cancelling it by its id
    ends the create with a ``cancelled`` error; nothing is stored or left running."""
    with trio.fail_after(START_DEADLINE):
        # A 512-token window: the history has turns older than the kept ones to summarize.
        server: ServerHandle = await nursery.start(
            serve, server_settings(thread_factory=gate.factory, context_size=512)
        )
    managed = [{"type": "compaction", "compact_threshold": 1}]
    body = {"model": MODEL, "input": HISTORY, "context_management": managed}
    cancelled, reply = await cancel_the_summary(server, gate, "/v1/responses", body)
    assert_cancelled_leaving_nothing(server, cancelled, reply)
