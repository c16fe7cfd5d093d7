"""The trained hosted-tools fixture (``tests/fixtures/hosted_model``, docs/models.md) behind the
real server: a model that decides to search, cites what it found, and calls a real MCP server's
tool, with the openai SDK reading every event. Its documented prompts are the fixture's
``prompts.json``."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from openai import AsyncOpenAI, OpenAI

from mlx_responses.server import ServerHandle, serve

from .conftest import START_DEADLINE
from .mcp_servers import start_mcp_server
from .test_api_hosted_tools import hosted_settings
from .test_websocket import strict, until_terminal

DEADLINE = 60
FIXTURE = Path(__file__).parent / "fixtures" / "hosted_model"
MODEL = "hosted-tiny"
PARIS = "https://en.wikipedia.org/wiki/Paris"
SEARCH = {"instructions": "Answer with a web search.", "input": "What is the capital of France?"}
WEATHER = {
    "instructions": "Answer with the weather tool.",
    "input": "What is the weather in Paris?",
}


@pytest.fixture
async def sdk(nursery: trio.Nursery) -> AsyncIterator[AsyncOpenAI]:
    settings = hosted_settings()
    model = dataclasses.replace(settings.model, model_path=str(FIXTURE), alias=MODEL)
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(
            serve, dataclasses.replace(settings, model=model)
        )
    async with AsyncOpenAI(
        base_url=f"{server.base_url}/v1", api_key="sk-local", max_retries=0, timeout=60
    ) as client:
        yield client


async def test_the_model_searches_and_cites_what_it_found(sdk: AsyncOpenAI) -> None:
    with trio.fail_after(DEADLINE):
        stream = await sdk.responses.create(
            model=MODEL,
            **SEARCH,
            tools=[{"type": "web_search"}],
            include=["web_search_call.action.sources"],
            temperature=0,
            stream=True,
        )
        events = [event async for event in stream]
    final = events[-1].response
    assert final.status == "completed"
    call, message = final.output
    assert call.type == "web_search_call"
    assert call.status == "completed"
    assert call.action.query == "capital of France"
    assert call.action.sources[0].url == PARIS
    text = message.content[0]
    assert text.text == "The capital of France is Paris [1]."
    [citation] = text.annotations
    assert citation.type == "url_citation"
    assert (citation.url, citation.title) == (PARIS, "Paris")
    assert text.text[citation.start_index : citation.end_index] == "[1]"
    added = [e for e in events if e.type == "response.output_text.annotation.added"]
    assert [e.annotation.url for e in added] == [PARIS]  # type: ignore[union-attr]
    types = [e.type for e in events]
    assert types.index("response.web_search_call.completed") < types.index(
        "response.output_text.annotation.added"
    )
    # The answer is the response's output_text; the chain replays the search.
    assert final.output_text == "The capital of France is Paris [1]."
    with trio.fail_after(DEADLINE):
        chained = await sdk.responses.input_tokens.count(
            model=MODEL, input="Thanks.", previous_response_id=final.id
        )
        alone = await sdk.responses.input_tokens.count(model=MODEL, input="Thanks.")
        stored = await sdk.responses.input_items.list(final.id)
    # The chain counts the replayed search (its call and the sources' URLs) and the answer.
    assert chained.input_tokens > alone.input_tokens + len(PARIS) // 4
    assert [item.type for item in stored.data] == ["message"]


@pytest.mark.parametrize("transport", ["streamable-http", "sse"])
async def test_the_model_calls_an_mcp_tool_and_answers(sdk: AsyncOpenAI, transport: str) -> None:
    async with start_mcp_server(transport) as mcp:
        tool: dict[str, Any] = {
            "type": "mcp",
            "server_label": "weather",
            "server_url": mcp.url,
            "require_approval": "never",
        }
        with trio.fail_after(DEADLINE):
            response = await sdk.responses.create(
                model=MODEL, **WEATHER, tools=[tool], temperature=0
            )
    listing, call, answer = response.output
    assert listing.type == "mcp_list_tools"
    assert call.type == "mcp_call"
    assert (call.name, call.arguments, call.output) == (
        "get_weather",
        '{"city": "Paris"}',
        "sunny, 18C",
    )
    assert answer.type == "message"
    assert response.output_text == "It is sunny, 18C in Paris."


async def test_an_approved_call_runs_and_the_model_answers(sdk: AsyncOpenAI) -> None:
    async with start_mcp_server("streamable-http") as mcp:
        tool: dict[str, Any] = {"type": "mcp", "server_label": "weather", "server_url": mcp.url}
        with trio.fail_after(DEADLINE):
            asked = await sdk.responses.create(model=MODEL, **WEATHER, tools=[tool], temperature=0)
            request = asked.output[-1]
            assert request.type == "mcp_approval_request"
            assert (request.name, request.arguments) == ("get_weather", '{"city": "Paris"}')
            approval = {
                "type": "mcp_approval_response",
                "approval_request_id": request.id,
                "approve": True,
            }
            answered = await sdk.responses.create(
                model=MODEL,
                previous_response_id=asked.id,
                input=[approval],
                tools=[tool],
                temperature=0,
            )
    call = answered.output[0]
    assert call.type == "mcp_call"
    assert call.approval_request_id == request.id
    assert call.output == "sunny, 18C"
    assert answered.output_text == "It is sunny, 18C in Paris."


async def test_over_the_websocket_the_model_searches_and_cites(
    nursery: trio.Nursery,
) -> None:
    """The WebSocket mode runs the same hosted calls: the SDK's own ``responses.connect()``."""
    settings = hosted_settings()
    model = dataclasses.replace(settings.model, model_path=str(FIXTURE), alias=MODEL)
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(
            serve, dataclasses.replace(settings, model=model)
        )

    def run() -> list[dict[str, Any]]:
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="sk-local", max_retries=0)
        with client.responses.connect() as connection:
            connection.send(
                {
                    "type": "response.create",
                    "model": MODEL,
                    **SEARCH,
                    "tools": [{"type": "web_search"}],
                    "temperature": 0,  # the fixture's documented answers are greedy
                }
            )
            return until_terminal(connection)

    with trio.fail_after(DEADLINE):
        events = await trio.to_thread.run_sync(run)
    final = strict(events)
    assert [item["type"] for item in final["output"]] == ["web_search_call", "message"]
    assert final["output"][1]["content"][0]["text"] == "The capital of France is Paris [1]."
