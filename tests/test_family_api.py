"""Each family's own notation end to end: its trained fixture served over HTTP, asked
through the ``openai`` SDK, answers its documented prompts as Responses items (the call streamed).

The fixtures (``tests/fixtures/families/<family>/``, docs/models.md "Family fixtures") write a
tool call, reasoning and plain text in the family's notation, unforced: what comes back must be a
``function_call`` with its arguments, a reasoning item and the message text, with no marker text
anywhere in ``output_text``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import trio

from .conftest import MODEL
from .family_calls import (
    GET_WEATHER,
    assert_arguments_streamed,
    deltas,
    documented,
    openai_client,
)
from .test_api_prompt_cache_templates import start
from .test_family_fixtures import FAMILIES, built

DEADLINE = 120
# Text that only a family's markup has: angle-bracketed markers, DeepSeek's fullwidth bars,
# MiniMax's role markers.
MARKUP = re.compile(r"<[|/]?[\w:|\"]+[|]?>|\uff5c|\]~b\]|\[e~\[|to=functions")


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
    async with openai_client(server, DEADLINE) as sdk:
        with trio.fail_after(DEADLINE):
            hello = await sdk.responses.create(
                model=MODEL, input="Reply with: hello", temperature=0, max_output_tokens=40
            )
            stream = await sdk.responses.create(
                model=MODEL,
                input="What is the weather in Paris?",
                tools=[GET_WEATHER],  # type: ignore[list-item]
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
    assert_arguments_streamed(events, calls[0].arguments)
    shown = "".join(deltas(events, "response.output_text.delta"))
    assert not MARKUP.search(shown), shown
    for response in (hello, call, think):
        if response is not None:
            assert not MARKUP.search(response.output_text), response.output_text
    if think is not None:
        assert think.output_text.strip() == "The answer is 4."
        assert reasoning_text(think).strip() == "2 plus 2 makes 4."
