"""gpt-oss end to end: the families fixture (``tests/fixtures/families/gpt-oss``: mlx-lm's
``gpt_oss`` architecture with a sliding-window layer, harmony's special tokens, the real
template, trained on its ``prompts.json``) served over HTTP, driven by the ``openai`` and
``anthropic`` SDKs. Its documented prompts answer exactly under greedy decoding, so reasoning,
calls and replays are asserted exactly: a replay only gets the trained answer when it renders
the very tokens the template gives for the same chat."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
import trio
from openai import AsyncOpenAI
from transformers import AutoTokenizer

from mlx_responses.server import ServerHandle, serve

from .conftest import START_DEADLINE, server_settings

FIXTURE = Path(__file__).parent / "fixtures" / "families" / "gpt-oss"
ALIAS = "gpt-oss-tiny"
DEADLINE = 90
PROMPTS = {p["name"]: p for p in json.loads((FIXTURE / "prompts.json").read_text())}
TOOL = PROMPTS["tool_call"]["tools"][0]["function"]
WEATHER: dict[str, Any] = {"type": "function", "strict": False, **TOOL}
MARKERS = re.compile(r"<\|(start|channel|message|end|call|return|constrain)\|>|to=functions")
LARK: dict[str, Any] = {
    "type": "custom",
    "name": "shout",
    "description": "Shout a word.",
    "format": {
        "type": "grammar",
        "syntax": "lark",
        "definition": 'start: "BEGIN " WORD " END"\nWORD: /[a-z]{2,8}/\n',
    },
}
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
    async with AsyncOpenAI(
        base_url=f"{gpt_oss.base_url}/v1", api_key="x", max_retries=0, timeout=DEADLINE
    ) as c:
        yield c


def question(name: str) -> str:
    return str(PROMPTS[name]["messages"][-1]["content"])


async def test_detected_as_harmony_with_reasoning(client: AsyncOpenAI) -> None:
    with trio.fail_after(DEADLINE):
        listed = await client.models.with_raw_response.list()
    (entry,) = listed.http_response.json()["data"]
    assert entry["tool_call_format"] == "harmony"
    assert entry["supports_tools"] is True
    assert entry["supports_reasoning"] is True


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
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert deltas
    assert "".join(deltas) == call.arguments
    assert final.response.output_text == ""
    texts = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert not MARKERS.search("".join(texts) + call.arguments)


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
        named = await client.responses.create(
            model=ALIAS,
            input=asked,
            tools=[WEATHER, LARK],  # type: ignore[list-item]
            tool_choice={"type": "function", "name": "get_weather"},
            **GREEDY,
        )
        required = await client.responses.create(
            model=ALIAS,
            input=asked,
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice="required",
            **GREEDY,
        )
        shout = await client.responses.create(
            model=ALIAS,
            input=asked,
            tools=[WEATHER, LARK],  # type: ignore[list-item]
            tool_choice={"type": "custom", "name": "shout"},
            **GREEDY,
        )
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
    custom = shout.output[1]
    assert custom.type == "custom_tool_call"
    assert re.fullmatch("BEGIN [a-z]{2,8} END", custom.input), custom.input


async def test_messages_tool_use_round_trip(gpt_oss: ServerHandle) -> None:
    tools: Any = [
        {
            "name": TOOL["name"],
            "description": TOOL["description"],
            "input_schema": TOOL["parameters"],
        }
    ]
    asked: Any = {"role": "user", "content": question("tool_call")}
    async with anthropic.AsyncAnthropic(
        base_url=gpt_oss.base_url, api_key="x", max_retries=0, timeout=DEADLINE
    ) as sdk:
        with trio.fail_after(DEADLINE):
            first = await sdk.messages.create(
                model=ALIAS,
                max_tokens=60,
                tools=tools,
                messages=[asked],
                extra_body={"temperature": 0},
            )
            (use,) = [block for block in first.content if block.type == "tool_use"]
            second = await sdk.messages.create(
                model=ALIAS,
                max_tokens=60,
                tools=tools,
                messages=[
                    asked,
                    {"role": "assistant", "content": first.content},
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": use.id,
                                "content": PROMPTS["tool_result"]["messages"][-1]["content"],
                            }
                        ],
                    },
                ],
                extra_body={"temperature": 0},
            )
    assert first.stop_reason == "tool_use"
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    assert second.stop_reason == "end_turn"
    (text,) = [b for b in second.content if b.type == "text"]
    assert text.text == "It is sunny and 18 degrees in Paris."
