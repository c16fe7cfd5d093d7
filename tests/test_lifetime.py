"""Response lifetimes (issue 11): a client that leaves at any point leaves nothing behind, a fault
stays with its request, and no request can wedge a connection or the server.

Every test runs the real server with the real model and checks the model's batch and the
response supervisor's books afterwards, not only HTTP status codes.
"""

from __future__ import annotations

import dataclasses
import json
import random
import threading
from collections.abc import Callable
from typing import Any

import httpx2 as httpx
import pytest
import trio

from mlx_responses.actors.model import GenerationRequest
from mlx_responses.http.auth import load_api_keys
from mlx_responses.server import ServerHandle, serve
from mlx_responses.storage.interface import StoredResponse
from mlx_responses.storage.memory import MemoryResponseStorage
from tests.conformance import assert_stream_invariants, parse_sse

from .conftest import MODEL, START_DEADLINE, server_settings, wait_until
from .faults import ThreadFaults
from .rawhttp import open_stream, read_until

DEADLINE = 60
COUNT = {"model": MODEL, "input": "Count from 1 to 110.", "temperature": 0}
HELLO = {"model": MODEL, "input": "Reply with: hello", "temperature": 0}


def left_over(server: ServerHandle) -> dict[str, int]:
    """Everything a finished request could leave behind; all zero when nothing is."""
    batch = server.model.statistics()
    books = server.responses.statistics()
    return {
        "sequences in the batch": batch.active,
        "admissions": batch.admitted,
        "queued sequences": batch.queued,
        "response tasks": books.tasks,
        "live logs": books.running,
        "active jobs": books.jobs_active,
    }


async def assert_nothing_left(server: ServerHandle) -> None:
    with trio.move_on_after(DEADLINE):
        await wait_until(lambda: not any(left_over(server).values()))
    assert not any(left_over(server).values()), left_over(server)


async def start(nursery: trio.Nursery, faults: ThreadFaults | None = None, **changes: Any) -> Any:
    model_changes = changes.pop("model", {})
    if faults is not None:
        model_changes["thread_factory"] = faults.factory
    settings = dataclasses.replace(server_settings(**model_changes), **changes)
    with trio.fail_after(START_DEADLINE):
        return await nursery.start(serve, settings)


# -- hang-ups at every point of a request's life ---------------------------------------------


async def test_hang_ups_before_the_response_start_leak_nothing(server: ServerHandle) -> None:
    """Clients that leave at once, before the first byte of the answer: while the body is read,
    the prompt rendered, the sequence admitted, or the response start sent."""
    rng = random.Random(11)
    with trio.fail_after(DEADLINE):
        for i in range(60):
            body = {**COUNT, "stream": i % 2 == 0}
            stream = await open_stream(server.base_url, "/v1/responses", body)
            await trio.sleep(rng.choice([0, 0, 0.0005, 0.002, 0.01]))
            await stream.aclose()
    await assert_nothing_left(server)
    # The server still serves, and its admission count is whole.
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            reply = await http.post("/v1/responses", json=HELLO)
    assert reply.status_code == 200
    assert reply.json()["output"][0]["content"][0]["text"] == "hello"


async def test_a_hang_up_during_prefill_frees_the_batch(nursery: trio.Nursery) -> None:
    server = await start(nursery, model={"prefill_step_size": 4})
    long_input = "Count from 1 to 110. " * 40
    with trio.fail_after(DEADLINE):
        stream = await open_stream(
            server.base_url, "/v1/responses", {**COUNT, "input": long_input, "stream": True}
        )
        await wait_until(lambda: server.model.statistics().prefilling > 0)
        await stream.aclose()
    await assert_nothing_left(server)
    stats = server.model.statistics()
    assert (stats.sequences_cancelled, stats.sequences_finished) == (1, 0)


@pytest.mark.parametrize("stream", [True, False])
async def test_a_hang_up_during_decode_frees_the_batch(server: ServerHandle, stream: bool) -> None:
    model = server.model
    with trio.fail_after(DEADLINE):
        connection = await open_stream(
            server.base_url, "/v1/responses", {**COUNT, "stream": stream}
        )
        if stream:
            await read_until(connection, b"event: response.output_text.delta", count=3)
        else:
            await wait_until(lambda: model.statistics().tokens_generated > 3)
        await connection.aclose()
    await assert_nothing_left(server)
    stats = model.statistics()
    assert (stats.sequences_cancelled, stats.sequences_finished) == (1, 0)
    # Nothing is stored for a response whose client left (its id was never answered whole).
    assert server.store.statistics().entries == 0


async def test_a_hang_up_at_the_terminal_write_leaves_one_consistent_answer(
    server: ServerHandle,
) -> None:
    """Leaving right as the last events go out: the response either finished (stored, whole)
    or was cancelled (nothing stored); never half of each, and nothing left running."""
    with trio.fail_after(DEADLINE):
        connection = await open_stream(server.base_url, "/v1/responses", {**HELLO, "stream": True})
        seen = await read_until(connection, b"event: response.output_text.done")
        await connection.aclose()
    await assert_nothing_left(server)
    response_id = json.loads(seen.split(b"data: ", 2)[1].split(b"\n", 1)[0])["response"]["id"]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            reply = await http.get(f"/v1/responses/{response_id}")
    if reply.status_code == 200:
        assert reply.json()["status"] == "completed"
    else:
        assert reply.status_code == 404


async def test_a_background_job_outlives_its_creator_hanging_up(server: ServerHandle) -> None:
    with trio.fail_after(DEADLINE):
        connection = await open_stream(
            server.base_url, "/v1/responses", {**HELLO, "background": True}
        )
        head = await read_until(connection, b'"status":"queued"')
        await connection.aclose()
        job_id = head.split(b'"id":"', 1)[1].split(b'"', 1)[0].decode()
        async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
            while (data := (await http.get(f"/v1/responses/{job_id}")).json())[  # noqa: ASYNC110
                "status"
            ] in ("queued", "in_progress"):
                await trio.sleep(0.01)
    assert data["status"] == "completed"
    await assert_nothing_left(server)


# -- a fault stays with its request ----------------------------------------------------------


async def test_an_exception_inside_a_running_job_fails_it_and_it_stays_pollable(
    server: ServerHandle, faults: ThreadFaults
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            job = (await http.post("/v1/responses", json={**COUNT, "background": True})).json()
            await wait_until(lambda: server.model.statistics().tokens_generated > 3)
            faults.poison()
            while (data := (await http.get(f"/v1/responses/{job['id']}")).json())[  # noqa: ASYNC110
                "status"
            ] in ("queued", "in_progress"):
                await trio.sleep(0.01)
            after = await http.post("/v1/responses", json=HELLO)
    assert data["status"] == "failed"
    assert data["error"]["code"] == "server_error"
    assert after.status_code == 200
    await assert_nothing_left(server)
    # The job's sequence left the batch as a cancel of a failed response, not as a thread crash.
    assert server.model.restarts == 0


async def stream_failed_by(http: httpx.AsyncClient, fault: Callable[[], None]) -> None:
    """Stream the counting answer, inject ``fault`` once its first delta is read, and check
    that the stream ended once, ``failed`` with ``server_error``."""
    async with http.stream("POST", "/v1/responses", json={**COUNT, "stream": True}) as r:
        body = b""
        async for chunk in r.aiter_bytes():
            injected = b"output_text.delta" in body
            body += chunk
            if not injected and b"output_text.delta" in body:
                fault()  # once: a fault left armed would hit the next request
    events = parse_sse(body)
    assert_stream_invariants(events)
    assert events[-1][0] == "response.failed"
    assert events[-1][1]["response"]["error"]["code"] == "server_error"


async def test_an_exception_inside_a_stream_ends_it_once_with_failed(
    server: ServerHandle, faults: ThreadFaults
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            await stream_failed_by(http, faults.poison)
    await assert_nothing_left(server)


async def test_a_detokenizer_failing_in_the_response_task_fails_it_and_frees_its_sequence(
    server: ServerHandle, faults: ThreadFaults
) -> None:
    """The response task detokenizes its sequence's tokens; when that fails, the response ends
    ``failed`` once while its sequence is still in the batch, and the sequence leaves the batch
    (a cancel, not a thread crash); the server goes on serving."""
    model = server.model
    cancelled = model.statistics().sequences_cancelled
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            await stream_failed_by(http, faults.break_detokenizer)
            after = await http.post("/v1/responses", json=HELLO)
    assert after.status_code == 200
    assert after.json()["status"] == "completed"
    await assert_nothing_left(server)
    assert model.statistics().sequences_cancelled == cancelled + 1
    assert model.restarts == 0


async def test_a_sequence_whose_logits_processor_raises_fails_alone(
    server: ServerHandle, faults: ThreadFaults
) -> None:
    """A fault in one sequence's own code on the generation thread ends that sequence alone;
    the others in the batch and the thread go on."""
    model = server.model
    prompt = tuple(
        await model.prompts.render([{"role": "user", "content": "Count from 1 to 110."}])
    )
    faults.break_processors("broken", after=3)

    with trio.fail_after(DEADLINE):
        healthy = [await model.submit(GenerationRequest(prompt, 40, 0.0, 1.0)) for _ in range(3)]
        broken = await model.submit(GenerationRequest(prompt, 40, 0.0, 1.0, owner="broken"))
        ends = {}
        for sequence in [*healthy, broken]:
            while (out := await sequence.receive()).finish is None:
                pass
            ends[sequence.seq_id] = out.finish
    assert ends[broken.seq_id] == "error"
    assert [ends[s.seq_id] for s in healthy] == ["length"] * 3
    assert model.restarts == 0
    await assert_nothing_left(server)


@pytest.mark.parametrize("seed", [-1, 2**64, 2**63])
async def test_an_unusable_seed_is_refused_while_other_streams_finish(
    server: ServerHandle, seed: int
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        endings: list[str] = []

        async def stream_one() -> None:
            async with http.stream("POST", "/v1/responses", json={**COUNT, "stream": True}) as r:
                body = b"".join([chunk async for chunk in r.aiter_bytes()])
            endings.append(parse_sse(body)[-1][0])

        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as streams:
                for _ in range(3):
                    streams.start_soon(stream_one)
                await wait_until(lambda: server.model.statistics().decoding >= 3)
                refused = await http.post(
                    "/v1/responses", json={**COUNT, "temperature": 1, "seed": seed}
                )
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "seed"
    assert endings == ["response.completed"] * 3
    await assert_nothing_left(server)


def _nested(depth: int) -> str:
    """JSON text nested ``depth`` objects deep (too deep for Python's own encoder)."""
    return '{"a":' * depth + '"x"' + "}" * depth


@pytest.mark.parametrize(
    "fields",
    [
        f'"input": [{_nested(10_000)}]',
        f'"metadata": {_nested(10_000)}',
        f'"tools": [{{"type": "function", "name": "f", "parameters": {_nested(10_000)}}}]',
        f'"text": {{"format": {{"type": "json_schema", "name": "deep", "schema": {_nested(320)}}}}}',
    ],
    ids=["input", "metadata", "tool schema", "json_schema 320"],
)
async def test_deeply_nested_json_is_a_400(server: ServerHandle, fields: str) -> None:
    body = (json.dumps(HELLO)[:-1] + ", " + fields + "}").encode()
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            reply = await http.post(
                "/v1/responses", content=body, headers={"Content-Type": "application/json"}
            )
    assert reply.status_code == 400, reply.text
    assert "nested too deeply" in reply.json()["error"]["message"]
    assert server.responses.statistics().tasks == 0
    assert server.model.statistics().sequences_finished == 0


# -- connections ------------------------------------------------------------------------------


async def _exchange(stream: trio.SocketStream, head: bytes, body: bytes) -> tuple[int, bytes]:
    """One request on a kept-alive connection; (status, headers block)."""
    await stream.send_all(head + body)
    seen = await read_until(stream, b"\r\n\r\n")
    headers, _, rest = seen.partition(b"\r\n\r\n")
    length = int(headers.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    while len(rest) < length:
        chunk = await stream.receive_some(65536)
        assert chunk, "closed mid-answer"
        rest += chunk
    return int(headers.split(b" ", 2)[1]), headers


@pytest.mark.parametrize(
    ("path", "status"),
    [("/v1/nowhere", 404), ("/v1/chat/completions", 404), ("/v1/responses", 401)],
)
async def test_refusing_routes_answer_every_request_on_one_keep_alive_connection(
    nursery: trio.Nursery, path: str, status: int
) -> None:
    server = await start(nursery, api_keys=load_api_keys(["sk-right"]))
    body = json.dumps({**HELLO, "padding": "x" * 2_000_000}).encode()
    host = server.base_url.removeprefix("http://")
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {'sk-wrong' if status == 401 else 'sk-right'}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    hostname, port = host.rsplit(":", 1)
    with trio.fail_after(DEADLINE):
        stream = await trio.open_tcp_stream(hostname, int(port))
        async with stream:
            statuses = [(await _exchange(stream, head, body))[0] for _ in range(5)]
    assert statuses == [status] * 5


async def test_a_body_over_the_limit_is_answered_and_the_next_request_served(
    nursery: trio.Nursery,
) -> None:
    server = await start(nursery, max_request_bytes=1000)
    body = json.dumps({**HELLO, "padding": "x" * 5000}).encode()
    async with httpx.AsyncClient(
        base_url=server.base_url, timeout=DEADLINE, limits=httpx.Limits(max_connections=1)
    ) as http:
        with trio.fail_after(DEADLINE):
            replies = [
                await http.post(
                    "/v1/responses", content=body, headers={"Content-Type": "application/json"}
                )
                for _ in range(5)
            ]
            served = await http.post("/v1/responses", json=HELLO)
    assert [r.status_code for r in replies] == [413] * 5
    assert replies[0].json()["error"]["type"] == "invalid_request_error"
    assert served.status_code == 200


@pytest.mark.parametrize(
    ("path", "status"), [("/v1/models", 404), ("/v1/nowhere", 404), ("/health", 404)]
)
async def test_a_websocket_upgrade_without_a_websocket_mode_is_a_404(
    server: ServerHandle, path: str, status: int
) -> None:
    host = server.base_url.removeprefix("http://")
    hostname, port = host.rsplit(":", 1)
    head = (
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()
    with trio.fail_after(DEADLINE):
        stream = await trio.open_tcp_stream(hostname, int(port))
        async with stream:
            await stream.send_all(head)
            seen = b""
            while b"}}" not in seen:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                seen += chunk
    assert seen.startswith(f"HTTP/1.1 {status}".encode()), seen[:200]
    envelope = json.loads(seen.split(b"\r\n\r\n", 1)[1].split(b"\r\n", 1)[-1].strip() or b"{}")
    assert envelope["error"]["type"] == "not_found_error"
    assert "no WebSocket mode" in envelope["error"]["message"]


# -- storing can fail without breaking the stream (issue 17) ---------------------------------


class _FailingStorage(MemoryResponseStorage):
    """The response store's backend, failing every write while ``failing`` is set."""

    failing = threading.Event()

    def put(self, record: StoredResponse) -> None:
        if self.failing.is_set():
            raise OSError("disk full (injected by a test)")
        super().put(record)


@pytest.mark.parametrize("stream", [True, False])
async def test_a_store_write_that_fails_ends_the_response_failed_and_streamed(
    nursery: trio.Nursery, stream: bool
) -> None:
    limits = server_settings().responses_store
    server = await start(nursery, response_storage=lambda: _FailingStorage(limits))
    _FailingStorage.failing.set()
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
            with trio.fail_after(DEADLINE):
                reply = await http.post("/v1/responses", json={**HELLO, "stream": stream})
                _FailingStorage.failing.clear()
                assert reply.status_code == 200
                if stream:
                    events = parse_sse(reply.content)
                    assert_stream_invariants(events)
                    final = events[-1][1]["response"]
                    assert events[-1][0] == "response.failed"
                else:
                    final = reply.json()
                missing = await http.get(f"/v1/responses/{final['id']}")
                after = await http.post("/v1/responses", json=HELLO)
    finally:
        _FailingStorage.failing.clear()
    assert final["status"] == "failed"
    assert final["error"]["code"] == "server_error"
    assert "could not be stored" in final["error"]["message"]
    assert missing.status_code == 404  # nothing half-stored
    assert after.status_code == 200
    await assert_nothing_left(server)
