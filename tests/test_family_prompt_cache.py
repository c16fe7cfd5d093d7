"""The prompt cache on the sliding-window families (issue 24): gpt-oss and Gemma 4.

Their caches rotate (a sliding-window layer beside full-attention ones), so a cached entry past
the window cannot be trimmed and serves only a prompt it is an exact prefix of: what hits on a
``store: false`` replay is what the server checkpointed. Each fixture's window is shrunk below
its prompts' length so that every entry has rotated. A replay must reuse at least 90% of the
previous prompt and answer exactly as a server with the cache off.
"""

from __future__ import annotations

import os
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import trio

from .conftest import MODEL, output_text
from .test_api_prompt_cache_hybrid import cached
from .test_api_prompt_cache_templates import start

DEADLINE = 180
FIXTURES = Path(__file__).parent / "fixtures" / "families"
SLIDING = ["gpt-oss", "gemma-4"]
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The name of the city."}},
            "required": ["city"],
        },
    }
]
WEATHER = '{"city": "Paris", "temperature": 18, "condition": "sunny"}'
TURNS = ["What is the weather in Paris?", None, "Reply with: hello"]


def fixture(name: str) -> Path:
    path = Path(os.environ.get("FAMILY_FIXTURES", FIXTURES)) / name
    if not (path / "model.safetensors").exists():
        pytest.skip(f"{name}'s fixture is not built (scripts/build_family_fixtures.py)")
    return path


async def replay(base_url: str) -> list[dict[str, Any]]:
    """An agent loop, ``store: false``: the whole history resent each turn, the outputs replayed
    as they came, a call answered with its output (``None`` in ``TURNS``)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        history: list[dict[str, Any]] = []
        out = []
        for text in TURNS:
            if text is not None:
                history.append({"role": "user", "content": text})
            else:
                calls = [i for i in history if i.get("type") == "function_call"]
                assert calls, "the model did not call the tool"
                output = {"call_id": calls[-1]["call_id"], "output": WEATHER}
                history.append({"type": "function_call_output", **output})
            body = {"model": MODEL, "input": history, "tools": TOOLS, "store": False}
            body.update(temperature=0, max_output_tokens=60)
            reply = await http.post("/v1/responses", json=body)
            assert reply.status_code == 200, reply.text
            data: dict[str, Any] = reply.json()
            history.extend(data["output"])
            out.append(data)
    return out


@pytest.mark.parametrize("family", SLIDING)
async def test_a_store_false_replay_on_a_sliding_window_model_reuses_the_previous_turn(
    nursery: trio.Nursery, family: str
) -> None:
    path = fixture(family)
    warm = await start(nursery, path)
    cold = await start(nursery, path, prompt_cache_bytes=0)
    with trio.fail_after(DEADLINE):
        hot = await replay(warm.base_url)
        fresh = await replay(cold.base_url)
    assert [output_text(r) for r in hot] == [output_text(r) for r in fresh]
    call = hot[0]["usage"]["input_tokens"]
    assert [i["type"] for i in hot[0]["output"]][-1] == "function_call"
    assert output_text(hot[1]) == "It is sunny and 18 degrees in Paris."
    assert cached(hot[1]) >= 0.9 * call
    # A new user message makes both templates drop the reasoning that preceded the call,
    # inside the previous prompt: what survives is the first prompt, and it is reused whole.
    assert cached(hot[2]) >= call
    assert all(cached(r) < r["usage"]["input_tokens"] for r in hot)
    assert all(cached(r) == 0 for r in fresh)


async def chat(base_url: str) -> list[dict[str, Any]]:
    """Plain turns, ``store: false``: the replayed reply renders differently from the
    generation prompt it followed (Gemma 4 opens an empty thought channel there), so the
    previous prompt is no exact prefix; its checkpoint at the start of the last message is."""
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        history: list[dict[str, Any]] = []
        out = []
        for text in ("Reply with: hello", "Think, then answer: what is 2 + 2?", "Reply with: hi"):
            history.append({"role": "user", "content": text})
            body = {"model": MODEL, "input": history, "store": False, "temperature": 0}
            reply = await http.post("/v1/responses", json={**body, "max_output_tokens": 40})
            assert reply.status_code == 200, reply.text
            data: dict[str, Any] = reply.json()
            history.extend(data["output"])
            out.append(data)
    return out


@pytest.mark.parametrize("family", SLIDING)
async def test_a_plain_chat_replay_on_a_sliding_window_model_reuses_the_previous_turn(
    nursery: trio.Nursery, family: str
) -> None:
    path = fixture(family)
    warm = await start(nursery, path)
    cold = await start(nursery, path, prompt_cache_bytes=0)
    with trio.fail_after(DEADLINE):
        hot = await chat(warm.base_url)
        fresh = await chat(cold.base_url)
    assert [output_text(r) for r in hot] == [output_text(r) for r in fresh]
    for previous, turn in pairwise(hot):
        assert cached(turn) >= 0.9 * previous["usage"]["input_tokens"]
