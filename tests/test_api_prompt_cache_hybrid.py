"""The prompt cache on a model whose KV cache cannot be trimmed: segment checkpoints (issue 12).

A random-weight LFM2 (``tests/hybrid_model.py``: convolution layers with recurrent state, and
attention layers) with the bundled tokenizer and chat template. Its cache can only be reused as an
exact prefix, so what hits is what the server checkpointed: the end of each prompt, the end of a
finished sequence, and the segment boundaries that survive re-rendering (the end of the first
message, the end of the last user message, the start of the generation prompt). Every test
compares greedy text against a server with the cache off.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import trio

from .conftest import MODEL, output_text
from .hybrid_model import make_hybrid_model
from .test_api_prompt_cache_templates import drop_earlier_reasoning, start

DEADLINE = 120
TURNS = ["Reply with: hello", "Reply with: goodbye", "Say something short.", "Say yes."]
TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_hybrid_model(tmp_path_factory.mktemp("hybrid") / "lfm2")


async def create(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    request = {"model": MODEL, "temperature": 0, "max_output_tokens": 12, "store": False, **body}
    reply = await http.post("/v1/responses", json=request)
    assert reply.status_code == 200, reply.text
    data: dict[str, Any] = reply.json()
    assert data["status"] in ("completed", "incomplete"), data
    return data


def cached(data: dict[str, Any]) -> int:
    return int(data["usage"]["input_tokens_details"]["cached_tokens"])


async def replay_loop(base_url: str) -> list[dict[str, Any]]:
    """``store: false``, the whole history resent each turn, the outputs replayed as they came."""
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        history: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
        out = []
        for text in TURNS:
            history.append({"role": "user", "content": text})
            data = await create(http, input=history)
            history.extend(data["output"])
            out.append(data)
    return out


async def stats(base_url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        found: dict[str, Any] = (await http.get("/health")).json()["prompt_cache"]
    return found


async def test_a_store_false_replay_on_a_non_trimmable_cache_hits_and_answers_as_cold(
    nursery: trio.Nursery, hybrid: Path
) -> None:
    warm = await start(nursery, hybrid)
    cold = await start(nursery, hybrid, prompt_cache_bytes=0)
    with trio.fail_after(DEADLINE):
        hot = await replay_loop(warm.base_url)
        fresh = await replay_loop(cold.base_url)
        kept = await stats(warm.base_url)
    assert [output_text(r) for r in hot] == [output_text(r) for r in fresh]
    assert cached(hot[0]) == 0
    for previous, turn in pairwise(hot):
        # An exact prefix reaches at least the previous prompt's generation prompt.
        assert cached(turn) > previous["usage"]["input_tokens"] - 4
        assert cached(turn) < turn["usage"]["input_tokens"]
    assert all(cached(r) == 0 for r in fresh)
    assert kept["hits"] >= len(TURNS) - 1
    # Non-trimmable entries do not replace their prefixes: checkpoints stay as entries.
    assert kept["entries"] > len(TURNS)


async def tool_turns(base_url: str) -> list[dict[str, Any]]:
    """An agent step (user, reasoning + call, its output), then a new user message: the new
    message makes the template drop the step's reasoning, before the previous prompt's end."""
    step: list[dict[str, Any]] = [
        {"role": "user", "content": "Read the config file."},
        {
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "I should read config.toml first."}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "read_file",
            "arguments": '{"path": "config.toml"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "debug = true"},
    ]
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        first = await create(http, input=step, tools=TOOLS)
        follow = [*step, *first["output"], {"role": "user", "content": "Now say done."}]
        second = await create(http, input=follow, tools=TOOLS)
    return [first, second]


async def test_a_template_that_rewrites_earlier_turns_still_hits_the_surviving_segments(
    nursery: trio.Nursery, hybrid: Path, tmp_path: Path
) -> None:
    rewriting = drop_earlier_reasoning(tmp_path, hybrid)
    warm = await start(nursery, rewriting)
    cold = await start(nursery, rewriting, prompt_cache_bytes=0)
    with trio.fail_after(DEADLINE):
        hot = await tool_turns(warm.base_url)
        fresh = await tool_turns(cold.base_url)
    first, second = hot
    assert [output_text(r) for r in hot] == [output_text(r) for r in fresh]
    # The rewrite starts inside the first assistant turn, before the end of the first prompt:
    # neither the first prompt nor its reply is a prefix any more. The checkpoint at the end
    # of the user message that opened the step is, and it is reused.
    assert 0 < cached(second) < first["usage"]["input_tokens"] - 10
    assert cached(second) < second["usage"]["input_tokens"]
