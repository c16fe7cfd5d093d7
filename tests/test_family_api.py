"""Each family's own notation end to end (issue 24): its trained fixture served over HTTP, asked
through the ``openai`` SDK, answers its documented prompts as Responses items (the call streamed).

The fixtures (``tests/fixtures/families/<family>/``, docs/models.md "Family fixtures") write a
tool call, reasoning and plain text in the family's notation, unforced: what comes back must be a
``function_call`` with its arguments, a reasoning item and the message text, with no marker text
anywhere in ``output_text``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import trio
from openai import AsyncOpenAI

from .conftest import MODEL
from .test_api_prompt_cache_templates import start
from .test_family_fixtures import FAMILIES, built

DEADLINE = 120
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The name of the city."}},
        "required": ["city"],
    },
}
# Text that only a family's markup has: angle-bracketed markers, DeepSeek's fullwidth bars,
# MiniMax's role markers.
MARKUP = re.compile(r"<[|/]?[\w:|\"]+[|]?>|\uff5c|\]~b\]|\[e~\[|to=functions")


def documented(path: Path) -> dict[str, dict[str, Any]]:
    records = json.loads((path / "prompts.json").read_text(encoding="utf-8"))
    return {r["name"]: r for r in records}


def reasoning_text(response: Any) -> str:
    return "".join(
        part.text
        for item in response.output
        if item.type == "reasoning"
        for part in (item.content or [])
    )


@pytest.mark.parametrize("family", FAMILIES)
async def test_the_family_answers_with_a_call_reasoning_and_text(
    nursery: trio.Nursery, family: str
) -> None:
    path = built(family)
    prompts = documented(path)
    server = await start(nursery, path)
    async with AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0) as sdk:
        with trio.fail_after(DEADLINE):
            hello = await sdk.responses.create(
                model=MODEL, input="Reply with: hello", temperature=0, max_output_tokens=40
            )
            stream = await sdk.responses.create(
                model=MODEL,
                input="What is the weather in Paris?",
                tools=[WEATHER],  # type: ignore[list-item]
                temperature=0,
                max_output_tokens=60,
                stream=True,
            )
            events = [event async for event in stream]
            think = None
            if "think" in prompts:
                # A family's reasoning switch is its template's own kwarg (docs/models.md).
                kwargs = prompts["think"].get("template_kwargs")
                think = await sdk.responses.create(
                    model=MODEL,
                    input="Think, then answer: what is 2 + 2?",
                    temperature=0,
                    max_output_tokens=60,
                    extra_body={"chat_template_kwargs": kwargs} if kwargs else None,
                )
    assert hello.output_text.strip() == "hello"
    (call,) = [e.response for e in events if e.type == "response.completed"]
    calls = [item for item in call.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    # Streamed: the arguments arrive as deltas that join to the final text, and no delta of
    # visible text carries the family's markup.
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert deltas
    assert "".join(deltas) == calls[0].arguments
    shown = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert not MARKUP.search(shown), shown
    for response in (hello, call, think):
        if response is not None:
            assert not MARKUP.search(response.output_text), response.output_text
    if think is not None:
        assert think.output_text.strip() == "The answer is 4."
        assert reasoning_text(think).strip() == "2 plus 2 makes 4."
