"""A model split by layers (``--pipeline``) over 2 ranks (ring backend, loopback) answers as
the same model in one process does (issue 26). The bundled model's class (qwen3) cannot be
split by layers in mlx-lm, so the fixture is its weights in the qwen2 class
(``tests/sharded.qwen2_copy``), compared against itself served by one process.

One single-process server gives the reference answers, then one sharded server serves the
module; the last test shuts it down.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx
import pytest
import trio

from mlx_responses.engine.bundled_model import load_bundled_prompts
from tests.conformance import assert_stream_invariants, assert_strict_response, parse_sse

from .conftest import MODEL, output_text
from .sharded import Ranks, qwen2_copy, start_ranks, start_single

DEADLINE = 120
PROMPTS = {p.name: p for p in load_bundled_prompts()}
GREEDY = ["hello_with_system", "capital", "multi_turn", "json_cat"]


def _body(name: str, **extra: Any) -> dict[str, Any]:
    prompt = PROMPTS[name]
    messages = [{"role": m["role"], "content": m["content"]} for m in prompt.messages]
    return {
        "model": MODEL,
        "input": messages,
        "temperature": 0,
        "max_output_tokens": prompt.expected_tokens + 20,
        **extra,
    }


@dataclass
class Served:
    ranks: Ranks
    expected: dict[str, tuple[str, int]]  # one process's text and token count, per prompt


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("pipeline")
    model = qwen2_copy(folder / "qwen2")
    single = start_single(model, folder, "--alias", MODEL)
    expected = {}
    try:
        for name in [*GREEDY, "count"]:
            data = httpx.post(f"{single.base_url}/v1/responses", json=_body(name), timeout=60)
            answer = data.json()
            expected[name] = (output_text(answer), answer["usage"]["output_tokens"])
    finally:
        assert single.stop(DEADLINE) == [0]
    ranks = start_ranks(model, folder, "--alias", MODEL, "--pipeline")
    try:
        yield Served(ranks, expected)
    finally:
        ranks.close()


@pytest.mark.parametrize("name", GREEDY)
async def test_greedy_text_is_the_single_process_text(served: Served, name: str) -> None:
    async with httpx.AsyncClient(base_url=served.ranks.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            data = (await http.post("/v1/responses", json=_body(name))).json()
    assert_strict_response(data)
    assert (output_text(data), data["usage"]["output_tokens"]) == served.expected[name]


async def test_streamed_text_and_a_prefix_cache_hit(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.ranks.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            reply = await http.post("/v1/responses", json=_body("count", stream=True))
            # The same prompt again, unstored: served from the prompt cache on every rank.
            again = (await http.post("/v1/responses", json=_body("count", store=False))).json()
    final = assert_stream_invariants(parse_sse(reply.content))
    assert (output_text(final), final["usage"]["output_tokens"]) == served.expected["count"]
    assert output_text(again) == served.expected["count"][0]
    assert again["usage"]["input_tokens_details"]["cached_tokens"] > 0


async def test_forced_tool_call_then_every_rank_exits_0(served: Served) -> None:
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": {
            "type": "object",
            # Finite by construction: a tiny model forced off its training may ramble in a
            # free string past the output limit (unterminated arguments).
            "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    }
    async with httpx.AsyncClient(base_url=served.ranks.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            data = (
                await http.post(
                    "/v1/responses",
                    json={
                        "model": MODEL,
                        "input": "Reply with: hello",
                        "tools": [tool],
                        "tool_choice": "required",
                        "temperature": 0,
                    },
                )
            ).json()
            health = (await http.get("/health")).json()
    (call,) = [item for item in data["output"] if item["type"] == "function_call"]
    assert set(json.loads(call["arguments"])) == {"city"}
    assert health["distributed"]["mode"] == "pipeline"
    assert health["distributed"]["size"] == 2
    ranks = served.ranks
    assert ranks.stop(DEADLINE) == [0, 0], ranks.log(0) + ranks.log(1)
    assert "sharded over 2 ranks (pipeline parallel, ring)" in ranks.log(0)
    assert "rank 0 shut down after" in ranks.log(1)
