"""Hosted tool discovery (issue 13, docs/api.md "Tool search"): ``defer_loading``, the
``tool_search`` tool, and the ``tool_search_call`` / ``tool_search_output`` items, through the
real server, the real bundled model and the openai SDK's types in strict mode.

The bundled model never calls ``tool_search`` on its own (it is not one of its documented
prompts), so the calls are forced with ``tool_choice: "required"`` (the search tool is then the
only tool offered) and a named function; what the server makes of them is what is tested.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2 as httpx
import pytest
import trio
from openai import AsyncOpenAI

from mlx_responses.server import ServerHandle
from tests.conformance import assert_stream_invariants, assert_strict_response, parse_sse

from .conftest import MODEL

DEADLINE = 60
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The name of the city."}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
DEFERRED_WEATHER = {**WEATHER, "defer_loading": True}
CRM: dict[str, Any] = {
    "type": "namespace",
    "name": "crm",
    "description": "Customer records.",
    "tools": [
        {
            "type": "function",
            "name": "get_customer",
            "description": "Look up a customer by id.",
            "parameters": {
                "type": "object",
                "properties": {"id": {"type": "string"}},
                "required": ["id"],
                "additionalProperties": False,
            },
            "strict": True,
            "defer_loading": True,
        }
    ],
}
SERVER_SEARCH = {"type": "tool_search"}
# Codex CLI's client-executed search: its own schema, the search runs in Codex.
CLIENT_SEARCH: dict[str, Any] = {
    "type": "tool_search",
    "execution": "client",
    "description": "Search the tools of the connected apps.",
    "parameters": {
        "type": "object",
        "properties": {"query": {"type": "string", "enum": ["weather"]}},
        "required": ["query"],
        "additionalProperties": False,
    },
}
MCP_LOADED: dict[str, Any] = {
    "type": "namespace",
    "name": "mcp__weather",
    "description": "Weather tools.",
    "tools": [{**DEFERRED_WEATHER}],
}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "temperature": 0, "max_output_tokens": 60, **fields}


async def post(server: ServerHandle, path: str, payload: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        return await http.post(path, json=payload)


async def stream(server: ServerHandle, payload: dict[str, Any]) -> list[tuple[str, Any]]:
    async with (
        httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http,
        http.stream("POST", "/v1/responses", json={**payload, "stream": True}) as reply,
    ):
        assert reply.status_code == 200
        return parse_sse(b"".join([chunk async for chunk in reply.aiter_bytes()]))


async def input_tokens(server: ServerHandle, payload: dict[str, Any]) -> int:
    reply = await post(server, "/v1/responses/input_tokens", payload)
    assert reply.status_code == 200, reply.text
    count: int = reply.json()["input_tokens"]
    return count


async def test_server_search_loads_a_deferred_tool_and_the_response_goes_on(
    server: ServerHandle, client: AsyncOpenAI
) -> None:
    """As OpenAI's hosted search: one response holds the search call, its output and the call
    to the tool it loaded (``required`` forces the search, then a call to a loaded tool).
    One searchable tool: which of several the tiny model picks is not a documented answer."""
    tools = [SERVER_SEARCH, DEFERRED_WEATHER]
    with trio.fail_after(DEADLINE):
        events = await stream(server, body(input=[QUESTION], tools=tools, tool_choice="required"))
        final = assert_stream_invariants(events)  # every event strict, items paired
        call, output, fc = final["output"]
        result = {"type": "function_call_output", "call_id": fc["call_id"], "output": "sunny"}
        follow_raw = await client.responses.with_raw_response.create(
            model=MODEL,
            input=[QUESTION, call, output, fc, result],  # type: ignore[list-item]
            tools=tools,  # type: ignore[arg-type]
            temperature=0,
            max_output_tokens=30,
        )
        follow = follow_raw.parse()
    assert final["status"] == "completed"
    assert call["type"] == "tool_search_call"
    assert call["execution"] == "server"
    assert call["status"] == "completed"
    assert set(call["arguments"]["paths"]) == {"get_weather"}  # forced: a searchable name
    assert output["type"] == "tool_search_output"
    assert output["call_id"] == call["call_id"]
    assert output["execution"] == "server"
    assert output["tools"] == [DEFERRED_WEATHER]  # the definition, as the request gave it
    assert fc["type"] == "function_call"
    assert fc["name"] == "get_weather"
    assert fc["namespace"] == "get_weather"  # OpenAI's shape for a deferred top-level function
    assert json.loads(fc["arguments"]).keys() == {"city"}
    added = [d["item"]["type"] for n, d in events if n == "response.output_item.added"]
    assert added == ["tool_search_call", "tool_search_output", "function_call"]
    assert not any("tool_search_call." in name for name, _ in events)  # no SDK type for them
    assert final["tools"] == tools  # echoed as sent, defer_loading included
    # Two sequences: the usage adds up both prompts; the second renders the first's output
    # with the loaded tool offered and no tool_search.
    with trio.fail_after(DEADLINE):
        first = await input_tokens(server, body(input=[QUESTION], tools=tools))
        second = await input_tokens(server, body(input=[QUESTION, call, output], tools=[WEATHER]))
    assert final["usage"]["input_tokens"] == first + second
    assert_strict_response(json.loads(follow_raw.text))
    assert follow.status in ("completed", "incomplete")


async def test_a_server_search_keeps_to_max_output_tokens(server: ServerHandle) -> None:
    tools = [SERVER_SEARCH, DEFERRED_WEATHER]
    with trio.fail_after(DEADLINE):
        reply = await post(
            server,
            "/v1/responses",
            body(input=[QUESTION], tools=tools, tool_choice="required", max_output_tokens=12),
        )
    data = reply.json()
    assert_strict_response(data)
    assert data["usage"]["output_tokens"] <= 12


async def test_deferred_tools_are_left_out_of_the_prompt_until_loaded(
    server: ServerHandle,
) -> None:
    loaded_output = {
        "type": "tool_search_output",
        "call_id": "call_1",
        "execution": "server",
        "status": "completed",
        "tools": [DEFERRED_WEATHER],
    }
    call = {
        "type": "tool_search_call",
        "call_id": "call_1",
        "execution": "server",
        "status": "completed",
        "arguments": {"paths": ["get_weather"]},
    }
    empty_output = {**loaded_output, "tools": []}
    with_search = [SERVER_SEARCH, DEFERRED_WEATHER]
    with trio.fail_after(DEADLINE):
        offered = await input_tokens(server, body(input=[QUESTION], tools=[SERVER_SEARCH, WEATHER]))
        deferred = await input_tokens(server, body(input=[QUESTION], tools=with_search))
        loaded = await input_tokens(
            server, body(input=[QUESTION, call, loaded_output], tools=with_search)
        )
        not_loaded = await input_tokens(
            server, body(input=[QUESTION, call, empty_output], tools=with_search)
        )
    assert deferred < offered  # only its name and description, in tool_search's catalog
    assert loaded > not_loaded  # the loaded definition joins the prompt's tools


async def test_client_search_ends_at_the_call_and_its_output_loads_namespace_tools(
    server: ServerHandle, client: AsyncOpenAI
) -> None:
    with trio.fail_after(DEADLINE):
        first_raw = await client.responses.with_raw_response.create(
            model=MODEL,
            input=[QUESTION],  # type: ignore[list-item]
            tools=[CLIENT_SEARCH],  # type: ignore[list-item]
            tool_choice="required",
            temperature=0,
            max_output_tokens=60,
        )
        first = first_raw.parse()
        (call,) = first.output
        assert call.type == "tool_search_call"
        # The client runs the search and answers with the tools it loaded (not in `tools`).
        found = {
            "type": "tool_search_output",
            "call_id": call.call_id,
            "execution": "client",
            "status": "completed",
            "tools": [MCP_LOADED],
        }
        replay = [QUESTION, call.model_dump(mode="json", exclude_none=True), found]
        second_raw = await client.responses.with_raw_response.create(
            model=MODEL,
            input=replay,  # type: ignore[arg-type]
            tools=[CLIENT_SEARCH],  # type: ignore[list-item]
            tool_choice={"type": "function", "name": "get_weather"},
            temperature=0,
            max_output_tokens=60,
        )
        second = second_raw.parse()
    assert_strict_response(json.loads(first_raw.text))
    assert_strict_response(json.loads(second_raw.text))
    assert first.status == "completed"
    assert call.execution == "client"
    assert call.arguments == {"query": "weather"}
    assert call.call_id
    (fc,) = second.output
    assert fc.type == "function_call"
    assert (fc.name, fc.namespace) == ("get_weather", "mcp__weather")  # Codex dispatches it
    assert json.loads(fc.arguments).keys() == {"city"}


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ([DEFERRED_WEATHER], "tools"),  # deferred, and nothing can load it
        ([SERVER_SEARCH, SERVER_SEARCH], "tools[1]"),
        ([{**WEATHER, "defer_loading": "yes"}, SERVER_SEARCH], "tools[0].defer_loading"),
        ([{"type": "tool_search", "execution": "elsewhere"}], "tools[0].execution"),
        ([{"type": "tool_search", "parameters": {"type": 7}}], "tools[0].parameters"),
        ([{"type": "tool_search", "limit": 3}], "tools[0].limit"),
    ],
)
async def test_bad_discovery_tools_name_their_field(
    server: ServerHandle, tools: list[dict[str, Any]], param: str
) -> None:
    with trio.fail_after(DEADLINE):
        reply = await post(server, "/v1/responses", body(input="hi", tools=tools))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "tool_search_output", "call_id": "c", "tools": "x"}, "input[1].tools"),
        (
            {"type": "tool_search_output", "call_id": "c", "tools": [{"type": "web_search"}]},
            "input[1].tools",
        ),
        ({"type": "tool_search_call", "call_id": "c", "arguments": "[]"}, "input[1].arguments"),
        (
            {"type": "tool_search_call", "arguments": {}, "execution": "x"},
            "input[1].execution",
        ),
    ],
)
async def test_bad_search_items_name_their_field(
    server: ServerHandle, item: dict[str, Any], param: str
) -> None:
    with trio.fail_after(DEADLINE):
        reply = await post(
            server, "/v1/responses", body(input=[QUESTION, item], tools=[SERVER_SEARCH])
        )
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_server_search_matches_names_namespaces_and_words() -> None:
    from mlx_responses.protocol.tools.parse import parse_tools
    from mlx_responses.protocol.tools.search import search

    catalog = [
        t for t in parse_tools([DEFERRED_WEATHER, CRM, WEATHER | {"name": "x"}]) if t.deferred
    ]
    names = lambda arguments: [t["name"] for t in search(catalog, json.dumps(arguments))]  # noqa: E731
    assert names({"paths": ["get_weather"]}) == ["get_weather"]
    assert names({"paths": ["crm"]}) == ["crm"]  # the namespace, with its deferred functions
    assert search(catalog, '{"paths": ["crm"]}')[0]["tools"][0]["name"] == "get_customer"
    assert names({"paths": ["crm.get_customer"]}) == ["crm"]
    assert names({"query": "customer"}) == ["crm"]
    assert names({"query": "weather city"}) == ["get_weather"]
    assert names({"paths": ["crm", "get_weather", "crm"]}) == ["get_weather", "crm"]
    assert names({"query": "stock prices"}) == []
    assert search(catalog, "not json") == []


def _agents_tool_search_scenario(base_url: str) -> dict[str, Any]:
    """The OpenAI Agents SDK's hosted tool search, on its own thread under asyncio."""
    import asyncio

    from agents import (
        Agent,
        FunctionTool,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        ToolSearchTool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    calls: list[Any] = []

    async def invoke(_ctx: Any, arguments: str) -> str:
        calls.append(json.loads(arguments))
        return '{"city": "Paris", "temperature": 18, "condition": "sunny"}'

    weather = FunctionTool(
        name="get_weather",
        description=WEATHER["description"],
        params_json_schema=WEATHER["parameters"],
        on_invoke_tool=invoke,
        defer_loading=True,
    )

    async def scenario() -> dict[str, Any]:
        async with AsyncOpenAI(base_url=f"{base_url}/v1", api_key="sk-local", max_retries=0) as c:
            agent = Agent(
                name="weather",
                model=OpenAIResponsesModel(model=MODEL, openai_client=c),
                tools=[ToolSearchTool(), weather],
                # Forced: the bundled model does not search unforced. Its answer after the
                # tool's output is not a documented prompt: the run stops at the tool's result.
                model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=80),
                tool_use_behavior="stop_on_first_tool",
            )
            result = await Runner.run(agent, "What is the weather in Paris?", max_turns=3)
            return {
                "calls": calls,
                "items": [item.type for item in result.new_items],
                "final": result.final_output,
                "raw": [[o.type for o in response.output] for response in result.raw_responses],
            }

    return asyncio.run(scenario())


async def test_the_agents_sdk_runs_a_tool_found_by_hosted_search(server: ServerHandle) -> None:
    with trio.fail_after(DEADLINE * 2):
        seen = await trio.to_thread.run_sync(_agents_tool_search_scenario, server.base_url)
    assert seen["raw"][0] == ["tool_search_call", "tool_search_output", "function_call"]
    assert len(seen["calls"]) == 1  # the SDK dispatched the loaded tool
    assert seen["calls"][0].keys() == {"city"}
    assert "sunny" in seen["final"]


async def test_a_search_in_the_history_loads_its_tools_as_one_in_the_input_does(
    server: ServerHandle,
) -> None:
    """A ``tool_search_output`` replayed from a ``previous_response_id`` chain (or a
    conversation) loads its deferred tools: the prompt is the one of the same items sent as
    input."""
    call = {
        "type": "tool_search_call",
        "call_id": "call_1",
        "execution": "server",
        "status": "completed",
        "arguments": {"paths": ["get_weather"]},
    }
    found = {
        "type": "tool_search_output",
        "call_id": "call_1",
        "execution": "server",
        "status": "completed",
        "tools": [DEFERRED_WEATHER],
    }
    follow_up = {"role": "user", "content": "And in Rome?"}
    with_search = [SERVER_SEARCH, DEFERRED_WEATHER]
    with trio.fail_after(DEADLINE):
        made = await post(
            server,
            "/v1/responses",
            body(input=[QUESTION, call, found], tools=with_search, max_output_tokens=8),
        )
        assert made.status_code == 200, made.text
        first = made.json()
        from_history = await input_tokens(
            server, body(previous_response_id=first["id"], input=[follow_up], tools=with_search)
        )
        replayed = [QUESTION, call, found, *first["output"], follow_up]
        as_input = await input_tokens(server, body(input=replayed, tools=with_search))
        unloaded = await input_tokens(
            server, body(input=[QUESTION, *first["output"], follow_up], tools=with_search)
        )
        chained = await post(
            server,
            "/v1/responses",
            body(
                previous_response_id=first["id"],
                input=[follow_up],
                tools=with_search,
                tool_choice="required",
            ),
        )
    assert from_history == as_input
    assert from_history > unloaded
    assert chained.status_code == 200, chained.text
    answer = chained.json()
    assert_strict_response(answer)
    assert answer["usage"]["input_tokens"] == from_history
    # Forced to call a tool, the model may now call the loaded one (before, only tool_search
    # was offered), and its call carries the namespace the client routes by.
    (call_out,) = answer["output"]
    assert (call_out["type"], call_out["name"], call_out["namespace"]) == (
        "function_call",
        "get_weather",
        "get_weather",
    )
