"""The prompt cache on the sliding-window families: gpt-oss and Gemma 4.

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

import pytest
import trio

from .conftest import output_text
from .family_calls import GET_WEATHER, hot_and_fresh, store_false_loop, warm_and_cold
from .test_api_prompt_cache_hybrid import cached

DEADLINE = 180
FIXTURES = Path(__file__).parent / "fixtures" / "families"
SLIDING = ["gpt-oss", "gemma-4"]
TOOLS = [GET_WEATHER]
WEATHER = '{"city": "Paris", "temperature": 18, "condition": "sunny"}'
TURNS: list[str | None] = ["What is the weather in Paris?", None, "Reply with: hello"]


def fixture(name: str) -> Path:
    path = Path(os.environ.get("FAMILY_FIXTURES", FIXTURES)) / name
    if not (path / "model.safetensors").exists():
        pytest.skip(f"{name}'s fixture is not built (scripts/build_family_fixtures.py)")
    return path


async def replay(base_url: str) -> list[dict[str, Any]]:
    """``TURNS`` as a ``store: false`` agent loop, the call answered with ``WEATHER``."""
    return await store_false_loop(
        base_url, TURNS, tools=TOOLS, result=WEATHER, max_output_tokens=60, request_timeout=60
    )


@pytest.mark.parametrize("family", SLIDING)
async def test_a_store_false_replay_on_a_sliding_window_model_reuses_the_previous_turn(
    nursery: trio.Nursery, family: str
) -> None:
    warm, cold = await warm_and_cold(nursery, fixture(family))
    hot, _fresh = await hot_and_fresh(replay, warm, cold, DEADLINE)
    call = hot[0]["usage"]["input_tokens"]
    assert [i["type"] for i in hot[0]["output"]][-1] == "function_call"
    assert output_text(hot[1]) == "It is sunny and 18 degrees in Paris."
    assert cached(hot[1]) >= 0.9 * call
    # A new user message makes both templates drop the reasoning that preceded the call,
    # inside the previous prompt: what survives is the first prompt, and it is reused whole.
    assert cached(hot[2]) >= call
    assert all(cached(r) < r["usage"]["input_tokens"] for r in hot)


async def chat(base_url: str) -> list[dict[str, Any]]:
    """Plain turns, ``store: false``: the replayed reply renders differently from the
    generation prompt it followed (Gemma 4 opens an empty thought channel there), so the
    previous prompt is no exact prefix; its checkpoint at the start of the last message is."""
    turns: list[str | None] = [
        "Reply with: hello",
        "Think, then answer: what is 2 + 2?",
        "Reply with: hi",
    ]
    return await store_false_loop(
        base_url, turns, tools=None, result="", max_output_tokens=40, request_timeout=60
    )


@pytest.mark.parametrize("family", SLIDING)
async def test_a_plain_chat_replay_on_a_sliding_window_model_reuses_the_previous_turn(
    nursery: trio.Nursery, family: str
) -> None:
    warm, cold = await warm_and_cold(nursery, fixture(family))
    hot, _fresh = await hot_and_fresh(chat, warm, cold, DEADLINE)
    for previous, turn in pairwise(hot):
        assert cached(turn) >= 0.9 * previous["usage"]["input_tokens"]
