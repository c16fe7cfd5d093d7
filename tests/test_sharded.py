"""The bundled model split by tensors over 2 ranks (ring backend, loopback) answers as one
process does (issue 26): the documented prompts' greedy text, streamed and not; concurrent
streams with one cancelled; a prompt-cache hit; a forced tool call; a stop sequence; and a
shutdown after which every rank exits 0 having taken exactly the steps rank 0 took.

One sharded server serves the whole module (2 cores); the last test shuts it down.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2 as httpx
import pytest
import trio
from openai import AsyncOpenAI

from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH, load_bundled_prompts
from tests.conformance import assert_stream_invariants, assert_strict_response, parse_sse

from .conftest import MODEL, output_text, split_reasoning
from .rawhttp import open_stream, read_until
from .sharded import Ranks, start_ranks

DEADLINE = 120
PROMPTS = {p.name: p for p in load_bundled_prompts()}
GREEDY = ["hello_with_system", "capital", "think", "json_cat", "multi_turn"]
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        # Finite by construction: a tiny model forced off its training may ramble in a
        # free string past the output limit (unterminated arguments).
        "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ranks]:
    started = start_ranks(BUNDLED_MODEL_PATH, tmp_path_factory.mktemp("sharded"), "--alias", MODEL)
    try:
        yield started
    finally:
        started.close()


def messages(name: str) -> list[dict[str, Any]]:
    return [{"role": m["role"], "content": m["content"]} for m in PROMPTS[name].messages]


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


@pytest.mark.parametrize("name", GREEDY)
async def test_documented_prompt_gives_the_single_process_greedy_text(
    ranks: Ranks, name: str
) -> None:
    # prompts.json holds what one process answers (tests/test_bundled_prompts_api.py).
    prompt = PROMPTS[name]
    async with httpx.AsyncClient(base_url=ranks.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            reply = await http.post(
                "/v1/responses",
                json={
                    "model": MODEL,
                    "input": messages(name),
                    "temperature": 0,
                    "max_output_tokens": prompt.expected_tokens + 20,
                },
            )
    data = reply.json()
    assert_strict_response(data)
    assert data["status"] == "completed"
    assert output_text(data) == split_reasoning(prompt.expected)[1]
    assert data["usage"]["output_tokens"] == prompt.expected_tokens


async def test_a_long_streamed_answer_is_the_single_process_text(ranks: Ranks) -> None:
    prompt = PROMPTS["count"]
    raw = b""
    async with httpx.AsyncClient(base_url=ranks.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            async with http.stream(
                "POST",
                "/v1/responses",
                json={
                    "model": MODEL,
                    "input": messages("count"),
                    "temperature": 0,
                    "max_output_tokens": prompt.expected_tokens + 20,
                    "stream": True,
                },
            ) as reply:
                async for chunk in reply.aiter_bytes():
                    raw += chunk
    final = assert_stream_invariants(parse_sse(raw))
    assert final["status"] == "completed"
    assert output_text(final) == prompt.expected
    assert final["usage"]["output_tokens"] == prompt.expected_tokens


async def test_a_replayed_unstored_prompt_hits_the_prefix_cache_with_the_same_text(
    ranks: Ranks,
) -> None:
    # The documented multi-turn conversation, replayed turn by turn without storing: its
    # second request reuses the first one's cache (decided on rank 0, held on every rank).
    client = AsyncOpenAI(base_url=f"{ranks.base_url}/v1", api_key="x", max_retries=0)
    turns = messages("multi_turn")
    async with client:
        with trio.fail_after(DEADLINE):
            first = await client.responses.create(
                model=MODEL,
                input=turns[:1],  # type: ignore[arg-type]
                temperature=0,
                store=False,
            )
            second = await client.responses.create(
                model=MODEL,
                input=turns,  # type: ignore[arg-type]
                temperature=0,
                store=False,
            )
    assert first.output_text == turns[1]["content"]
    assert second.output_text == PROMPTS["multi_turn"].expected
    assert second.usage is not None
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached > 0
    # Rank 0 decided the hit; rank 1 served the same prefix from its shard of the entry: each
    # rank's count of prompt tokens its cache served reaches rank 0 in the headers (the
    # follower's one exchange late: rank 0's heartbeat as it falls idle brings it).
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(base_url=ranks.base_url, timeout=60) as http:
            while True:  # a bounded poll of another process's figures
                health = (await http.get("/health")).json()["distributed"]
                served = [r["prompt_cache_tokens_reused"] for r in health["ranks"]]
                if served[0] >= cached and served[1] == served[0]:
                    break
                await trio.sleep(0.05)
    assert health["broadcast"]["diverged"] == 0


async def test_a_forced_tool_call_and_a_stop_sequence(ranks: Ranks) -> None:
    async with httpx.AsyncClient(base_url=ranks.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            reply = await http.post(
                "/v1/responses",
                json={
                    "model": MODEL,
                    "input": "Reply with: hello",
                    "tools": [WEATHER_TOOL],
                    "tool_choice": "required",
                    "temperature": 0,
                },
            )
    (call,) = [item for item in reply.json()["output"] if item["type"] == "function_call"]
    assert call["name"] == "get_weather"
    assert set(json.loads(call["arguments"])) == {"city"}

    client = anthropic.AsyncAnthropic(base_url=ranks.base_url, api_key="x", max_retries=0)
    with trio.fail_after(DEADLINE):
        message = await client.messages.create(
            model=MODEL,
            max_tokens=400,
            messages=messages("count"),  # type: ignore[arg-type]
            stop_sequences=[" 12 "],
            extra_body={"temperature": 0},
        )
    await client.close()
    assert message.stop_reason == "stop_sequence"
    assert message.stop_sequence == " 12 "
    assert message.content[0].text == "1 2 3 4 5 6 7 8 9 10 11"  # type: ignore[union-attr]


async def _stream(base_url: str, hang_up: bool) -> dict[str, Any] | None:
    """One streamed "count" answer; with ``hang_up``, the client leaves mid-decode.

    It leaves after its second delta: deltas are paced (``actors.pacing``, 70 ms apart with four
    streams decoding), so waiting for more would leave on a slow machine as the answer ends,
    with no step after the cancel left to check."""
    body = {"model": MODEL, "input": messages("count"), "temperature": 0, "stream": True}
    if hang_up:
        async with await open_stream(base_url, "/v1/responses", body) as stream:
            await read_until(stream, b"event: response.output_text.delta", count=2)
        return None
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        reply = await http.post("/v1/responses", json=body)
    return assert_stream_invariants(parse_sse(reply.content))


def rank_batches(metrics: str) -> list[tuple[int, int]]:
    """Every rank's (steps, batch sequences) as rank 0 last heard them, from /metrics."""
    return [
        (
            int(metric(metrics, f'mlx_responses_distributed_rank_steps_total{{rank="{r}"}}')),
            int(metric(metrics, f'mlx_responses_distributed_rank_batch_sequences{{rank="{r}"}}')),
        )
        for r in (0, 1)
    ]


async def test_the_last_stream_hung_up_leaves_every_rank_s_batch_at_once(ranks: Ranks) -> None:
    # Its cancel empties rank 0's batch, so no step follows to carry it: rank 0 sends it as it
    # falls idle, with a heartbeat that brings back every rank's emptied batch.
    with trio.fail_after(DEADLINE):
        await _stream(ranks.base_url, hang_up=True)
        async with httpx.AsyncClient(base_url=ranks.base_url, timeout=60) as http:
            while True:  # a bounded poll of another process's figures
                seen = rank_batches((await http.get("/metrics")).text)
                if all(batch == 0 for _, batch in seen):
                    break
                await trio.sleep(0.05)
            health = (await http.get("/health")).json()
    assert seen[1] == seen[0]
    steps = health["distributed"]["broadcast"]["steps"]
    assert [(r["steps"], r["batch_sequences"]) for r in health["distributed"]["ranks"]] == [
        (steps, 0),
        (steps, 0),
    ]


async def test_concurrent_streams_one_cancelled_then_every_rank_stopped_in_step(
    ranks: Ranks,
) -> None:
    finals: list[dict[str, Any] | None] = []
    # (cancelled so far, every rank's (steps, batch)) each time /metrics was read.
    samples: list[tuple[float, list[tuple[int, int]]]] = []
    streams_done = trio.Event()

    async def run(hang_up: bool) -> None:
        finals.append(await _stream(ranks.base_url, hang_up))

    async def watch(http: httpx.AsyncClient) -> None:
        # A bounded poll of another process's figures (the test's deadline bounds it): it
        # ends once the streams are over and every rank reports an empty batch.
        while True:
            metrics = (await http.get("/metrics")).text
            seen = rank_batches(metrics)
            cancelled = metric(metrics, 'mlx_responses_sequences_ended_total{reason="cancelled"}')
            samples.append((cancelled, seen))
            if streams_done.is_set() and all(batch == 0 for _, batch in seen):
                return
            await trio.sleep(0.05)

    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(base_url=ranks.base_url, timeout=60) as http:
            before = metric(
                (await http.get("/metrics")).text,
                'mlx_responses_sequences_ended_total{reason="cancelled"}',
            )
            async with trio.open_nursery() as outer:
                outer.start_soon(watch, http)
                async with trio.open_nursery() as nursery:
                    for hang_up in (False, False, True, False):
                        nursery.start_soon(run, hang_up)
                streams_done.set()
            metrics = (await http.get("/metrics")).text
            health = (await http.get("/health")).json()
            status = (await http.get("/status")).json()
    # Every rank's batch is visible on rank 0 while it runs, and equal to rank 0's at every
    # exchange (the ranks stepped in lockstep: a difference would be counted).
    assert any(batch > 0 for _, seen in samples for _, batch in seen), samples
    for _, seen in samples:
        assert seen[1] == seen[0], samples
    assert metric(metrics, "mlx_responses_distributed_diverged_exchanges_total") == 0
    # The hung-up sequence leaves every rank's batch within one step: the figures arrive one
    # exchange late, so the step after the one rank 0 was at when it counted the cancel is the
    # first taken without it, and from then on no rank holds all four.
    first = next(i for i, (cancelled, _) in enumerate(samples) if cancelled > before)
    cancel_step = samples[first][1][0][0]
    later = [seen for _, seen in samples[first:] if seen[0][0] >= cancel_step + 2]
    assert later, samples
    for seen in later:
        assert all(batch <= 3 for _, batch in seen), samples
    # Once every stream has ended, every rank's batch is empty, each at rank 0's last step.
    steps = health["distributed"]["broadcast"]["steps"]
    for rank in health["distributed"]["ranks"]:
        assert (rank["steps"], rank["batch_sequences"]) == (steps, 0), health
    assert status["server"]["distributed"]["ranks"][1]["batch_sequences"] == 0
    done = [final for final in finals if final is not None]
    assert len(done) == 3
    for final in done:
        assert output_text(final) == PROMPTS["count"].expected
    assert metric(metrics, 'mlx_responses_sequences_ended_total{reason="cancelled"}') > before
    assert health["distributed"]["size"] == 2
    assert [r["rank"] for r in health["distributed"]["ranks"]] == [0, 1]
    # Visible: the ranks, the mode, the backend and each rank's memory.
    assert metric(metrics, 'mlx_responses_distributed_rank_memory_bytes{rank="1"}') > 0
    ranks_line = 'mlx_responses_distributed_ranks{backend="ring",mode="tensor",state="ok"}'
    assert metric(metrics, ranks_line) == 2
    assert metric(metrics, "mlx_responses_distributed_broadcast_bytes_total") > 0
    assert "sharded over 2 ranks (tensor parallel, ring)" in json.dumps(status)

    # Shutdown: every rank exits 0, and rank 1 took exactly rank 0's steps and ended alike.
    codes = ranks.stop(DEADLINE)
    assert codes == [0, 0], ranks.log(0) + ranks.log(1)
    stepped = re.search(r"rank 1: rank 0 shut down after (\d+) steps", ranks.log(1))
    assert stepped, ranks.log(1)
    assert int(stepped.group(1)) == health["distributed"]["broadcast"]["steps"] > 0
    followed = re.search(
        r"rank 1: (\d+) tokens generated, \d+ sequences finished, (\d+) cancelled", ranks.log(1)
    )
    assert followed, ranks.log(1)
    assert int(followed.group(1)) == metric(metrics, "mlx_responses_generated_tokens_total")
    assert int(followed.group(2)) == metric(
        metrics, 'mlx_responses_sequences_ended_total{reason="cancelled"}'
    )
    assert "sharded over 2 ranks (tensor parallel, ring)" in ranks.log(0)
