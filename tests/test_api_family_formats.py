"""Each family's format end to end through HTTP: the bundled model's weights and tokenizer with a
family's real chat template (``tests/fixtures/families``), so the server detects that family's
format; the model knows none of these notations, so a forced call is what proves the grammar and
the parser together: a streamed ``function_call`` with argument deltas, valid by construction, no
marker text in ``output_text``; and its replay with the call's output renders in the family's
template (DeepSeek's needs the arguments as a string).

Trained fixtures of each family's own architecture (the families work of issue 24) add the model's
own unforced output; this file proves the format side with the real server and the real SDK.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import pytest
import trio
from openai import AsyncOpenAI

from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH
from mlx_responses.server import ServerHandle, serve
from tests.conformance import assert_stream_invariants, parse_sse

from .conftest import MODEL, START_DEADLINE, server_settings
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
SHOUT: dict[str, Any] = {
    "type": "custom",
    "name": "shout",
    "description": "Shout a word.",
    "format": {
        "type": "grammar",
        "syntax": "lark",
        "definition": 'start: "BEGIN " WORD " END"\nWORD: /[a-z]{2,8}/',
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
    settings = server_settings()
    settings = replace(
        settings, model=replace(settings.model, model_path=str(family_model(family, tmp_path)))
    )
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, settings)
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
        deltas = [e["delta"] for n, e in events if n == "response.function_call_arguments.delta"]
        assert deltas
        assert "".join(deltas) == call["arguments"]
        texts = [e["delta"] for n, e in events if n == "response.output_text.delta"]
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
                tools=[SHOUT, WEATHER],  # type: ignore[list-item]
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
    assert re.fullmatch("BEGIN [a-z]{2,8} END", custom.input), custom.input


async def test_a_messages_tool_use_round_trip_in_glm(nursery: trio.Nursery, tmp_path: Path) -> None:
    """Anthropic's /v1/messages on a family format: a forced ``tool_use`` in GLM's notation,
    then its ``tool_result`` replayed through GLM's template."""
    settings = server_settings()
    settings = replace(
        settings, model=replace(settings.model, model_path=str(family_model("glm-4.6", tmp_path)))
    )
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, settings)
    tools: Any = [
        {
            "name": "get_weather",
            "description": "The weather.",
            "input_schema": WEATHER["parameters"],
        }
    ]
    question: Any = {"role": "user", "content": "What is the weather in Paris?"}
    async with anthropic.AsyncAnthropic(
        base_url=server.base_url, api_key="x", max_retries=0, timeout=DEADLINE
    ) as client:
        with trio.fail_after(DEADLINE):
            first = await client.messages.create(
                model=MODEL,
                max_tokens=400,
                tools=tools,
                tool_choice={"type": "tool", "name": "get_weather"},
                messages=[question],
                extra_body={"temperature": 0},
            )
            (use,) = [block for block in first.content if block.type == "tool_use"]
            second = await client.messages.create(
                model=MODEL,
                max_tokens=8,
                tools=tools,
                messages=[
                    question,
                    {"role": "assistant", "content": first.content},
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}
                        ],
                    },
                ],
                extra_body={"temperature": 0},
            )
    assert first.stop_reason == "tool_use"
    assert use.name == "get_weather"
    assert isinstance(use.input, dict)
    assert use.input["city"] in ("Paris", "Tokyo")
    assert isinstance(use.input["hourly"], bool)
    assert not [block for block in first.content if block.type == "text" and "<" in block.text]
    assert second.stop_reason in ("end_turn", "max_tokens")


async def test_the_trained_qwen3_coder_fixture_calls_and_is_forced(nursery: trio.Nursery) -> None:
    """The families' trained Qwen3-Coder fixture (its architecture, its marker tokens, its
    template): its own call in XML parameters streams as a function_call, and a forced call,
    a 400 before its XML format could be constrained, is valid by construction."""
    prompts = json.loads((FIXTURES / "qwen3-coder" / "prompts.json").read_text(encoding="utf-8"))
    tool_call = next(p for p in prompts if p["name"] == "tool_call")
    weather = {"type": "function", **tool_call["tools"][0]["function"]}
    settings = server_settings()
    model = replace(settings.model, model_path=str(FIXTURES / "qwen3-coder"))
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, replace(settings, model=model))
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
    deltas = [e["delta"] for n, e in own if n == "response.function_call_arguments.delta"]
    assert "".join(deltas) == call["arguments"]
    final = assert_stream_invariants(forced)
    (call,) = [item for item in final["output"] if item["type"] == "function_call"]
    assert call["name"] == "get_time"
    assert json.loads(call["arguments"])["zone"] in ("UTC", "CET")
