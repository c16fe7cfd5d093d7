"""gpt-oss end to end: the families fixture (``tests/fixtures/families/gpt-oss``: mlx-lm's
``gpt_oss`` architecture with a sliding-window layer, harmony's special tokens, the real
template, trained on its ``prompts.json``) served over HTTP, driven by the ``openai`` and
``anthropic`` SDKs. Its documented prompts answer exactly under greedy decoding, so reasoning,
calls and replays are asserted exactly: a replay only gets the trained answer when it renders
the very tokens the template gives for the same chat."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from openai import AsyncOpenAI
from transformers import AutoTokenizer

from mlx_responses.server import ServerHandle, serve

from .conftest import START_DEADLINE, server_settings
from .family_calls import (
    HARMONY_MARKERS,
    LARK,
    assert_arguments_streamed,
    assert_lists_harmony,
    assert_shout,
    deltas,
    documented,
    forced_calls,
    messages_round_trip,
    openai_client,
    trained_tool,
)

FIXTURE = Path(__file__).parent / "fixtures" / "families" / "gpt-oss"
ALIAS = "gpt-oss-tiny"
DEADLINE = 90
PROMPTS = documented(FIXTURE)
TOOL = trained_tool(PROMPTS)
WEATHER: dict[str, Any] = {"type": "function", "strict": False, **TOOL}
GREEDY: dict[str, Any] = {"temperature": 0, "max_output_tokens": 60}


@pytest.fixture
async def gpt_oss(nursery: trio.Nursery) -> ServerHandle:
    base = server_settings()
    model = dataclasses.replace(base.model, model_path=str(FIXTURE), alias=ALIAS)
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, dataclasses.replace(base, model=model))
    return handle


@pytest.fixture
async def client(gpt_oss: ServerHandle) -> AsyncIterator[AsyncOpenAI]:
    async with openai_client(gpt_oss, DEADLINE) as c:
        yield c


def question(name: str) -> str:
    return str(PROMPTS[name]["messages"][-1]["content"])


async def test_detected_as_harmony_with_reasoning(client: AsyncOpenAI) -> None:
    await assert_lists_harmony(client, DEADLINE)


async def test_reasoning_item_then_the_answer(client: AsyncOpenAI) -> None:
    with trio.fail_after(DEADLINE):
        response = await client.responses.create(model=ALIAS, input=question("think"), **GREEDY)
    reasoning, message = response.output
    assert reasoning.type == "reasoning"
    assert [part.text for part in reasoning.content or []] == ["2 plus 2 makes 4."]
    assert message.type == "message"
    assert response.output_text == "The answer is 4."


async def test_a_streamed_call_with_argument_deltas_and_no_marker_text(
    client: AsyncOpenAI,
) -> None:
    with trio.fail_after(DEADLINE):
        stream = await client.responses.create(
            model=ALIAS,
            input=question("tool_call"),
            tools=[WEATHER],  # type: ignore[list-item]
            stream=True,
            **GREEDY,
        )
        events = [event async for event in stream]
    final = events[-1]
    assert final.type == "response.completed"
    reasoning, call = final.response.output
    assert reasoning.type == "reasoning"
    assert [part.text for part in reasoning.content or []] == ["Look up the weather."]
    assert call.type == "function_call"
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert_arguments_streamed(events, call.arguments)
    assert final.response.output_text == ""
    texts = deltas(events, "response.output_text.delta")
    assert not HARMONY_MARKERS.search("".join(texts) + call.arguments)


async def test_replay_renders_the_templates_tokens(client: AsyncOpenAI) -> None:
    """Reasoning + call + output replayed as items get the trained answer, from a prompt as
    long as the template's own rendering of the equivalent chat messages."""
    with trio.fail_after(DEADLINE):
        first = await client.responses.create(
            model=ALIAS,
            input=question("tool_call"),
            tools=[WEATHER],  # type: ignore[list-item]
            **GREEDY,
        )
        reasoning, call = first.output
        assert call.type == "function_call"
        replay = await client.responses.create(
            model=ALIAS,
            input=[
                {"role": "user", "content": question("tool_call")},
                reasoning.model_dump(exclude_none=True),  # type: ignore[list-item]
                call.model_dump(exclude_none=True),  # type: ignore[list-item]
                {
                    "type": "function_call_output",
                    "call_id": call.call_id,
                    "output": PROMPTS["tool_result"]["messages"][-1]["content"],
                },
            ],
            tools=[WEATHER],  # type: ignore[list-item]
            store=False,
            **GREEDY,
        )
    assert replay.output_text == "It is sunny and 18 degrees in Paris."
    tokenizer = AutoTokenizer.from_pretrained(str(FIXTURE))
    expected = tokenizer.apply_chat_template(
        PROMPTS["tool_result"]["messages"],
        tools=PROMPTS["tool_result"]["tools"],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert replay.usage is not None
    assert replay.usage.input_tokens == len(expected)


async def test_forced_named_required_and_lark_calls_are_valid_by_construction(
    client: AsyncOpenAI,
) -> None:
    """gpt-oss reasons before a forced call (docs/models.md): its analysis comes first as a
    reasoning item, then the call the grammar forces."""
    asked = question("tool_call")
    with trio.fail_after(DEADLINE):
        forced = await forced_calls(
            client,
            asked,
            named=([WEATHER, LARK], "get_weather"),
            required=[WEATHER],
            shout=[WEATHER, LARK],
            model=ALIAS,
            **GREEDY,
        )
    named, required, shout = forced.named, forced.required, forced.shout
    for response in (named, required, shout):
        assert response.status == "completed"
        reasoning, _ = response.output
        assert reasoning.type == "reasoning"
        assert response.output_text == ""
    # The trained prompt (its one tool) gives the trained analysis exactly; the others, whose
    # prompt lists a tool it was not trained with, reason in the tiny model's own words.
    reasoning = required.output[0]
    assert reasoning.type == "reasoning"
    assert reasoning.content is not None
    assert reasoning.content[0].text == "Look up the weather."
    for response in (named, required):
        call = response.output[1]
        assert call.type == "function_call"
        assert call.name == "get_weather"
        assert isinstance(json.loads(call.arguments)["city"], str)
    assert_shout(shout.output[1])


async def test_messages_tool_use_round_trip(gpt_oss: ServerHandle) -> None:
    trip = await messages_round_trip(
        gpt_oss.base_url,
        model=ALIAS,
        tool=TOOL,
        question=question("tool_call"),
        result=PROMPTS["tool_result"]["messages"][-1]["content"],
        max_tokens=(60, 60),
        forced=False,
        deadline=DEADLINE,
    )
    first, use, second = trip.first, trip.use, trip.second
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    assert second.stop_reason == "end_turn"
    (text,) = [b for b in second.content if b.type == "text"]
    assert text.text == "It is sunny and 18 degrees in Paris."
