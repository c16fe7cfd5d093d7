"""Function tools, reasoning, structured output, logprobs and seeds, end to end with the SDK."""

from __future__ import annotations

import json
from typing import Any

import httpx2 as httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI
from pydantic import BaseModel

from mlx_responses.engine.bundled_model import load_bundled_prompts
from mlx_responses.server import ServerHandle, serve
from tests.conformance import assert_stream_invariants, assert_strict_response, parse_sse

from .conftest import MODEL, output_text, server_settings
from .test_cli_operations import assert_flag_refused

DEADLINE = 60
# Not the suite's own (conftest): a seed this test chose for answers that differ.
SERVER_SEED = 11


def documented(name: str) -> Any:
    return next(p for p in load_bundled_prompts() if p.name == name)


WEATHER_TOOL: dict[str, Any] = {"type": "function", **documented("tool_call").tools[0]["function"]}
TIME_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_time",
    "description": "Get the current time in a timezone.",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"],
        "additionalProperties": False,
    },
}


async def create(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    reply = await http.post(
        "/v1/responses", json={"model": MODEL, "temperature": 0, "max_output_tokens": 80, **body}
    )
    assert reply.status_code == 200, reply.text
    data: dict[str, Any] = reply.json()
    assert_strict_response(data)
    return data


async def stream(http: httpx.AsyncClient, **body: Any) -> list[tuple[str, dict[str, Any]]]:
    payload = {"model": MODEL, "temperature": 0, "max_output_tokens": 80, "stream": True, **body}
    async with http.stream("POST", "/v1/responses", json=payload) as reply:
        assert reply.status_code == 200
        return parse_sse(b"".join([c async for c in reply.aiter_bytes()]))


def calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in response["output"] if item["type"] == "function_call"]


async def test_the_documented_tool_prompt_becomes_a_streamed_function_call(
    server: ServerHandle,
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            events = await stream(http, input="What is the weather in Paris?", tools=[WEATHER_TOOL])
    final = assert_stream_invariants(events)
    (call,) = calls(final)
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert call["call_id"].startswith("call_")
    assert call["id"].startswith("fc_")
    names = [name for name, _ in events]
    added = names.index("response.output_item.added")
    assert events[added][1]["item"]["type"] == "function_call"
    assert events[added][1]["item"]["name"] == "get_weather"
    deltas = [e["delta"] for n, e in events if n == "response.function_call_arguments.delta"]
    # Streamed as arguments deltas; how many depends on the delta interval (a delta carries
    # every token since the previous one, docs/api.md), so one is enough.
    assert deltas
    assert "".join(deltas) == call["arguments"]
    assert output_text(final) == ""


async def test_a_tool_round_trip_call_output_answer(client: AsyncOpenAI) -> None:
    with trio.fail_after(DEADLINE):
        first = await client.responses.create(
            model=MODEL, input="What is the weather in Paris?", tools=[WEATHER_TOOL], temperature=0
        )
        (call,) = [item for item in first.output if item.type == "function_call"]
        second = await client.responses.create(
            model=MODEL,
            previous_response_id=first.id,
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
            temperature=0,
            input=[
                {
                    "type": "function_call_output",
                    "call_id": call.call_id,
                    "output": '{"city": "Paris", "temperature": 18, "condition": "sunny"}',
                }
            ],
        )
    assert second.output_text == documented("tool_result").expected


@pytest.mark.parametrize(
    ("tool_choice", "tools", "name"),
    [
        ("required", [WEATHER_TOOL], "get_weather"),
        ({"type": "function", "name": "get_time"}, [WEATHER_TOOL, TIME_TOOL], "get_time"),
        (
            {"type": "function", "function": {"name": "get_time"}},
            [WEATHER_TOOL, TIME_TOOL],
            "get_time",
        ),
    ],
)
async def test_forced_tool_choice_yields_a_schema_valid_call_on_a_non_tool_prompt(
    server: ServerHandle, tool_choice: Any, tools: list[Any], name: str
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            data = await create(
                http, input="Reply with: hello", tools=tools, tool_choice=tool_choice
            )
    (call,) = calls(data)
    assert call["name"] == name
    arguments = json.loads(call["arguments"])
    schema = next(t for t in tools if t["name"] == name)["parameters"]
    assert set(schema["required"]) <= set(arguments)
    for key, value in arguments.items():
        if key not in schema["properties"]:
            # Schema-valid: the schema allows other keys (the model's choice, undocumented).
            assert schema.get("additionalProperties", True) is not False
            continue
        spec = schema["properties"][key]
        assert isinstance(value, str)
        if "enum" in spec:
            assert value in spec["enum"]


async def test_tool_choice_none_produces_no_call(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            data = await create(
                http,
                input="What is the weather in Paris?",
                tools=[WEATHER_TOOL],
                tool_choice="none",
            )
    assert calls(data) == []


async def test_reasoning_is_an_item_and_never_leaks_into_output_text(server: ServerHandle) -> None:
    reasoning, _, answer = documented("think").expected.partition("</think>")
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            events = await stream(http, input="Think, then answer: what is 2 + 2?")
    final = assert_stream_invariants(events)
    assert [item["type"] for item in final["output"]] == ["reasoning", "message"]
    deltas = "".join(e["delta"] for n, e in events if n == "response.reasoning_text.delta")
    assert deltas == reasoning.removeprefix("<think>").strip("\n")
    text = "".join(e["delta"] for n, e in events if n == "response.output_text.delta")
    assert text == answer.lstrip("\n")
    assert "<think>" not in text
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] > 0


class Cat(BaseModel):
    name: str
    age: int


async def test_parse_returns_the_parsed_object(client: AsyncOpenAI) -> None:
    with trio.fail_after(DEADLINE):
        parsed = await client.responses.parse(
            model=MODEL,
            input="Give me a JSON object describing a cat.",
            text_format=Cat,
            temperature=0,
            max_output_tokens=60,
        )
    assert isinstance(parsed.output_parsed, Cat)


async def test_json_object_mode_always_parses(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            data = await create(
                http,
                input="Give me a JSON object describing a cat.",
                text={"format": {"type": "json_object"}},
            )
    assert data["status"] == "completed"
    assert data["text"]["format"] == {"type": "json_object"}
    assert isinstance(json.loads(output_text(data)), dict)


simple_schemas = st.fixed_dictionaries(
    {},
    optional={
        "word": st.sampled_from(
            [{"type": "string", "maxLength": 8}, {"type": "string", "enum": ["a", "b"]}]
        ),
        "count": st.sampled_from(
            [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "integer", "maximum": 99}]
        ),
        "flag": st.just({"type": "boolean"}),
        "items": st.just(
            {"type": "array", "items": {"type": "integer", "maximum": 9}, "maxItems": 2}
        ),
    },
).map(
    lambda props: {
        "type": "object",
        "properties": props,
        "required": sorted(props),
        "additionalProperties": False,
    }
)


def check(value: Any, schema: dict[str, Any]) -> None:
    """A small validator for the schema family above."""
    kind = schema["type"]
    if kind == "object":
        assert isinstance(value, dict)
        assert set(value) == set(schema["required"])
        for key, sub in schema["properties"].items():
            check(value[key], sub)
    elif kind == "string":
        assert isinstance(value, str)
        assert len(value) <= schema.get("maxLength", len(value))
        assert value in schema.get("enum", [value])
    elif kind == "integer":
        assert isinstance(value, int)
        assert not isinstance(value, bool)
        assert schema.get("minimum", value) <= value <= schema.get("maximum", value)
    elif kind == "boolean":
        assert isinstance(value, bool)
    elif kind == "array":
        assert isinstance(value, list)
        assert len(value) <= schema["maxItems"]
        for element in value:
            check(element, schema["items"])


@settings(max_examples=6, deadline=None)
@given(schema=simple_schemas)
def test_json_schema_output_validates(schema: dict[str, Any]) -> None:
    async def main() -> dict[str, Any]:
        async with trio.open_nursery() as nursery:
            with trio.fail_after(DEADLINE):
                server: ServerHandle = await nursery.start(serve, server_settings())
                async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
                    data = await create(
                        http,
                        input="Give me a JSON object describing a cat.",
                        max_output_tokens=120,
                        text={
                            "format": {
                                "type": "json_schema",
                                "name": "thing",
                                "schema": schema,
                                "strict": True,
                            }
                        },
                    )
            nursery.cancel_scope.cancel()
        return data

    data = trio.run(main)
    assert data["status"] == "completed"
    assert data["text"]["format"]["schema"] == schema
    check(json.loads(output_text(data)), schema)


async def test_logprobs_when_included_and_empty_otherwise(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            with_logprobs = await create(
                http,
                input="Name three colors.",
                top_logprobs=3,
                include=["message.output_text.logprobs"],
            )
            without = await create(http, input="Name three colors.")
    part = with_logprobs["output"][0]["content"][0]
    assert len(part["logprobs"]) == with_logprobs["usage"]["output_tokens"]
    first = part["logprobs"][0]
    assert first["logprob"] <= 0
    assert len(first["top_logprobs"]) == 3
    assert first["top_logprobs"][0]["logprob"] >= first["top_logprobs"][-1]["logprob"]
    assert with_logprobs["top_logprobs"] == 3
    assert without["output"][0]["content"][0]["logprobs"] == []


async def test_a_seed_makes_sampling_reproducible(server: ServerHandle) -> None:
    body = {"input": "Tell me a story.", "temperature": 1.5, "max_output_tokens": 30, "seed": 7}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            first = await create(http, **body)
            second = await create(http, **body)
    assert output_text(first) == output_text(second)


async def test_the_server_seed_makes_unseeded_sampling_reproducible() -> None:
    """``--seed``: servers started with the same seed answer the same unseeded requests, at a
    temperature where the bundled model's answers vary, with the same text, and a server with
    another seed does not; the keys run on from request to request (the second answer is not
    the first again). (Without a seed, MLX starts every thread of one process from the same
    key, so two servers in this process would agree with or without the flag.)"""
    body = {"input": "Tell me a story.", "temperature": 2.0, "max_output_tokens": 30}
    runs: list[tuple[str, str]] = []
    for seed in (SERVER_SEED, SERVER_SEED, SERVER_SEED + 1):
        async with trio.open_nursery() as nursery:
            with trio.fail_after(DEADLINE):
                handle = await nursery.start(serve, server_settings(seed=seed))
                async with httpx.AsyncClient(base_url=handle.base_url, timeout=60) as http:
                    first = await create(http, **body)
                    second = await create(http, **body)
            runs.append((output_text(first), output_text(second)))
            nursery.cancel_scope.cancel()
    assert runs[0] == runs[1]
    assert runs[2] != runs[0]
    assert runs[0][0] != runs[0][1]


@pytest.mark.parametrize("value", ["-1", "2147483648", "1.5", "some"])
def test_a_bad_server_seed_is_refused_naming_the_flag(value: str) -> None:
    expected = "'off' or an integer 0..2147483647"
    assert_flag_refused("--seed", "MLX_RESPONSES_SEED", value, expected)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"include": ["bogus"]}, "include[0]"),
        (
            {
                "text": {
                    "format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}
                }
            },
            "text.format.schema",
        ),
        (
            {"text": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
            "text.format.name",
        ),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"truncation": "auto"}, "truncation"),
        ({"max_tool_calls": 0}, "max_tool_calls"),
    ],
)
async def test_bad_generation_values_are_400_and_store_nothing(
    server: ServerHandle, body: dict[str, Any], param: str
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            reply = await http.post("/v1/responses", json={"model": MODEL, "input": "hi", **body})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param
    assert server.store.statistics().entries == 0
    assert server.model.statistics().sequences_finished == 0


async def test_reasoning_settings_are_echoed_and_validated(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            data = await create(
                http, input="Reply with: hello", reasoning={"effort": "low", "summary": "auto"}
            )
            bad = await http.post(
                "/v1/responses",
                json={"model": MODEL, "input": "hi", "reasoning": {"effort": "extreme"}},
            )
    assert data["reasoning"] == {"effort": "low", "summary": "auto"}
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "reasoning.effort"
