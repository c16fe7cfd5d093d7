"""What the family API tests share: the Lark tool they force, the three forced requests (a named
call, ``required``, the Lark tool), the ``/v1/messages`` tool_use round trip, a fixture's
documented prompts, and the checks every family must pass (a streamed call's argument deltas join
to its arguments, a Lark call matches its grammar, a harmony model lists itself as such).

Each test file keeps what is its own: the server it starts (a family's trained fixture in
``test_family_e2e.py`` and ``test_family_api.py``, the bundled model with a family's template in
``test_api_family_formats.py`` or with ``--tool-format harmony`` in
``test_formats_harmony_api.py``, the gpt-oss fixture in ``test_formats_gpt_oss_api.py``) and how
exactly that model answers, which its own assertions say.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import trio
from anthropic.types import Message, ToolUseBlock
from openai import AsyncOpenAI
from openai.types.responses import Response

from mlx_responses.server import ServerHandle

from .conftest import MODEL, output_text
from .test_api_prompt_cache_hybrid import cached
from .test_api_prompt_cache_templates import start

# The weather tool as the fixtures were trained on it: a free-string city.
GET_WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The name of the city."}},
        "required": ["city"],
    },
}
# Finite by construction: a bounded word, so a tiny model forced into it always ends.
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
SHOUTED = re.compile("BEGIN [a-z]{2,8} END")
# Harmony's markers and its recipient header: text no visible output may carry.
HARMONY_MARKERS = re.compile(
    r"<\|(start|channel|message|end|call|return|constrain)\|>|to=functions"
)


def documented(path: Path) -> dict[str, dict[str, Any]]:
    """A fixture's documented prompts (its ``prompts.json``), by name."""
    records = json.loads((path / "prompts.json").read_text(encoding="utf-8"))
    return {r["name"]: r for r in records}


def trained_tool(prompts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The tool a fixture was trained to call, as the chat template takes it (``name``,
    ``description``, ``parameters``)."""
    tool: dict[str, Any] = prompts["tool_call"]["tools"][0]["function"]
    return tool


def openai_client(server: ServerHandle, deadline: float) -> AsyncOpenAI:
    """The ``openai`` SDK at ``server``, no retries, each request bounded by ``deadline``."""
    return AsyncOpenAI(
        base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=deadline
    )


def deltas(events: list[Any], kind: str) -> list[str]:
    """The ``delta`` of every event of ``kind``, from the SDK's event objects or from
    ``(name, data)`` pairs as ``tests.conformance.parse_sse`` reads them."""
    found = []
    for event in events:
        if isinstance(event, tuple):
            name, data = event
            if name == kind:
                found.append(data["delta"])
        elif event.type == kind:
            found.append(event.delta)
    return found


def assert_arguments_streamed(events: list[Any], arguments: str) -> None:
    """The call's arguments arrived as deltas, and the deltas join to them."""
    streamed = deltas(events, "response.function_call_arguments.delta")
    assert streamed
    assert "".join(streamed) == arguments


def assert_shout(custom: Any) -> None:
    """A call of ``LARK`` whose input its grammar accepts."""
    assert custom.type == "custom_tool_call"
    assert SHOUTED.fullmatch(custom.input), custom.input


async def assert_lists_harmony(client: AsyncOpenAI, deadline: float) -> None:
    """``/v1/models`` lists the one model as harmony's, with tools and reasoning."""
    with trio.fail_after(deadline):
        listed = await client.models.with_raw_response.list()
    (entry,) = listed.http_response.json()["data"]
    assert entry["tool_call_format"] == "harmony"
    assert entry["supports_tools"] is True
    assert entry["supports_reasoning"] is True


@dataclass(frozen=True)
class Forced:
    named: Response
    required: Response
    shout: Response


async def forced_calls(
    sdk: AsyncOpenAI,
    question: str,
    *,
    named: tuple[list[dict[str, Any]], str],
    required: list[dict[str, Any]],
    shout: list[dict[str, Any]],
    **sampling: Any,
) -> Forced:
    """``question`` three times, each with a forced choice: the function named ``named[1]``
    among ``named[0]``, ``required`` among ``required``, the ``LARK`` tool among ``shout``."""
    tools, name = named
    return Forced(
        await sdk.responses.create(
            input=question,
            tools=tools,  # type: ignore[arg-type]
            tool_choice={"type": "function", "name": name},
            **sampling,
        ),
        await sdk.responses.create(
            input=question,
            tools=required,  # type: ignore[arg-type]
            tool_choice="required",
            **sampling,
        ),
        await sdk.responses.create(
            input=question,
            tools=shout,  # type: ignore[arg-type]
            tool_choice={"type": "custom", "name": LARK["name"]},
            **sampling,
        ),
    )


@dataclass(frozen=True)
class RoundTrip:
    first: Message
    use: ToolUseBlock
    second: Message


async def messages_round_trip(
    base_url: str,
    *,
    model: str,
    tool: dict[str, Any],
    question: str,
    result: str,
    max_tokens: tuple[int, int],
    forced: bool,
    deadline: float,
) -> RoundTrip:
    """Anthropic's ``/v1/messages`` with ``tool`` (``name``, ``description``, ``parameters``):
    ``question`` answered with one ``tool_use`` of it (forced to it when ``forced``), then that
    turn and its ``tool_result`` (``result``) sent back for the answer. ``max_tokens``: each
    request's. Greedy both times."""
    tools: Any = [
        {
            "name": tool["name"],
            "description": tool["description"],
            "input_schema": tool["parameters"],
        }
    ]
    asked: Any = {"role": "user", "content": question}
    choice: Any = {"tool_choice": {"type": "tool", "name": tool["name"]}} if forced else {}
    async with anthropic.AsyncAnthropic(
        base_url=base_url, api_key="x", max_retries=0, timeout=deadline
    ) as sdk:
        with trio.fail_after(deadline):
            first = await sdk.messages.create(
                model=model,
                max_tokens=max_tokens[0],
                tools=tools,
                messages=[asked],
                extra_body={"temperature": 0},
                **choice,
            )
            assert first.stop_reason == "tool_use"
            (use,) = [block for block in first.content if block.type == "tool_use"]
            assert use.name == tool["name"]
            second = await sdk.messages.create(
                model=model,
                max_tokens=max_tokens[1],
                tools=tools,
                messages=[
                    asked,
                    {"role": "assistant", "content": first.content},
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": use.id, "content": result}
                        ],
                    },
                ],
                extra_body={"temperature": 0},
            )
    return RoundTrip(first, use, second)


async def store_false_loop(
    base_url: str,
    turns: list[str | None],
    *,
    tools: list[dict[str, Any]] | None,
    result: str,
    max_output_tokens: int,
    request_timeout: float,
) -> list[dict[str, Any]]:
    """An agent loop with ``store: false``: the whole history resent each turn, the outputs
    replayed as they came; a turn is a user message, or ``None``: the last call answered with
    ``result``. Greedy; each turn's response body, in order."""
    async with httpx.AsyncClient(base_url=base_url, timeout=request_timeout) as http:
        history: list[dict[str, Any]] = []
        out = []
        for text in turns:
            if text is not None:
                history.append({"role": "user", "content": text})
            else:
                calls = [i for i in history if i.get("type") == "function_call"]
                assert calls, "the model did not call the tool"
                output = {"call_id": calls[-1]["call_id"], "output": result}
                history.append({"type": "function_call_output", **output})
            body: dict[str, Any] = {"model": MODEL, "input": history, "store": False}
            if tools is not None:
                body["tools"] = tools
            body.update(temperature=0, max_output_tokens=max_output_tokens)
            reply = await http.post("/v1/responses", json=body)
            assert reply.status_code == 200, reply.text
            data: dict[str, Any] = reply.json()
            history.extend(data["output"])
            out.append(data)
    return out


async def warm_and_cold(nursery: trio.Nursery, path: Path) -> tuple[ServerHandle, ServerHandle]:
    """Two servers on the model at ``path``: one with the prompt cache, one without."""
    return await start(nursery, path), await start(nursery, path, prompt_cache_bytes=0)


async def hot_and_fresh(
    loop: Callable[[str], Awaitable[list[dict[str, Any]]]],
    warm: ServerHandle,
    cold: ServerHandle,
    deadline: float,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``loop`` (a server's URL: its responses) on ``warm`` then on ``cold``: the cache changes
    no answer, and the server without one reuses nothing."""
    with trio.fail_after(deadline):
        hot = await loop(warm.base_url)
        fresh = await loop(cold.base_url)
    assert [output_text(r) for r in hot] == [output_text(r) for r in fresh]
    assert all(cached(r) == 0 for r in fresh)
    return hot, fresh
