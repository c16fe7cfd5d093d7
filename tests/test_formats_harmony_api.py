"""Harmony end to end through HTTP, the ``openai`` and ``anthropic`` SDKs, on the bundled model
served with ``--tool-format harmony``: every forced call is then written in harmony's notation
(the bundled tokenizer has no harmony tokens, so its markers are plain text, which the parser
reads the same), so the whole path is real: grammar, parser, shaper, events, replay.
The gpt-oss fixture model (``tests/fixtures/families/gpt-oss``) runs the same checks with its
own tokens."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from openai import AsyncOpenAI

from mlx_responses.server import ServerHandle, serve

from .conftest import MODEL, START_DEADLINE, server_settings
from .family_calls import (
    HARMONY_MARKERS,
    LARK,
    assert_arguments_streamed,
    assert_lists_harmony,
    assert_shout,
    deltas,
    messages_round_trip,
    openai_client,
)

DEADLINE = 90
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    # No description: gpt-oss's template reads it unguarded; the format supplies one.
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
TIME: dict[str, Any] = {
    "type": "function",
    "name": "get_time",
    "description": "The time in a city.",
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
}


def without_reasoning(output: list[Any]) -> list[Any]:
    """A forced call's output: an analysis message may precede the call (docs/models.md); the
    bundled model does not know harmony, so what it reasons is its own."""
    return [item for item in output if item.type != "reasoning"]


@pytest.fixture
async def harmony_server(nursery: trio.Nursery) -> ServerHandle:
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, server_settings(tool_format="harmony"))
    return handle


@pytest.fixture
async def client(harmony_server: ServerHandle) -> AsyncIterator[AsyncOpenAI]:
    async with openai_client(harmony_server, DEADLINE) as c:
        yield c


async def test_the_model_reports_harmony(client: AsyncOpenAI) -> None:
    await assert_lists_harmony(client, DEADLINE)


async def test_a_streamed_forced_call_sends_argument_deltas_and_no_marker_text(
    client: AsyncOpenAI,
) -> None:
    with trio.fail_after(DEADLINE):
        stream = await client.responses.create(
            model=MODEL,
            input="Reply with: hello",
            tools=[WEATHER, TIME],  # type: ignore[list-item]
            tool_choice={"type": "function", "name": "get_weather"},
            stream=True,
            temperature=0,
        )
        events = [event async for event in stream]
    final = events[-1]
    assert final.type == "response.completed"
    response = final.response
    (call,) = without_reasoning(response.output)
    assert call.type == "function_call"
    assert call.name == "get_weather"
    assert json.loads(call.arguments)["city"] in ("Paris", "Oslo")
    assert_arguments_streamed(events, call.arguments)
    assert response.output_text == ""
    assert not deltas(events, "response.output_text.delta")
    assert not HARMONY_MARKERS.search(call.arguments)


async def test_required_and_a_lark_custom_tool_are_valid_by_construction(
    client: AsyncOpenAI,
) -> None:
    with trio.fail_after(DEADLINE):
        required = await client.responses.create(
            model=MODEL,
            input="What is the weather in Paris?",
            tools=[WEATHER, TIME],  # type: ignore[list-item]
            tool_choice="required",
            temperature=0,
        )
        shout = await client.responses.create(
            model=MODEL,
            input="Reply with: hello",
            tools=[LARK, WEATHER],  # type: ignore[list-item]
            tool_choice={"type": "custom", "name": "shout"},
            temperature=0,
        )
        # The call and its output replayed, with the tool that has no description.
        (call,) = without_reasoning(required.output)
        replay = await client.responses.create(
            model=MODEL,
            input=[
                {"role": "user", "content": "What is the weather in Paris?"},
                call.model_dump(exclude_none=True),  # type: ignore[list-item]
                {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
            ],
            tools=[WEATHER],  # type: ignore[list-item]
            extra_body={"chat_template_kwargs": {"reasoning_effort": "high"}},
            max_output_tokens=8,
            temperature=0,
        )
    assert call.type == "function_call"
    assert call.name in ("get_weather", "get_time")
    json.loads(call.arguments)
    (custom,) = without_reasoning(shout.output)
    assert_shout(custom)
    assert replay.status in ("completed", "incomplete")


async def test_a_messages_tool_use_round_trip(harmony_server: ServerHandle) -> None:
    trip = await messages_round_trip(
        harmony_server.base_url,
        model=MODEL,
        tool={
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": WEATHER["parameters"],
        },
        question="What is the weather in Paris?",
        result="sunny",
        max_tokens=(100, 8),
        forced=True,
        deadline=DEADLINE,
    )
    assert isinstance(trip.use.input, dict)
    assert trip.use.input["city"] in ("Paris", "Oslo")
    assert trip.second.stop_reason in ("end_turn", "max_tokens")
