"""Each family's format end to end through HTTP: the bundled model's weights and tokenizer with a
family's real chat template (``tests/fixtures/families``), so the server detects that family's
format; the model knows none of these notations, so a forced call is what proves the grammar and
the parser together: a streamed ``function_call`` with argument deltas, valid by construction, no
marker text in ``output_text``; and its replay with the call's output renders in the family's
template (DeepSeek's needs the arguments as a string).

Trained fixtures of each family's own architecture (``test_family_e2e.py``) add the model's own
unforced output; this file proves the format side with the real server and the real SDK.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import trio
from openai import AsyncOpenAI

from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH
from tests.conformance import assert_stream_invariants, parse_sse

from .conftest import MODEL
from .family_calls import (
    LARK,
    assert_arguments_streamed,
    assert_shout,
    deltas,
    documented,
    messages_round_trip,
    trained_tool,
)
from .test_api_prompt_cache_templates import start
from .test_formats_family_render import FAMILIES, FIXTURES

DEADLINE = 60
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        # Finite by construction (an untrained model would ramble in a free string); the
        # grammar tests cover free strings.
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Tokyo"]},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "hourly": {"type": "boolean"},
        },
        "required": ["city", "unit", "hourly"],
        "additionalProperties": False,
    },
}
TIME: dict[str, Any] = {
    "type": "function",
    "name": "get_time",
    "description": "The time in a zone.",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"],
    },
}
MARKERS = ("<tool_call>", "<arg_key>", "<|tool_call", "<minimax:", "<invoke", "tool\u2581", "call:")


def family_model(family: str, folder: Path) -> Path:
    """The bundled model with ``family``'s chat template."""
    target = folder / family
    shutil.copytree(BUNDLED_MODEL_PATH, target)
    shutil.copyfile(FIXTURES / family / "chat_template.jinja", target / "chat_template.jinja")
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config), encoding="utf-8")
    return target


async def stream(http: httpx.AsyncClient, **body: Any) -> list[tuple[str, dict[str, Any]]]:
    payload = {"model": MODEL, "temperature": 0, "max_output_tokens": 400, "stream": True, **body}
    async with http.stream("POST", "/v1/responses", json=payload) as reply:
        assert reply.status_code == 200, await reply.aread()
        return parse_sse(b"".join([c async for c in reply.aiter_bytes()]))


@pytest.mark.parametrize("family", sorted(FAMILIES))
async def test_a_forced_call_streams_and_replays_in_the_family_format(
    family: str, nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = await start(nursery, family_model(family, tmp_path))
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            models = (await http.get("/v1/models")).json()["data"]
            assert models[0]["tool_call_format"] == FAMILIES[family]
            events = await stream(
                http,
                input="Reply with: hello",
                tools=[WEATHER],
                tool_choice={"type": "function", "name": "get_weather"},
            )
        final = assert_stream_invariants(events)
        (call,) = [item for item in final["output"] if item["type"] == "function_call"]
        assert call["name"] == "get_weather"
        arguments = json.loads(call["arguments"])
        assert set(arguments) == {"city", "unit", "hourly"}
        assert arguments["city"] in ("Paris", "Tokyo")
        assert arguments["unit"] in ("celsius", "fahrenheit")
        assert isinstance(arguments["hourly"], bool)
        assert_arguments_streamed(events, call["arguments"])
        texts = deltas(events, "response.output_text.delta")
        assert not any(marker in "".join(texts) for marker in MARKERS)

    # The call and its output replayed through the family's template, with the SDK; then
    # `required` among two tools and a Lark custom tool, valid by construction.
    async with AsyncOpenAI(
        base_url=f"{server.base_url}/v1", api_key="sk-local", max_retries=0, timeout=60
    ) as client:
        with trio.fail_after(DEADLINE):
            required = await client.responses.create(
                model=MODEL,
                input="What is the weather in Paris?",
                tools=[WEATHER, TIME],  # type: ignore[list-item]
                tool_choice="required",
                temperature=0,
                max_output_tokens=400,
            )
            # With reasoning on, DeepSeek's prompt opens <think>: the forced call is still one.
            thinking = await client.responses.create(
                model=MODEL,
                input="Reply with: hello",
                tools=[WEATHER],  # type: ignore[list-item]
                tool_choice={"type": "function", "name": "get_weather"},
                extra_body={"chat_template_kwargs": {"thinking": True}},
                temperature=0,
                max_output_tokens=400,
            )
            shout = await client.responses.create(
                model=MODEL,
                input="Reply with: hello",
                tools=[LARK, WEATHER],  # type: ignore[list-item]
                tool_choice={"type": "custom", "name": "shout"},
                temperature=0,
                max_output_tokens=400,
            )
            second = await client.responses.create(
                model=MODEL,
                previous_response_id=final["id"],
                tools=[WEATHER],  # type: ignore[list-item]
                temperature=0,
                max_output_tokens=8,
                input=[
                    {
                        "type": "function_call_output",
                        "call_id": call["call_id"],
                        "output": '{"temperature": 18}',
                    }
                ],
            )
    assert second.status in ("completed", "incomplete")
    (chosen,) = [item for item in required.output if item.type == "function_call"]
    assert chosen.name in ("get_weather", "get_time")
    assert isinstance(json.loads(chosen.arguments), dict)
    (forced,) = [item for item in thinking.output if item.type == "function_call"]
    assert forced.name == "get_weather"
    (custom,) = [item for item in shout.output if item.type == "custom_tool_call"]
    assert_shout(custom)


async def test_a_messages_tool_use_round_trip_in_glm(nursery: trio.Nursery, tmp_path: Path) -> None:
    """Anthropic's /v1/messages on a family format: a forced ``tool_use`` in GLM's notation,
    then its ``tool_result`` replayed through GLM's template."""
    server = await start(nursery, family_model("glm-4.6", tmp_path))
    trip = await messages_round_trip(
        server.base_url,
        model=MODEL,
        tool={
            "name": "get_weather",
            "description": "The weather.",
            "parameters": WEATHER["parameters"],
        },
        question="What is the weather in Paris?",
        result="sunny",
        max_tokens=(400, 8),
        forced=True,
        deadline=DEADLINE,
    )
    first, use, second = trip.first, trip.use, trip.second
    assert isinstance(use.input, dict)
    assert use.input["city"] in ("Paris", "Tokyo")
    assert isinstance(use.input["hourly"], bool)
    assert not [block for block in first.content if block.type == "text" and "<" in block.text]
    assert second.stop_reason in ("end_turn", "max_tokens")


async def test_the_trained_qwen3_coder_fixture_calls_and_is_forced(nursery: trio.Nursery) -> None:
    """The families' trained Qwen3-Coder fixture (its architecture, its marker tokens, its
    template): its own call in XML parameters streams as a function_call, and a forced call,
    a 400 before its XML format could be constrained, is valid by construction."""
    prompts = documented(FIXTURES / "qwen3-coder")
    tool_call = prompts["tool_call"]
    weather = {"type": "function", **trained_tool(prompts)}
    server = await start(nursery, FIXTURES / "qwen3-coder")
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            own = await stream(http, input=tool_call["messages"][0]["content"], tools=[weather])
            forced = await stream(
                http,
                input="Reply with: hello",
                tools=[weather, TIME],
                tool_choice={"type": "function", "name": "get_time"},
            )
    final = assert_stream_invariants(own)
    (call,) = [item for item in final["output"] if item["type"] == "function_call"]
    assert (call["name"], json.loads(call["arguments"])) == ("get_weather", {"city": "Paris"})
    assert_arguments_streamed(own, call["arguments"])
    final = assert_stream_invariants(forced)
    (call,) = [item for item in final["output"] if item["type"] == "function_call"]
    assert call["name"] == "get_time"
    assert json.loads(call["arguments"])["zone"] in ("UTC", "CET")
