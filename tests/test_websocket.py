"""The WebSocket mode (issue 14), driven by the openai SDK's own ``client.responses.connect()``.

The SDK's WebSocket client is synchronous here (its async one runs on asyncio), so each client
runs on a worker thread while the real server runs on the test's Trio loop.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx2 as httpx
import pytest
import trio
import websockets.sync.client as ws_client
from openai import OpenAI
from websockets.exceptions import ConnectionClosed, InvalidStatus

from mlx_responses.http.auth import load_api_keys
from mlx_responses.server import ServerHandle, serve
from tests.conformance import assert_stream_invariants, assert_strict_response

from .conftest import MODEL, START_DEADLINE, output_text, server_settings, wait_until

DEADLINE = 90
HELLO = {"model": MODEL, "input": "Reply with: hello", "temperature": 0}
COUNT = {"model": MODEL, "input": "Count from 1 to 110.", "temperature": 0}
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}

Event = dict[str, Any]


def sdk(server: ServerHandle, key: str = "sk-local") -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0, timeout=60)


def received(connection: Any) -> Iterator[Event]:
    """The server's events as sent (raw JSON: the SDK's models would coerce some fields)."""
    while True:
        yield json.loads(connection.recv_bytes())


def until_terminal(connection: Any, events: list[Event] | None = None) -> list[Event]:
    """Events of one response (or one error), as JSON dicts, up to its terminal event."""
    seen: list[Event] = [] if events is None else events
    for data in received(connection):
        seen.append(data)
        if data["type"] in TERMINAL or data["type"] == "error":
            return seen
    raise AssertionError(f"the socket closed before a terminal event: {seen[-3:]}")


async def in_thread(function: Callable[[], Any]) -> Any:
    with trio.fail_after(DEADLINE):
        return await trio.to_thread.run_sync(function)


def strict(events: list[Event]) -> Event:
    """The stream invariants of SSE (numbering, pairing, one terminal); the final object."""
    return assert_stream_invariants([(e["type"], e) for e in events])


async def post(server: ServerHandle, body: dict[str, Any], path: str = "/v1/responses") -> Any:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            reply = await http.post(path, json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


async def test_a_response_over_the_socket_is_the_http_one(server: ServerHandle) -> None:
    def run() -> list[Event]:
        with sdk(server).responses.connect() as connection:
            connection.send({"type": "response.create", **COUNT})
            return until_terminal(connection)

    events = await in_thread(run)
    final = strict(events)
    assert events[0]["sequence_number"] == 0
    assert [e["type"] for e in events].count("response.completed") == 1
    assert_strict_response(final)
    over_http = await post(server, COUNT)
    assert output_text(final) == output_text(over_http)
    # Stored like any response (store defaults to true).
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        stored = (await http.get(f"/v1/responses/{final['id']}")).json()
    assert stored == final


async def test_store_false_continuation_sends_only_the_new_items(server: ServerHandle) -> None:
    def run() -> tuple[list[Event], list[Event]]:
        with sdk(server).responses.connect() as connection:
            connection.send({"type": "response.create", **HELLO, "store": False})
            first = until_terminal(connection)
            previous = first[-1]["response"]["id"]
            connection.send(
                {
                    "type": "response.create",
                    **HELLO,
                    "store": False,
                    "previous_response_id": previous,
                }
            )
            return first, until_terminal(connection)

    first, second = await in_thread(run)
    one, two = strict(first), strict(second)
    assert two["previous_response_id"] == one["id"]
    # The second turn generated from the whole history, as a full replay over HTTP would.
    replay = [
        {"role": "user", "content": "Reply with: hello"},
        *one["output"],
        {"role": "user", "content": "Reply with: hello"},
    ]
    counted = await post(server, {"model": MODEL, "input": replay}, "/v1/responses/input_tokens")
    assert two["usage"]["input_tokens"] == counted["input_tokens"]
    assert two["usage"]["input_tokens"] > one["usage"]["input_tokens"]
    # Neither turn was stored: the chain lived on the connection.
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        assert (await http.get(f"/v1/responses/{one['id']}")).status_code == 404


WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The name of the city."}},
        "required": ["city"],
    },
}
WEATHER = '{"city": "Paris", "temperature": 18, "condition": "sunny"}'


async def test_an_incremental_continuation_is_the_full_replay(server: ServerHandle) -> None:
    """A tool loop on one socket (each continuation tokenized incrementally against the
    connection's kept prompt) gives what the same history replayed in full over HTTP gives:
    the same prompt (input_tokens), the same greedy answer, and cache hits as exact."""
    settings = {"model": MODEL, "temperature": 0, "store": False, "tools": [WEATHER_TOOL]}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]

    def run() -> list[Event]:
        with sdk(server).responses.connect() as connection:
            connection.send({"type": "response.create", **settings, "input": ask})
            first = strict(until_terminal(connection))
            call = next(i for i in first["output"] if i["type"] == "function_call")
            answer = [
                {"type": "function_call_output", "call_id": call["call_id"], "output": WEATHER}
            ]
            connection.send(
                {
                    "type": "response.create",
                    **settings,
                    "previous_response_id": first["id"],
                    "input": answer,
                }
            )
            second = strict(until_terminal(connection))
            connection.send(
                {
                    "type": "response.create",
                    **settings,
                    "previous_response_id": second["id"],
                    "input": ask,
                }
            )
            return [first, second, strict(until_terminal(connection))]

    turns = await in_thread(run)
    assert output_text(turns[1]) == "It is sunny and 18 degrees in Paris."
    call = next(i for i in turns[0]["output"] if i["type"] == "function_call")
    answer = [{"type": "function_call_output", "call_id": call["call_id"], "output": WEATHER}]
    history: list[Any] = []
    for index, (turn, new) in enumerate(zip(turns, [ask, answer, ask], strict=True)):
        history += new
        replayed = await post(server, {**settings, "input": history})
        assert turn["usage"]["input_tokens"] == replayed["usage"]["input_tokens"]
        assert [i["type"] for i in turn["output"]] == [i["type"] for i in replayed["output"]]
        assert output_text(turn) == output_text(replayed)
        cached = turn["usage"]["input_tokens_details"]["cached_tokens"]
        assert cached < turn["usage"]["input_tokens"]
        if index:
            # The kept history's prompt was found in the prompt cache.
            assert cached >= turns[index - 1]["usage"]["input_tokens"] - 1
        history += turn["output"]


async def test_tools_resent_every_turn_are_checked_as_on_the_first(server: ServerHandle) -> None:
    """An agent resends its tools with every continuation; the server remembers each schema's
    check (issue 14), and a remembered answer is the check's own: the same tools continue, an
    invalid schema is refused on every turn it is sent, with the same message."""
    settings = {"model": MODEL, "temperature": 0, "store": False, "max_output_tokens": 4}
    bad_tool = {**WEATHER_TOOL, "parameters": {"type": "object", "required": "city"}}

    def run() -> list[list[Event]]:
        turns: list[list[Event]] = []
        with sdk(server).responses.connect() as connection:
            previous = None
            for tools in ([WEATHER_TOOL], [WEATHER_TOOL], [bad_tool], [bad_tool], [WEATHER_TOOL]):
                body = {"type": "response.create", **settings, "tools": tools, "input": "Hi"}
                if previous is not None:
                    body["previous_response_id"] = previous
                connection.send(body)
                events = until_terminal(connection)
                turns.append(events)
                # A refused continuation evicts the kept response: start a new chain.
                ok = events[-1]["type"] != "error"
                previous = events[-1]["response"]["id"] if ok else None
        return turns

    turns = await in_thread(run)
    kinds = [events[-1]["type"] for events in turns]
    finished = {"response.completed", "response.incomplete"}
    assert {kinds[0], kinds[1], kinds[4]} <= finished
    assert strict(turns[1])["previous_response_id"] == strict(turns[0])["id"]
    assert kinds[2:4] == ["error", "error"]
    first, again = turns[2][-1], turns[3][-1]
    assert first["status"] == again["status"] == 400
    assert first["error"]["param"] == again["error"]["param"] == "tools[0].parameters"
    assert first["error"]["message"] == again["error"]["message"]
    assert "is not a valid JSON Schema" in first["error"]["message"]
    # HTTP refuses the same schema with the same message.
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        reply = await http.post(
            "/v1/responses", json={**settings, "tools": [bad_tool], "input": "Hi"}
        )
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == first["error"]["message"]


async def test_an_unknown_previous_response_is_an_error_event_and_the_socket_stays(
    server: ServerHandle,
) -> None:
    def run() -> tuple[list[Event], list[Event]]:
        with sdk(server).responses.connect() as connection:
            connection.send(
                {"type": "response.create", **HELLO, "previous_response_id": "resp_nowhere"}
            )
            refused = until_terminal(connection)
            connection.send({"type": "response.create", **HELLO})
            return refused, until_terminal(connection)

    refused, served = await in_thread(run)
    assert [e["type"] for e in refused] == ["error"]
    error = refused[0]
    assert error["status"] == 400
    assert error["error"]["code"] == "previous_response_not_found"
    assert error["error"]["param"] == "previous_response_id"
    assert output_text(strict(served)) == "hello"


async def test_a_warm_up_generates_nothing_and_chains(server: ServerHandle) -> None:
    def run() -> tuple[list[Event], list[Event]]:
        with sdk(server).responses.connect() as connection:
            connection.send(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "input": [{"role": "developer", "content": "Be brief."}],
                    "store": False,
                    "generate": False,
                }
            )
            warm = until_terminal(connection)
            connection.send(
                {
                    "type": "response.create",
                    **HELLO,
                    "store": False,
                    "previous_response_id": warm[-1]["response"]["id"],
                }
            )
            return warm, until_terminal(connection)

    generated_before = server.model.statistics().tokens_generated
    warm, after = await in_thread(run)
    warmed = strict(warm)
    assert warmed["status"] == "completed"
    assert warmed["output"] == []
    assert warmed["usage"]["output_tokens"] == 0
    assert warmed["usage"]["input_tokens"] > 0
    continued = strict(after)
    expected = await post(
        server,
        {**HELLO, "input": [{"role": "developer", "content": "Be brief."}, *after_input()]},
    )
    assert output_text(continued) == output_text(expected)
    # The warm-up prefilled: the continuation found its prefix in the prompt cache.
    assert continued["usage"]["input_tokens_details"]["cached_tokens"] > 0
    assert server.model.statistics().tokens_generated > generated_before


def after_input() -> list[dict[str, Any]]:
    return [{"role": "user", "content": "Reply with: hello"}]


async def test_three_sockets_and_three_lanes_generate_at_once(server: ServerHandle) -> None:
    expected = output_text(await post(server, COUNT))

    def one_socket() -> str:
        with sdk(server).responses.connect() as connection:
            connection.send({"type": "response.create", **COUNT})
            return output_text(strict(until_terminal(connection)))

    def three_lanes() -> dict[str, str]:
        with sdk(server).responses.connect() as connection:
            for lane in ("a", "b", "c"):
                connection.send({"type": "response.create", **COUNT, "stream_id": lane})
            done: dict[str, list[Event]] = {"a": [], "b": [], "c": []}
            finished = 0
            for data in received(connection):
                done[data["stream_id"]].append(data)
                finished += data["type"] in TERMINAL
                if finished == 3:
                    break
        return {
            lane: output_text(
                strict([{k: v for k, v in e.items() if k != "stream_id"} for e in es])
            )
            for lane, es in done.items()
        }

    texts: list[str] = []
    lanes: dict[str, str] = {}

    async def socket_task() -> None:
        texts.append(await in_thread(one_socket))

    async def lanes_task() -> None:
        lanes.update(await in_thread(three_lanes))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(socket_task)
        nursery.start_soon(lanes_task)
    assert texts == [expected] * 3
    assert lanes == {"a": expected, "b": expected, "c": expected}
    assert server.model.statistics().peak_decoding >= 2


async def test_closing_the_socket_frees_the_batch(server: ServerHandle) -> None:
    url = server.base_url.replace("http://", "ws://") + "/v1/responses"

    def run() -> None:
        with ws_client.connect(url) as socket:
            socket.send(json.dumps({"type": "response.create", **COUNT}))
            deltas = 0
            while deltas < 3:
                deltas += json.loads(socket.recv())["type"] == "response.output_text.delta"

    await in_thread(run)
    with trio.fail_after(DEADLINE):
        await wait_until(lambda: server.model.statistics().active == 0)
        await wait_until(lambda: server.model.statistics().admitted == 0)
        await wait_until(lambda: server.responses.statistics().tasks == 0)
        await wait_until(lambda: server.responses.statistics().sockets == 0)
    stats = server.model.statistics()
    assert (stats.sequences_cancelled, stats.sequences_finished, stats.admitted) == (1, 0, 0)
    assert server.responses.statistics().sockets == 0


async def test_the_cancel_endpoint_cancels_a_socket_response(server: ServerHandle) -> None:
    found: dict[str, str] = {}

    def run() -> list[Event]:
        with sdk(server).responses.connect() as connection:
            connection.send({"type": "response.create", **COUNT})
            events: list[Event] = []
            for data in received(connection):
                events.append(data)
                if data["type"] == "response.created":
                    found["id"] = data["response"]["id"]
                if data["type"] in TERMINAL:
                    return events
        raise AssertionError("no terminal event")

    async def cancel() -> None:
        await wait_until(lambda: "id" in found and server.model.statistics().tokens_generated > 3)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
            reply = await http.post(f"/v1/responses/{found['id']}/cancel")
        assert reply.status_code == 200
        assert reply.json()["status"] == "cancelled"

    events: list[Event] = []

    async def socket() -> None:
        events.extend(await in_thread(run))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(socket)
        nursery.start_soon(cancel)
    assert strict(events)["status"] == "cancelled"


async def test_a_steer_ends_the_response_steered_and_a_successor_continues(
    server: ServerHandle,
) -> None:
    def run() -> list[Event]:
        with sdk(server).responses.connect() as connection:
            connection.send({"type": "response.create", **COUNT, "max_output_tokens": 200})
            events: list[Event] = []
            target = None
            deltas = 0
            for data in received(connection):
                events.append(data)
                if data["type"] == "response.created" and target is None:
                    target = data["response"]["id"]
                deltas += data["type"] == "response.output_text.delta"
                if deltas == 3:
                    deltas += 1
                    connection.response.steer(
                        previous_response_id=target, input="Reply with: hello"
                    )
                if data["type"] in TERMINAL and data["response"]["id"] != target:
                    return events
        raise AssertionError("no successor")

    events = await in_thread(run)
    kinds = [e["type"] for e in events]
    assert "response.steer.accepted" in kinds
    accepted = events[kinds.index("response.steer.accepted")]
    target = events[0]["response"]["id"]
    assert accepted["steer"]["previous_response_id"] == target
    steered = next(e for e in events if e["type"] == "response.incomplete")
    assert steered["response"]["incomplete_details"] == {"reason": "steered"}
    second = [i for i, kind in enumerate(kinds) if kind == "response.created"][1]
    final = strict([e for e in events[second:] if not e["type"].startswith("response.steer")])
    assert final["previous_response_id"] == target
    # It continued from what the steered response had produced, with the steering input.
    replay = [
        {"role": "user", "content": COUNT["input"]},
        *steered["response"]["output"],
        {"role": "user", "content": "Reply with: hello"},
    ]
    expected = await post(server, {**COUNT, "max_output_tokens": 200, "input": replay})
    assert output_text(final) == output_text(expected)
    with trio.fail_after(DEADLINE):
        await wait_until(lambda: server.model.statistics().active == 0)


async def test_a_steer_for_an_unknown_response_fails(server: ServerHandle) -> None:
    def run() -> Event:
        with sdk(server).responses.connect() as connection:
            connection.response.steer(previous_response_id="resp_nowhere", input="hi")
            return next(received(connection))

    failed = await in_thread(run)
    assert failed["type"] == "response.steer.failed"
    assert failed["error"]["code"] == "response_not_found"
    assert failed["steer"]["input"] == [{"role": "user", "content": "hi"}]


async def start(nursery: trio.Nursery, **changes: Any) -> ServerHandle:
    settings = dataclasses.replace(server_settings(), **changes)
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    return handle


async def test_the_upgrade_checks_the_api_key(nursery: trio.Nursery) -> None:
    server = await start(nursery, api_keys=load_api_keys(["sk-right"]))

    def run(key: str) -> str:
        try:
            with sdk(server, key).responses.connect() as connection:
                connection.send({"type": "response.create", **HELLO})
                return output_text(strict(until_terminal(connection)))
        except InvalidStatus as refused:
            return f"refused {refused.response.status_code}"

    assert await in_thread(lambda: run("sk-wrong")) == "refused 401"
    assert await in_thread(lambda: run("sk-right")) == "hello"


async def test_the_connection_limit_refuses_an_extra_socket(nursery: trio.Nursery) -> None:
    server = await start(nursery, websocket_max_connections=1)
    url = server.base_url.replace("http://", "ws://") + "/v1/responses"

    def run() -> tuple[int, dict[str, Any]]:
        with ws_client.connect(url):
            try:
                with ws_client.connect(url):
                    pass
            except InvalidStatus as refused:
                return refused.response.status_code, json.loads(refused.response.body or b"{}")
        raise AssertionError("the second socket was accepted")

    status, body = await in_thread(run)
    assert status == 429
    assert body["error"]["code"] == "websocket_connection_limit_reached"


@pytest.mark.parametrize("ending", ["lifetime", "shutdown"])
async def test_the_server_closes_with_going_away(nursery: trio.Nursery, ending: str) -> None:
    lifetime = 1.0 if ending == "lifetime" else 3600.0
    server = await start(nursery, websocket_max_seconds=lifetime)
    url = server.base_url.replace("http://", "ws://") + "/v1/responses"
    seen: list[str] = []

    def run() -> int:
        with ws_client.connect(url) as socket:
            body = COUNT if ending == "shutdown" else HELLO
            socket.send(json.dumps({"type": "response.create", **body}))
            try:
                while True:
                    seen.append(json.loads(socket.recv())["type"])
                    if ending == "shutdown" and seen.count("response.output_text.delta") == 2:
                        trio.from_thread.run_sync(server.shutdown)
            except ConnectionClosed as closed:
                return closed.rcvd.code if closed.rcvd is not None else -1
        raise AssertionError("not closed")

    assert await in_thread(run) == 1001
    # The running response ended with exactly one terminal event before the close frame.
    assert len([kind for kind in seen if kind in TERMINAL]) == 1
    if ending == "shutdown":
        assert seen[-1] == "response.failed"


async def test_a_response_running_at_the_end_of_the_lifetime_completes_first(
    nursery: trio.Nursery,
) -> None:
    """Issue 28: the lifetime closes the socket only once no response runs on it (Codex CLI
    would otherwise retry the cut turn from the start on a new connection)."""
    server = await start(nursery, websocket_max_seconds=0.2)
    url = server.base_url.replace("http://", "ws://") + "/v1/responses"
    seen: list[str] = []

    def run() -> int:
        with ws_client.connect(url) as socket:
            socket.send(json.dumps({"type": "response.create", **COUNT}))
            try:
                while True:
                    seen.append(json.loads(socket.recv())["type"])
            except ConnectionClosed as closed:
                return closed.rcvd.code if closed.rcvd is not None else -1

    assert await in_thread(run) == 1001
    assert [kind for kind in seen if kind in TERMINAL] == ["response.completed"]
    assert seen.count("response.output_text.delta") > 1
