"""Hosted tools end to end: the real server runs web searches (a local full-text index) and
calls real MCP servers (the ``mcp`` package's own, ``tests/mcp_servers.py``) inside the
response, with the bundled model forced to call them (``tool_choice``); the openai SDK reads
every event. The documented prompts of the trained fixture (a model that decides to search
and cites) are in ``test_api_hosted_fixture.py``."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import trio
from openai import AsyncOpenAI

from mlx_responses.hosted.egress import EgressPolicy
from mlx_responses.hosted.mcp_client import McpServer, McpSettings, call_tool
from mlx_responses.hosted.web_search import WebSearchSettings
from mlx_responses.server import ServerHandle, serve

from .conformance import assert_stream_invariants, parse_sse
from .conftest import MODEL, START_DEADLINE, server_settings, wait_until
from .mcp_servers import start_mcp_server

DEADLINE = 60
INDEX = Path(__file__).parent / "fixtures" / "web_index"
SEARCH_EVENTS = [
    "response.output_item.added",
    "response.web_search_call.in_progress",
    "response.web_search_call.searching",
    "response.web_search_call.completed",
    "response.output_item.done",
]


def hosted_settings(**changes: Any) -> Any:
    settings = dataclasses.replace(
        server_settings(),
        web_search=WebSearchSettings("local", INDEX, None, 10.0),
        mcp=McpSettings(("127.0.0.1",), True, 10.0),
    )
    return dataclasses.replace(settings, **changes)


@pytest.fixture
async def hosted(nursery: trio.Nursery) -> ServerHandle:
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, hosted_settings())
    return handle


@pytest.fixture
async def sdk(hosted: ServerHandle) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(
        base_url=f"{hosted.base_url}/v1", api_key="sk-local", max_retries=0, timeout=60
    ) as c:
        yield c


def _types(events: list[Any]) -> list[str]:
    return [e.type for e in events]


def _in_order(seen: list[str], wanted: list[str]) -> bool:
    at = 0
    for name in seen:
        if at < len(wanted) and name == wanted[at]:
            at += 1
    return at == len(wanted)


async def test_forced_web_search_streams_its_events_and_returns_sources(
    sdk: AsyncOpenAI, hosted: ServerHandle
) -> None:
    with trio.fail_after(DEADLINE):
        stream = await sdk.responses.create(
            model=MODEL,
            input="Search the web for Paris.",
            tools=[{"type": "web_search"}],
            tool_choice={"type": "web_search"},
            include=["web_search_call.action.sources"],
            max_output_tokens=80,
            temperature=0,
            stream=True,
        )
        events = [event async for event in stream]
    seen = _types(events)
    assert _in_order(seen, [*SEARCH_EVENTS, "response.completed"]), (seen, events[-1])
    final = events[-1].response
    assert final.status == "completed"
    call = final.output[0]
    assert call.type == "web_search_call"
    assert call.status == "completed"
    assert call.action.type == "search"
    assert isinstance(call.action.query, str)
    assert call.action.query
    assert call.action.sources is not None  # asked for by include
    # The stored object is the streamed one.
    stored = await sdk.responses.retrieve(final.id)
    assert stored.output[0].id == call.id
    assert hosted.model.statistics().active == 0


async def test_sources_are_left_out_unless_included(sdk: AsyncOpenAI) -> None:
    with trio.fail_after(DEADLINE):
        response = await sdk.responses.create(
            model=MODEL,
            input="Search the web for Paris.",
            tools=[{"type": "web_search"}],
            tool_choice={"type": "web_search"},
            max_output_tokens=80,
            temperature=0,
        )
    call = response.output[0]
    assert call.type == "web_search_call"
    assert call.action.sources is None


@pytest.mark.parametrize("transport", ["streamable-http", "sse"])
async def test_forced_mcp_call_lists_calls_and_answers(sdk: AsyncOpenAI, transport: str) -> None:
    async with start_mcp_server(transport) as mcp:
        tool = {
            "type": "mcp",
            "server_label": "weather",
            "server_url": mcp.url,
            "require_approval": "never",
        }
        with trio.fail_after(DEADLINE):
            stream = await sdk.responses.create(
                model=MODEL,
                input="What is the weather in Paris?",
                tools=[tool],
                tool_choice={"type": "mcp", "server_label": "weather", "name": "get_weather"},
                max_output_tokens=80,
                temperature=0,
                stream=True,
            )
            events = [event async for event in stream]
    seen = _types(events)
    assert _in_order(
        seen,
        [
            "response.mcp_list_tools.in_progress",
            "response.mcp_list_tools.completed",
            "response.mcp_call.in_progress",
            "response.mcp_call_arguments.done",
            "response.mcp_call.completed",
            "response.completed",
        ],
    ), seen
    final = events[-1].response
    listing, call = final.output[0], final.output[1]
    assert listing.type == "mcp_list_tools"
    assert {t.name for t in listing.tools} >= {"get_weather", "add"}
    assert call.type == "mcp_call"
    assert (call.name, call.server_label, call.output) == ("get_weather", "weather", "sunny, 18C")
    assert call.error is None


async def test_credentials_reach_the_server_and_are_never_echoed_or_stored(
    sdk: AsyncOpenAI,
) -> None:
    """``authorization`` and ``headers`` are sent to the MCP server (it answers 401 without
    the token) and, as OpenAI does not persist them, neither the Response nor its stored copy
    holds them."""
    async with start_mcp_server("streamable-http", token="s3cret") as mcp:
        tool = {
            "type": "mcp",
            "server_label": "weather",
            "server_url": mcp.url,
            "require_approval": "never",
            "authorization": "s3cret",
            "headers": {"X-Trace": "t-1"},
        }
        with trio.fail_after(DEADLINE):
            response = await sdk.responses.create(
                model=MODEL,
                input="What is the weather in Paris?",
                tools=[tool],
                tool_choice={"type": "mcp", "server_label": "weather", "name": "get_weather"},
                max_output_tokens=80,
                temperature=0,
            )
            stored = await sdk.responses.retrieve(response.id)
    call = response.output[1]
    assert call.type == "mcp_call", call
    assert call.output == "sunny, 18C", call
    for seen in (response, stored):
        raw = seen.model_dump_json()
        assert "s3cret" not in raw
        assert "t-1" not in raw
        echoed = seen.tools[0]
        assert echoed.type == "mcp"
        assert echoed.server_url == mcp.url


async def test_chain_reuses_the_listing_and_approvals_round_trip(sdk: AsyncOpenAI) -> None:
    async with start_mcp_server("streamable-http") as mcp:
        tool = {"type": "mcp", "server_label": "weather", "server_url": mcp.url}
        with trio.fail_after(DEADLINE):
            first = await sdk.responses.create(
                model=MODEL,
                input="What is the weather in Paris?",
                tools=[tool],  # require_approval defaults to "always", as OpenAI's
                tool_choice={"type": "mcp", "server_label": "weather", "name": "get_weather"},
                max_output_tokens=80,
                temperature=0,
            )
            asked = first.output[-1]
            assert [item.type for item in first.output] == [
                "mcp_list_tools",
                "mcp_approval_request",
            ]
            assert asked.name == "get_weather"
            second = await sdk.responses.create(
                model=MODEL,
                previous_response_id=first.id,
                input=[
                    {
                        "type": "mcp_approval_response",
                        "approval_request_id": asked.id,
                        "approve": True,
                    }
                ],
                tools=[tool],
                max_output_tokens=80,
                temperature=0,
            )
    # The chain's listing is reused: no second mcp_list_tools; the approved call ran first.
    assert second.output[0].type == "mcp_call"
    call = second.output[0]
    assert call.approval_request_id == asked.id
    assert call.output == "sunny, 18C"
    assert all(item.type != "mcp_list_tools" for item in second.output)


async def test_a_denied_call_is_not_run(sdk: AsyncOpenAI) -> None:
    async with start_mcp_server("streamable-http") as mcp:
        tool = {"type": "mcp", "server_label": "weather", "server_url": mcp.url}
        with trio.fail_after(DEADLINE):
            first = await sdk.responses.create(
                model=MODEL,
                input="What is the weather in Paris?",
                tools=[tool],
                tool_choice={"type": "mcp", "server_label": "weather", "name": "get_weather"},
                max_output_tokens=80,
                temperature=0,
            )
            second = await sdk.responses.create(
                model=MODEL,
                previous_response_id=first.id,
                input=[
                    {
                        "type": "mcp_approval_response",
                        "approval_request_id": first.output[-1].id,
                        "approve": False,
                    }
                ],
                tools=[tool],
                max_output_tokens=80,
                temperature=0,
            )
    assert second.status in ("completed", "incomplete")
    assert all(item.type != "mcp_call" for item in second.output)


async def _refused(
    server: ServerHandle, body: dict[str, Any], status: int, param: str, words: str
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        with trio.fail_after(DEADLINE):
            before = server.store.statistics().entries
            reply = await http.post("/v1/responses", json={"model": MODEL, **body})
            assert reply.status_code == status, reply.text
            error = reply.json()["error"]
            assert error["param"] == param, error
            assert words in error["message"], error
            assert server.store.statistics().entries == before
            assert server.model.statistics().active == 0
            ok = await http.post(
                "/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2}
            )
            assert ok.status_code == 200


async def test_hosted_tools_are_off_unless_the_operator_enables_them(server: ServerHandle) -> None:
    search = {"input": "hi", "tools": [{"type": "web_search"}]}
    await _refused(server, search, 400, "tools[0].type", "--web-search")
    mcp = {"type": "mcp", "server_label": "x", "server_url": "http://127.0.0.1:9/mcp"}
    await _refused(
        server, {"input": "hi", "tools": [mcp]}, 400, "tools[0].type", "--mcp-allow-hosts"
    )


async def test_refusals_name_the_field_and_store_nothing(hosted: ServerHandle) -> None:
    async with start_mcp_server("streamable-http") as mcp:
        tool = {"type": "mcp", "server_label": "weather", "server_url": mcp.url}
        connector = {**tool, "connector_id": "connector_gmail"}
        await _refused(
            hosted, {"input": "hi", "tools": [connector]}, 400, "tools[0].connector_id", "connector"
        )
        only_add = {**tool, "allowed_tools": ["add"]}
        choice = {"type": "mcp", "server_label": "weather", "name": "get_weather"}
        body = {"input": "hi", "tools": [only_add], "tool_choice": choice}
        await _refused(hosted, body, 400, "tool_choice.name", "get_weather")
        location = {"type": "web_search", "user_location": {"type": "approximate", "city": "Paris"}}
        body = {"input": "hi", "tools": [location]}
        await _refused(hosted, body, 400, "tools[0].user_location.city", "localise")
        stranger = {**tool, "server_url": "http://127.0.0.1:9/mcp"}  # nobody listens there
        await _refused(hosted, {"input": "hi", "tools": [stranger]}, 424, "tools[0]", "weather")


async def test_the_host_allow_list_refuses_other_hosts(nursery: trio.Nursery) -> None:
    settings = hosted_settings(mcp=McpSettings(("mcp.example.com",), False, 10.0))
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, settings)
    async with start_mcp_server("streamable-http") as mcp:
        tool = {"type": "mcp", "server_label": "weather", "server_url": mcp.url}
        await _refused(
            server,
            {"input": "hi", "tools": [tool]},
            400,
            "tools[0].server_url",
            "--mcp-allow-hosts",
        )


async def _seen(url: str) -> dict[str, Any]:
    outcome = await call_tool(
        McpServer("probe", url, {}), "calls_seen", {}, EgressPolicy(("127.0.0.1",), True), 10
    )
    assert outcome.output is not None, outcome.error
    record: dict[str, Any] = json.loads(outcome.output)
    return record


async def _until_seen(url: str, key: str, count: int = 1) -> dict[str, Any]:
    """Until the MCP server recorded ``hang`` under ``key`` ``count`` times (it runs in
    another process); what it saw then."""
    while (seen := await _seen(url))[key].count("hang") < count:  # noqa: ASYNC110
        await trio.sleep(0.05)
    return seen


def _hang_body(url: str) -> dict[str, Any]:
    """A create forcing a call of the MCP server's ``hang`` tool, which never answers."""
    tool = {"type": "mcp", "server_label": "tools", "server_url": url, "require_approval": "never"}
    return {
        "input": "Wait.",
        "tools": [tool],
        "tool_choice": {"type": "mcp", "server_label": "tools", "name": "hang"},
        "max_output_tokens": 80,
    }


async def _stream_until(
    server: ServerHandle,
    body: dict[str, Any],
    event: str,
    then: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Stream a create and hang up after ``event`` (once ``then`` returns)."""
    async with (
        httpx.AsyncClient(base_url=server.base_url, timeout=30) as http,
        http.stream(
            "POST", "/v1/responses", json={"model": MODEL, "stream": True, **body}
        ) as reply,
    ):
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if line == f"event: {event}":
                if then is not None:
                    await then()
                return
    raise AssertionError(f"the stream ended before {event}")


async def test_a_hang_up_during_an_mcp_call_cancels_its_outbound_request(
    hosted: ServerHandle,
) -> None:
    async with start_mcp_server("streamable-http") as mcp:
        body = _hang_body(mcp.url)

        async def called() -> None:  # the MCP server is running the call
            await _until_seen(mcp.url, "started")

        with trio.fail_after(DEADLINE):
            await _stream_until(hosted, body, "response.mcp_call_arguments.done", called)
            await _until_seen(mcp.url, "cancelled")
            await wait_until(lambda: hosted.responses.statistics().running == 0)
    assert hosted.model.statistics().active == 0


class FakeSearxng:
    """A SearXNG stand-in that misbehaves as told: answers 500, answers garbage, or never
    answers (and notes when the server's connection went away)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.connected = trio.Event()  # the server's search reached it
        self.closed = trio.Event()
        self.port = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        self.connected.set()
        if self.mode == "hang":
            while await stream.receive_some(65536):
                pass
            self.closed.set()
            return
        status, body = ("500 Internal Server Error", b"oops")
        if self.mode == "garbage":
            status, body = ("200 OK", b"{not json")
        head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        await stream.send_all(head.encode() + body)
        await stream.aclose()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self.handle, listeners)


async def _searxng_server(
    nursery: trio.Nursery, mode: str, timeout_s: float
) -> tuple[ServerHandle, FakeSearxng]:
    fake = FakeSearxng(mode)
    await nursery.start(fake.run)
    search = WebSearchSettings("searxng", None, f"http://127.0.0.1:{fake.port}", timeout_s)
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, hosted_settings(web_search=search))
    return server, fake


FORCED_SEARCH = {
    "input": "Search the web for Paris.",
    "tools": [{"type": "web_search"}],
    "tool_choice": {"type": "web_search"},
    "max_output_tokens": 80,
    "temperature": 0,
}


@pytest.mark.parametrize("mode", ["500", "garbage", "hang"])
async def test_a_failing_search_backend_fails_the_call_not_the_response(
    nursery: trio.Nursery, mode: str
) -> None:
    server, _ = await _searxng_server(nursery, mode, 1.0)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        with trio.fail_after(DEADLINE):
            body = {"model": MODEL, "stream": True, **FORCED_SEARCH}
            reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    # Every event validates strictly and pairs up, the failed call's included.
    response = assert_stream_invariants(parse_sse(reply.content))
    assert response["status"] == "completed"
    call = response["output"][0]
    assert (call["type"], call["status"]) == ("web_search_call", "failed")
    assert response["output"][-1]["type"] == "message"  # the model went on


async def test_a_hang_up_during_a_search_cancels_its_outbound_request(
    nursery: trio.Nursery,
) -> None:
    server, fake = await _searxng_server(nursery, "hang", 30.0)
    with trio.fail_after(DEADLINE):
        searching = "response.web_search_call.searching"
        await _stream_until(server, FORCED_SEARCH, searching, fake.connected.wait)
        await fake.closed.wait()
        await wait_until(lambda: server.responses.statistics().running == 0)
    assert server.model.statistics().active == 0


@pytest.mark.parametrize("approval", ["never", "always"])
async def test_mcp_streams_validate_strictly(hosted: ServerHandle, approval: str) -> None:
    async with start_mcp_server("streamable-http") as mcp:
        tool = {
            "type": "mcp",
            "server_label": "weather",
            "server_url": mcp.url,
            "require_approval": approval,
        }
        body = {
            "model": MODEL,
            "input": "What is the weather in Paris?",
            "tools": [tool],
            "tool_choice": {"type": "mcp", "server_label": "weather", "name": "get_weather"},
            "max_output_tokens": 80,
            "stream": True,
        }
        async with httpx.AsyncClient(base_url=hosted.base_url, timeout=30) as http:
            with trio.fail_after(DEADLINE):
                reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    final = assert_stream_invariants(parse_sse(reply.content))
    kinds = [item["type"] for item in final["output"]]
    wanted = "mcp_call" if approval == "never" else "mcp_approval_request"
    assert kinds[:2] == ["mcp_list_tools", wanted], kinds


async def test_cancelling_a_background_job_during_an_mcp_call_cancels_the_call(
    hosted: ServerHandle,
) -> None:
    async with (
        start_mcp_server("streamable-http") as mcp,
        httpx.AsyncClient(base_url=hosted.base_url, timeout=30) as http,
    ):
        body = {"model": MODEL, "background": True, **_hang_body(mcp.url)}
        with trio.fail_after(DEADLINE):
            job = (await http.post("/v1/responses", json=body)).json()
            await _until_seen(mcp.url, "started")
            cancelled = await http.post(f"/v1/responses/{job['id']}/cancel")
            assert cancelled.status_code == 200, cancelled.text
            await _until_seen(mcp.url, "cancelled")
            final = (await http.get(f"/v1/responses/{job['id']}")).json()
    assert final["status"] == "cancelled"
    call = next(item for item in final["output"] if item["type"] == "mcp_call")
    assert call["status"] == "incomplete"  # closed as cut short, never run to its end
    assert hosted.model.statistics().active == 0


async def test_shutdown_during_an_mcp_call_cancels_the_call(nursery: trio.Nursery) -> None:
    """A shutdown while a background job and a streamed response wait on MCP calls cancels
    both calls; the stream ends ``response.failed`` as any response the shutdown cuts short."""
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, hosted_settings(graceful_timeout=1))
    ended: list[dict[str, Any]] = []

    async def stream(http: httpx.AsyncClient, url: str) -> None:
        body = {"model": MODEL, "stream": True, **_hang_body(url)}
        try:
            async with http.stream("POST", "/v1/responses", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        ended.append(json.loads(line[6:]))
        except httpx.RemoteProtocolError:
            ended.append({"type": "cut"})

    async with (
        start_mcp_server("streamable-http") as mcp,
        httpx.AsyncClient(base_url=server.base_url, timeout=30) as http,
    ):
        body = {"model": MODEL, "background": True, **_hang_body(mcp.url)}
        with trio.fail_after(DEADLINE):
            await http.post("/v1/responses", json=body)
            async with trio.open_nursery() as streams:
                streams.start_soon(stream, http, mcp.url)
                await _until_seen(mcp.url, "started", count=2)
                server.shutdown()
            seen = await _until_seen(mcp.url, "cancelled", count=2)
    assert seen["cancelled"] == ["hang", "hang"]
    last = ended[-1]
    assert last["type"] == "response.failed", [e["type"] for e in ended]
    assert last["response"]["error"]["message"] == "The server is shutting down."
