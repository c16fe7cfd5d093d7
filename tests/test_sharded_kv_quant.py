"""``--kv-bits`` on a model split by tensors over 2 ranks (ring backend, loopback): every rank
quantizes its share of the KV heads alike, so the documented prompts answer as one process
with ``--kv-bits`` does, a replayed prompt hits the prompt cache (held quantized on each rank)
with the same text, and a cancelled stream leaves every rank's batch."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest
import trio

from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH, load_bundled_prompts

from .conftest import MODEL, output_text, split_reasoning
from .rawhttp import open_stream, read_until
from .sharded import Ranks, start_ranks

DEADLINE = 120
PROMPTS = {p.name: p for p in load_bundled_prompts()}
# The bundled model's heads are 32 wide; each rank holds one of its two KV heads.
KV_FLAGS = ("--kv-bits", "8", "--kv-group-size", "32")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ranks]:
    folder = tmp_path_factory.mktemp("sharded-kv")
    started = start_ranks(BUNDLED_MODEL_PATH, folder, "--alias", MODEL, *KV_FLAGS)
    try:
        yield started
    finally:
        started.close()


def messages(name: str) -> list[dict[str, Any]]:
    return [{"role": m["role"], "content": m["content"]} for m in PROMPTS[name].messages]


async def create(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    reply = await http.post("/v1/responses", json={"model": MODEL, "temperature": 0, **body})
    assert reply.status_code == 200, reply.text
    data: dict[str, Any] = reply.json()
    return data


async def test_documented_prompts_and_a_prompt_cache_hit_answer_as_one_process(
    ranks: Ranks,
) -> None:
    # --kv-bits 8 gives the bundled model's documented answers in one process
    # (bench/kv_quant.py: every documented prompt identical), so they are the reference.
    turns = messages("multi_turn")
    async with httpx.AsyncClient(base_url=ranks.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            held = 0  # tokens the prompt cache keeps: each answer's, the second turn's last
            for name in ("hello_with_system", "capital", "json_cat"):
                data = await create(http, input=messages(name))
                assert output_text(data) == split_reasoning(PROMPTS[name].expected)[1]
                held += data["usage"]["total_tokens"]
            first = await create(http, input=turns[:1], store=False)
            second = await create(http, input=turns, store=False)
            held += second["usage"]["total_tokens"]
            status = (await http.get("/status")).json()
            stored = (await http.get("/health")).json()["prompt_cache"]["bytes"]
    assert output_text(first) == turns[1]["content"]
    assert output_text(second) == PROMPTS["multi_turn"].expected
    assert second["usage"]["input_tokens_details"]["cached_tokens"] > 0
    assert status["server"]["flags"]["--kv-bits"] == 8
    # Both ranks' shares, counted whole: 10/32 of float32's bytes per token (8 bits and a
    # float32 scale and bias per 32 values), far under full precision's.
    assert stored <= 0.4 * full_bytes_per_token() * held


def full_bytes_per_token() -> int:
    config = json.loads((BUNDLED_MODEL_PATH / "config.json").read_text())
    keys_and_values = 2 * config["num_key_value_heads"] * config["head_dim"]
    return int(config["num_hidden_layers"] * keys_and_values * 4)  # float32


async def test_a_cancelled_stream_leaves_every_rank_s_batch(ranks: Ranks) -> None:
    body = {"model": MODEL, "input": messages("count"), "temperature": 0, "stream": True}
    with trio.fail_after(DEADLINE):
        async with await open_stream(ranks.base_url, "/v1/responses", body) as stream:
            await read_until(stream, b"event: response.output_text.delta", count=3)
        async with httpx.AsyncClient(base_url=ranks.base_url, timeout=60) as http:
            while True:  # a bounded poll of the other rank's figures
                health = (await http.get("/health")).json()
                batches = [r["batch_sequences"] for r in health["distributed"]["ranks"]]
                if health["batch"]["sequences_cancelled"] >= 1 and batches == [0, 0]:
                    break
                await trio.sleep(0.05)
    assert health["distributed"]["broadcast"]["diverged"] == 0
