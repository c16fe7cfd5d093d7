"""hosted/mcp_client.py against real MCP servers (the ``mcp`` package's own ``MCPServer`` in a
subprocess, tests/mcp_servers.py), over streamable HTTP and SSE, under Trio: listing, calls,
the tool's own failure, bearer tokens, a cancel that reaches the server, a server that is not
there, and bounded waits. What the server saw is read back from it (``calls_seen``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from mlx_responses.hosted import mcp_client
from mlx_responses.hosted.egress import EgressPolicy
from mlx_responses.hosted.mcp_client import McpServer, McpUnavailable, call_tool, list_tools

from .mcp_servers import RunningServer, Transport, free_port, start_mcp_server

DEADLINE = 60  # the server's start (a Python process importing the SDK) included
LOCAL = EgressPolicy(("127.0.0.1",), allow_private=True)
TRANSPORTS: list[Transport] = ["streamable-http", "sse"]


def at(running: RunningServer, token: str | None = None) -> McpServer:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return McpServer("local", running.url, headers)


class Seen:
    """Reads what the server saw, through its ``calls_seen`` tool; counts its own reads (each
    one a session of its own)."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.reads = 0

    async def read(self) -> dict[str, Any]:
        self.reads += 1
        outcome = await call_tool(self.server, "calls_seen", {}, LOCAL, 10)
        assert outcome.output is not None, outcome.error
        record: dict[str, Any] = json.loads(outcome.output)
        return record

    async def until(self, key: str, value: float) -> dict[str, Any]:
        while True:
            record = await self.read()
            if value in record[key]:
                return record
            await trio.sleep(0.05)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_list_tools_gives_each_tool_with_its_schema_and_annotations(
    transport: Transport,
) -> None:
    with trio.fail_after(DEADLINE):
        async with start_mcp_server(transport) as running:
            tools = {tool.name: tool for tool in await list_tools(at(running), LOCAL, 10)}
    assert {"get_weather", "add", "slow", "fail"} <= set(tools)
    weather = tools["get_weather"]
    assert weather.annotations == {"readOnlyHint": True}
    assert weather.description == "The weather in a city."
    assert weather.input_schema["properties"]["city"]["type"] == "string"
    assert weather.input_schema["required"] == ["city"]
    assert set(tools["add"].input_schema["properties"]) == {"a", "b"}
    assert tools["add"].annotations is None


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_call_tool_returns_the_text_and_the_tools_own_failure(transport: Transport) -> None:
    with trio.fail_after(DEADLINE):
        async with start_mcp_server(transport) as running:
            server = at(running)
            weather = await call_tool(server, "get_weather", {"city": "Paris"}, LOCAL, 10)
            total = await call_tool(server, "add", {"a": 2, "b": 3}, LOCAL, 10)
            failed = await call_tool(server, "fail", {}, LOCAL, 10)
    assert (weather.output, weather.error) == ("sunny, 18C", None)
    assert (total.output, total.error) == ("5", None)
    assert failed.output is None
    assert failed.error is not None
    assert failed.error["type"] == "mcp_tool_execution_error"
    assert failed.error["content"][0]["type"] == "text"
    assert "fail" in failed.error["content"][0]["text"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_token_server_answers_with_the_header_and_401s_without(
    transport: Transport,
) -> None:
    with trio.fail_after(DEADLINE):
        async with start_mcp_server(transport, token="s3cret") as running:
            good = await call_tool(at(running, "s3cret"), "get_weather", {"city": "x"}, LOCAL, 10)
            with pytest.raises(McpUnavailable, match="HTTP 401") as raised:
                await list_tools(at(running), LOCAL, 10)
            bad = await call_tool(at(running, "wrong"), "get_weather", {"city": "x"}, LOCAL, 10)
    assert good.output == "sunny, 18C"
    assert raised.value.error["type"] == "http_error"
    assert raised.value.error["code"] == 401
    assert bad.error is not None
    assert (bad.error["type"], bad.error["code"]) == ("http_error", 401)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_cancel_during_a_call_returns_at_once_and_the_server_sees_it_cancelled(
    transport: Transport,
) -> None:
    outcomes: list[object] = []
    with trio.fail_after(DEADLINE):
        async with start_mcp_server(transport) as running:
            server = at(running)
            seen = Seen(server)
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:

                    async def slow_call() -> None:
                        outcomes.append(
                            await call_tool(server, "slow", {"seconds": 600}, LOCAL, 30)
                        )

                    nursery.start_soon(slow_call)
                    await seen.until("started", 600)
                    scope.cancel()
            # The whole call, cancel included, took a moment of the 600 s the tool sleeps.
            record = await seen.until("cancelled", 600)
    assert scope.cancelled_caught
    assert outcomes == []
    assert record["finished"] == []


async def test_a_cancel_closes_a_handshake_era_session_with_its_delete(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mcp_client, "CONNECT_MODE", "legacy")
    with trio.fail_after(DEADLINE):
        async with start_mcp_server("streamable-http") as running:
            server = at(running)
            seen = Seen(server)
            before = (await seen.read())["deletes"]
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call_tool, server, "slow", {"seconds": 601}, LOCAL, 30)
                    await seen.until("started", 601)
                    scope.cancel()
            record = await seen.until("cancelled", 601)
    # Each read is a session closed with a DELETE after it answered, so the last read counts
    # every read but itself; the one DELETE more is the cancelled call's.
    assert scope.cancelled_caught
    assert record["deletes"] == before + (seen.reads - 1) + 1
    assert record["finished"] == []


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_call_longer_than_the_timeout_fails_in_time_and_is_cancelled_there(
    transport: Transport,
) -> None:
    with trio.fail_after(DEADLINE):
        async with start_mcp_server(transport) as running:
            server = at(running)
            outcome = await call_tool(server, "slow", {"seconds": 602}, LOCAL, 1)
            record = await Seen(server).until("cancelled", 602)
    assert outcome.output is None
    assert outcome.error is not None
    assert (outcome.error["type"], outcome.error["code"]) == ("http_error", 504)
    assert "within 1 s" in outcome.error["message"]
    assert record["finished"] == []


@pytest.mark.parametrize("path", ["/mcp", "/sse"])
async def test_a_server_that_is_not_listening_is_unavailable_at_once(path: str) -> None:
    server = McpServer("gone", f"http://127.0.0.1:{free_port()}{path}", {})
    with trio.fail_after(10):
        with pytest.raises(McpUnavailable, match="could not connect") as raised:
            await list_tools(server, LOCAL, 30)
        outcome = await call_tool(server, "get_weather", {"city": "x"}, LOCAL, 30)
    assert raised.value.error["code"] == 502
    assert outcome.error == raised.value.error
