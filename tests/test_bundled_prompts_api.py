"""Every documented prompt of the bundled model, sent through the HTTP API, gets its answer.

Prompts that need function tools are answered through the API once tools exist (the
generation-surface issue); until then they are checked directly with mlx-lm in
tests/test_bundled_model.py.
"""

from __future__ import annotations

import pytest
import trio
from openai import AsyncOpenAI

from mlx_responses.engine.bundled_model import BundledPrompt, load_bundled_prompts
from tests.conformance import assert_strict_response

from .conftest import MODEL, split_reasoning

TEXT_PROMPTS = [p for p in load_bundled_prompts() if not p.tools]


def as_input(prompt: BundledPrompt) -> list[dict[str, str]]:
    return [{"role": m["role"], "content": m["content"]} for m in prompt.messages]


@pytest.mark.parametrize("prompt", TEXT_PROMPTS, ids=[p.name for p in TEXT_PROMPTS])
async def test_documented_prompt_through_the_api(
    client: AsyncOpenAI, prompt: BundledPrompt
) -> None:
    with trio.fail_after(60):
        raw = await client.responses.with_raw_response.create(
            model=MODEL,
            input=as_input(prompt),  # type: ignore[arg-type]
            temperature=0,
            max_output_tokens=prompt.expected_tokens + 20,
        )
    data = raw.http_response.json()
    assert_strict_response(data)
    assert data["status"] == "completed"
    reasoning, visible = split_reasoning(prompt.expected)
    assert raw.parse().output_text == visible
    assert data["usage"]["output_tokens"] == prompt.expected_tokens
    if reasoning is not None:
        # The <think> block is a reasoning item ahead of the message, never output_text.
        assert data["output"][0]["type"] == "reasoning"
        assert data["output"][0]["content"] == [{"type": "reasoning_text", "text": reasoning}]
        assert data["output"][1]["type"] == "message"
        assert (
            0 < data["usage"]["output_tokens_details"]["reasoning_tokens"] < prompt.expected_tokens
        )


def test_the_documented_set_covers_what_the_docs_promise() -> None:
    prompts = {p.name: p for p in load_bundled_prompts()}
    assert prompts["hello"].expected == "hello"
    assert prompts["count"].expected_tokens > 300
    assert prompts["think"].expected.startswith("<think>")
    assert prompts["tool_call"].expected.startswith("<tool_call>")
    assert prompts["json_cat"].expected.startswith("{")
