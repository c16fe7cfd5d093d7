"""Each family's trained fixture end to end: through HTTP, with the ``openai`` and ``anthropic``
SDKs, against a real server started on that fixture.

- Forced calls are valid by construction: a named call and ``required`` parse against the tool's
  schema, a Lark custom tool's input matches its grammar.
- A replay of reasoning + ``function_call`` + ``function_call_output`` runs exactly the token ids
  the family's own chat template gives for the equivalent chat messages (its reasoning key, its
  arguments as an object or a string), sent as items or through stored history
  (``previous_response_id``). The ids are the ones the model actor is handed: the test records
  every ``ModelHandle.submit`` of the in-process server (the real call, passed through).
- A ``store: false`` agent loop reuses at least 90% of the previous prompt that the template
  leaves unchanged, and answers as a server with the cache off.
- ``/v1/messages``: the fixture's own ``tool_use``, its ``tool_result`` replayed, the trained
  answer back.

One server per family per test (a fixture's server starts in well under a second).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import httpx2 as httpx
import jsonschema
import pytest
import trio
from transformers import AutoTokenizer

from mlx_responses.actors.model import GenerationRequest
from mlx_responses.server import ServerHandle

from .conftest import MODEL, output_text
from .family_calls import (
    LARK,
    assert_shout,
    documented,
    forced_calls,
    hot_and_fresh,
    messages_round_trip,
    openai_client,
    store_false_loop,
    trained_tool,
    warm_and_cold,
)
from .test_api_prompt_cache_hybrid import cached
from .test_api_prompt_cache_templates import start
from .test_family_fixtures import FACTS, FAMILIES, built

DEADLINE = 120
TIME: dict[str, Any] = {
    "type": "function",
    "name": "get_time",
    "description": "The time in a zone.",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"],
        "additionalProperties": False,
    },
}
THOUGHT = "Look up the weather."
# A forced call's budget: the call itself, after whatever reasoning the format allows first
# (harmony: one analysis message, bounded at 1,024 tokens).
FORCED_BUDGET = 1200
ANSWER = "It is sunny and 18 degrees in Paris."
# How each family's template reads an assistant turn (docs/models.md): the key its reasoning
# goes under, and whether it wants the arguments as a JSON string (DeepSeek concatenates them).
# Kimi K2's template heads a call ``functions.NAME:N`` and answers ``## Return of <id>``, so the
# server replays call ids as that; every other family takes the client's id as it is.
# (transformers' ``apply_chat_template`` fills ``reasoning_content`` and ``thinking`` from each
# other, so the key is documentation here; the reasoning itself is what is compared).
REASONING_KEY = {"gpt-oss": "thinking", "lfm2.5": "thinking"}
ARGUMENTS_AS_STRING = {"deepseek-v3.1"}
CALL_ID = {"kimi-k2": "functions.get_weather:0"}
# The template kwargs a request without any renders with (docs/models.md): mlx-lm's, whose
# ``enable_thinking`` is on for a model with thinking tokens; DeepSeek's own default, off.
DEFAULT_KWARGS: dict[str, dict[str, Any]] = {
    family: {"enable_thinking": reasons} for family, (_, reasons) in FACTS.items()
} | {"deepseek-v3.1": {"thinking": False}}


def weather_tool(prompts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The fixture's trained tool, as a Responses ``tools`` entry."""
    return {"type": "function", **trained_tool(prompts)}


def record_prompts(server: ServerHandle, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """Every prompt the model actor is handed from now on, in order (the real submit runs)."""
    seen: list[tuple[int, ...]] = []
    real: Callable[..., Awaitable[Any]] = server.actors.model.submit

    async def submit(request: GenerationRequest, *rest: Any) -> Any:
        seen.append(request.prompt)
        return await real(request, *rest)

    monkeypatch.setattr(server.actors.model, "submit", submit)
    return seen


@pytest.mark.parametrize("family", FAMILIES)
async def test_forced_calls_on_the_trained_fixture_are_valid_by_construction(
    nursery: trio.Nursery, family: str
) -> None:
    """On the question the fixture answers with a ``get_weather`` call: forced to the other
    tool, to any tool, to a Lark custom tool. Every tool is finite by construction (enums, no
    other properties, a bounded word): a tiny model forced off its training may ramble in a
    free string, so only a finite schema makes "the call is valid and ends" the grammar's
    promise rather than the model's luck. The budget leaves room for the bounded reasoning a
    format may allow before a forced call."""
    prompts = documented(built(family))
    trained = weather_tool(prompts)
    city = {"type": "string", "enum": ["Paris", "Tokyo"], "description": "The name of the city."}
    parameters = {**trained["parameters"], "properties": {"city": city}}
    weather = {**trained, "parameters": {**parameters, "additionalProperties": False}}
    question = prompts["tool_call"]["messages"][-1]["content"]
    server = await start(nursery, built(family))
    async with openai_client(server, DEADLINE) as sdk:
        with trio.fail_after(DEADLINE):
            forced = await forced_calls(
                sdk,
                question,
                named=([weather, TIME], "get_time"),
                required=[weather, TIME],
                shout=[weather, LARK],
                model=MODEL,
                temperature=0,
                max_output_tokens=FORCED_BUDGET,
            )
    named, required, shout = forced.named, forced.required, forced.shout
    schemas = {"get_weather": weather["parameters"], "get_time": TIME["parameters"]}
    (call,) = [item for item in named.output if item.type == "function_call"]
    assert call.name == "get_time"
    jsonschema.validate(json.loads(call.arguments), schemas["get_time"])
    (call,) = [item for item in required.output if item.type == "function_call"]
    assert call.name in schemas
    jsonschema.validate(json.loads(call.arguments), schemas[call.name])
    (custom,) = [item for item in shout.output if item.type == "custom_tool_call"]
    assert_shout(custom)
    for response in (named, required, shout):
        assert response.status == "completed"
        assert response.output_text == ""


def equivalent_chat(
    family: str, question: str, result: str, thought: str | None, call_id: str
) -> list[dict[str, Any]]:
    """The chat messages a user of ``family``'s template writes for a replay of reasoning
    (``thought``), the Paris call with id ``call_id`` and its ``result``."""
    arguments: Any = {"city": "Paris"}
    if family in ARGUMENTS_AS_STRING:
        arguments = json.dumps(arguments)
    call_id = CALL_ID.get(family, call_id)
    assistant = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "get_weather", "arguments": arguments},
            }
        ],
    }
    if thought is not None:
        assistant[REASONING_KEY.get(family, "reasoning_content")] = thought
    return [
        {"role": "user", "content": question},
        assistant,
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


def template_ids(family: str, chat: list[dict[str, Any]], tools: Any) -> list[int]:
    """The family's chat template over ``chat``, with the kwargs a request without any gets."""
    tokenizer = AutoTokenizer.from_pretrained(str(built(family)))
    ids = tokenizer.apply_chat_template(
        chat,
        tools=tools,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        **DEFAULT_KWARGS[family],
    )
    assert isinstance(ids, list)
    return ids


def assert_same_ids(family: str, served: tuple[int, ...], expected: list[int]) -> None:
    """``served == expected``, shown as text from where they part when they do not."""
    if list(served) != expected:
        tokenizer = AutoTokenizer.from_pretrained(str(built(family)))
        at = shared(served, tuple(expected))
        parted = tokenizer.decode(list(served[at:]))
        assert parted == tokenizer.decode(expected[at:]), f"{family} parts at token {at}"
    assert list(served) == expected


@pytest.mark.parametrize("family", FAMILIES)
async def test_a_replay_runs_the_templates_own_token_ids(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    prompts = documented(built(family))
    weather = weather_tool(prompts)
    question = prompts["tool_call"]["messages"][-1]["content"]
    result = prompts["tool_result"]["messages"][-1]["content"]
    server = await start(nursery, built(family))
    prompts_seen = record_prompts(server, monkeypatch)
    body: dict[str, Any] = {
        "model": MODEL,
        "input": [
            {"role": "user", "content": question},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": THOUGHT}],
            },
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": result},
        ],
        "tools": [weather],
        "store": False,
        "temperature": 0,
        "max_output_tokens": 40,
    }
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            counted = await http.post("/v1/responses/input_tokens", json=body)
            reply = await http.post("/v1/responses", json=body)
            # The same through stored history: the model's own call, then its output by
            # previous_response_id.
            asked = {**body, "input": question, "store": True}
            first = (await http.post("/v1/responses", json=asked)).json()
            (call,) = [i for i in first["output"] if i["type"] == "function_call"]
            answer = {"type": "function_call_output", "call_id": call["call_id"], "output": result}
            follow = {**body, "input": [answer], "previous_response_id": first["id"]}
            followed = await http.post("/v1/responses", json=follow)
    assert counted.status_code == 200, counted.text
    assert reply.status_code == 200, reply.text
    assert followed.status_code == 200, followed.text
    expected = template_ids(
        family,
        equivalent_chat(family, question, result, THOUGHT, "call_1"),
        prompts["tool_call"]["tools"],
    )
    assert len(prompts_seen) == 3
    assert_same_ids(family, prompts_seen[0], expected)
    assert counted.json()["input_tokens"] == len(expected)
    assert reply.json()["usage"]["input_tokens"] == len(expected)
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    thought = "".join(
        part["text"]
        for item in first["output"]
        if item["type"] == "reasoning"
        for part in item.get("content") or []
    )
    chat = equivalent_chat(family, question, result, thought or None, call["call_id"])
    assert_same_ids(
        family, prompts_seen[2], template_ids(family, chat, prompts["tool_call"]["tools"])
    )


TURNS = ["tool_call", None, "hello"]


async def agent_loop(base_url: str, prompts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """``TURNS`` as a ``store: false`` agent loop: the documented questions, the call answered
    with the documented result."""
    return await store_false_loop(
        base_url,
        [None if name is None else prompts[name]["messages"][-1]["content"] for name in TURNS],
        tools=[weather_tool(prompts)],
        result=prompts["tool_result"]["messages"][-1]["content"],
        max_output_tokens=60,
        request_timeout=DEADLINE,
    )


def shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


@pytest.mark.parametrize("family", FAMILIES)
async def test_a_store_false_agent_loop_reuses_the_previous_prompt(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    prompts = documented(built(family))
    warm, cold = await warm_and_cold(nursery, built(family))
    seen = record_prompts(warm, monkeypatch)
    hot, _fresh = await hot_and_fresh(partial(agent_loop, prompts=prompts), warm, cold, DEADLINE)
    assert [i["type"] for i in hot[0]["output"]][-1] == "function_call"
    assert "message" not in [i["type"] for i in hot[0]["output"]]
    # The trained answer: the replay of the model's own call is the prompt it was trained on.
    assert output_text(hot[1]) == ANSWER
    assert len(seen) == len(TURNS)
    for previous, prompt, turn in zip(seen, seen[1:], hot[1:], strict=False):
        # What the template re-renders of the previous prompt (a new user message makes most
        # templates drop the reasoning before it) cannot be reused; the rest must be.
        unchanged = shared(previous, prompt)
        assert cached(turn) >= 0.9 * unchanged, (family, len(previous), unchanged, cached(turn))
    # The call's output appended to the call: the whole previous prompt is unchanged.
    assert shared(seen[0], seen[1]) == len(seen[0])


@pytest.mark.parametrize("family", FAMILIES)
async def test_a_messages_tool_use_round_trip(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    prompts = documented(built(family))
    result = prompts["tool_result"]["messages"][-1]["content"]
    server = await start(nursery, built(family))
    seen = record_prompts(server, monkeypatch)
    trip = await messages_round_trip(
        server.base_url,
        model=MODEL,
        tool=trained_tool(prompts),
        question=prompts["tool_call"]["messages"][-1]["content"],
        result=result,
        max_tokens=(60, 60),
        forced=False,
        deadline=DEADLINE,
    )
    first, use, second = trip.first, trip.use, trip.second
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    assert [b.type for b in first.content if b.type != "thinking"] == ["tool_use"]
    thoughts = [b.thinking for b in first.content if b.type == "thinking"]
    question = prompts["tool_call"]["messages"][-1]["content"]
    chat = equivalent_chat(family, question, result, "".join(thoughts) or None, use.id)
    assert_same_ids(family, seen[1], template_ids(family, chat, prompts["tool_call"]["tools"]))
    assert second.stop_reason == "end_turn"
    assert [(b.type, getattr(b, "text", None)) for b in second.content if b.type != "thinking"] == [
        ("text", ANSWER)
    ]
