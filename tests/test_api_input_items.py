"""Every input item type a client replays, rendered as the original turn was."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx2 as httpx
import pytest
import trio

from mlx_responses.engine.bundled_model import load_bundled_prompts
from mlx_responses.server import ServerHandle, serve

from .conftest import MODEL, START_DEADLINE, server_settings

DEADLINE = 60


def documented(name: str) -> Any:
    return next(p for p in load_bundled_prompts() if p.name == name)


# The documented get_weather tool, in the Responses API's flat function-tool form.
WEATHER_TOOL = {"type": "function", **documented("tool_result").tools[0]["function"]}


async def post(http: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await http.post(
        "/v1/responses", json={"model": MODEL, "temperature": 0, "max_output_tokens": 60, **body}
    )


async def counted(http: httpx.AsyncClient, **body: Any) -> int:
    reply = await http.post("/v1/responses/input_tokens", json={"model": MODEL, **body})
    assert reply.status_code == 200, reply.text
    return int(reply.json()["input_tokens"])


async def test_function_call_round_trip_renders_the_tool_result_turn(server: ServerHandle) -> None:
    prompt = documented("tool_result")
    items = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": '{"city": "Paris", "temperature": 18, "condition": "sunny"}',
        },
    ]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            reply = await post(http, input=items, tools=[WEATHER_TOOL])
    assert reply.status_code == 200, reply.text
    assert reply.json()["output"][-1]["content"][0]["text"] == prompt.expected


async def test_previous_output_replayed_as_input_renders_the_same(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            first = (await post(http, input="Reply with: hello")).json()
            replayed = [
                {"role": "user", "content": "Reply with: hello"},
                *first["output"],
                {"role": "user", "content": "Reply with: goodbye"},
            ]
            chained = {"previous_response_id": first["id"], "input": "Reply with: goodbye"}
            by_replay = await counted(http, input=replayed)
            by_chain = await counted(http, **chained)
            answer = (await post(http, input=replayed)).json()
    assert by_replay == by_chain
    # The documented multi-turn prompt: the replayed turn renders exactly as trained.
    assert answer["output"][0]["content"][0]["text"] == "goodbye"


async def test_system_and_developer_messages_merge_into_one_system_message(
    server: ServerHandle,
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            one = await counted(
                http,
                input=[
                    {"role": "system", "content": "A.\n\nB."},
                    {"role": "user", "content": "hi"},
                ],
            )
            split = await counted(
                http,
                instructions="A.",
                input=[{"role": "developer", "content": "B."}, {"role": "user", "content": "hi"}],
            )
            developer_only = await post(
                http,
                input=[
                    {"role": "developer", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "Reply with: hello"},
                ],
            )
    assert one == split
    assert developer_only.status_code == 200
    assert developer_only.json()["output"][0]["content"][0]["text"] == "hello"


async def test_reasoning_items_are_accepted_in_every_shape_codex_sends(
    server: ServerHandle,
) -> None:
    # (content: null with a sealed blob: tests/test_api_client_surface.py)
    shapes = [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "x"}]},
    ]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            for shape in shapes:
                items = [
                    {"role": "user", "content": "Reply with: hello"},
                    {"id": "rs_1", **shape},
                    {"role": "assistant", "content": "hello"},
                    {"role": "user", "content": "Reply with: goodbye"},
                ]
                reply = await post(http, input=items)
                assert reply.status_code == 200, reply.text


@pytest.mark.parametrize(
    ("part", "param"),
    [
        (
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
            "input[0].content[0].type",
        ),
    ],
)
async def test_media_parts_are_refused_for_a_text_only_model(
    server: ServerHandle, part: dict[str, Any], param: str
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            reply = await post(http, input=[{"role": "user", "content": [part]}])
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == param
    assert "text-only" in error["message"]
    assert server.store.statistics().entries == 0


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ([{"type": "web_search"}], "tools[0].type"),
        (
            [WEATHER_TOOL, {"type": "code_interpreter", "container": {"type": "auto"}}],
            "tools[1].type",
        ),
        ([{"type": "function", "name": "bad name!"}], "tools[0].name"),
        ([WEATHER_TOOL, WEATHER_TOOL], "tools[1].name"),
    ],
)
async def test_bad_tools_are_400_naming_the_tool(
    server: ServerHandle, tools: list[Any], param: str
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            reply = await post(http, input="hi", tools=tools)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == param


async def test_tool_choice_forms_are_echoed(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            flat = await post(
                http,
                input="Reply with: hello",
                tools=[WEATHER_TOOL],
                tool_choice="none",
            )
            unknown = await post(
                http,
                input="hi",
                tools=[WEATHER_TOOL],
                tool_choice={"type": "function", "name": "nope"},
            )
    assert flat.status_code == 200
    assert flat.json()["tool_choice"] == "none"
    assert flat.json()["tools"][0]["name"] == "get_weather"
    assert unknown.status_code == 400
    assert unknown.json()["error"]["param"] == "tool_choice.name"


async def test_unsupported_tools_drop_ignores_hosted_tools(nursery: trio.Nursery) -> None:
    settings = dataclasses.replace(server_settings(), drop_unsupported_tools=True)
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, settings)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            reply = await post(
                http,
                input="Reply with: hello",
                tools=[{"type": "web_search"}, WEATHER_TOOL, {"type": "local_shell"}],
            )
    assert reply.status_code == 200, reply.text
    assert [tool["name"] for tool in reply.json()["tools"]] == ["get_weather"]


async def test_namespace_tools_are_echoed_as_sent(server: ServerHandle) -> None:
    namespace = {"type": "namespace", "name": "weather", "description": "", "tools": [WEATHER_TOOL]}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            reply = await post(http, input="Reply with: hello", tools=[namespace])
    assert reply.status_code == 200, reply.text
    (echoed,) = reply.json()["tools"]
    assert echoed["type"] == "namespace"
    assert [tool["name"] for tool in echoed["tools"]] == ["get_weather"]
