"""Streaming: the SDK's strict helper, raw SSE validated event by event, hang-ups, concurrency."""

from __future__ import annotations

from typing import Any

import httpx2 as httpx
import trio
from openai import AsyncOpenAI

from mlx_responses.engine.bundled_model import load_bundled_prompts
from mlx_responses.server import ServerHandle, serve
from tests.conformance import assert_stream_invariants, assert_strict_response, parse_sse

from .conftest import (
    MODEL,
    START_DEADLINE,
    assert_nothing_more_generated,
    output_text,
    server_settings,
    split_reasoning,
    wait_until,
)
from .rawhttp import open_stream, read_until

DEADLINE = 90


def user_prompts() -> list[tuple[str, str]]:
    """(user text, expected answer) for every documented prompt that is one user message."""
    return [
        (p.messages[0]["content"], split_reasoning(p.expected)[1])
        for p in load_bundled_prompts()
        if len(p.messages) == 1 and not p.tools
    ]


def prompt(name: str) -> tuple[str, str]:
    for p in load_bundled_prompts():
        if p.name == name:
            return p.messages[-1]["content"], p.expected
    raise KeyError(name)


async def post_stream(
    http: httpx.AsyncClient, body: dict[str, Any]
) -> list[tuple[str, dict[str, Any]]]:
    async with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        raw = b"".join([chunk async for chunk in reply.aiter_bytes()])
    return parse_sse(raw)


async def test_sdk_stream_helper_final_text_equals_joined_deltas(client: AsyncOpenAI) -> None:
    text, expected = prompt("hello")
    deltas: list[str] = []
    with trio.fail_after(DEADLINE):
        async with client.responses.stream(
            model=MODEL, input=text, temperature=0, max_output_tokens=64
        ) as stream:
            async for event in stream:
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
            final = await stream.get_final_response()
    assert "".join(deltas) == final.output_text == expected
    assert final.status == "completed"


async def test_raw_stream_is_strictly_valid_and_matches_get(server: ServerHandle) -> None:
    text, expected = prompt("count")
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            events = await post_stream(
                http, {"model": MODEL, "input": text, "temperature": 0, "max_output_tokens": 1000}
            )
            final = assert_stream_invariants(events)
            types = [name for name, _ in events]
            assert types[:2] == ["response.created", "response.in_progress"]
            assert types[-1] == "response.completed"
            assert types.count("response.output_text.delta") > 1
            assert final["output"][0]["content"][0]["text"] == expected
            stored = (await http.get(f"/v1/responses/{final['id']}")).json()
    assert stored == final
    assert_strict_response(stored)


async def test_stream_stopped_by_max_output_tokens_is_incomplete(server: ServerHandle) -> None:
    text, _ = prompt("count")
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            events = await post_stream(
                http, {"model": MODEL, "input": text, "temperature": 0, "max_output_tokens": 7}
            )
    final = assert_stream_invariants(events)
    assert events[-1][0] == "response.incomplete"
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["usage"]["output_tokens"] == 7


async def test_disconnect_mid_stream_removes_the_sequence_from_the_batch(
    server: ServerHandle,
) -> None:
    text, _ = prompt("count")
    model = server.model
    body = {"model": MODEL, "input": text, "temperature": 0, "stream": True}
    with trio.fail_after(DEADLINE):
        async with await open_stream(server.base_url, "/v1/responses", body) as stream:
            await read_until(stream, b"event: response.output_text.delta", count=3)
            assert model.statistics().active == 1
        # The client hung up. The sequence must leave the batch, not run to its end.
        await model.wait_idle()
    stats = model.statistics()
    assert stats.sequences_cancelled == 1
    assert stats.sequences_finished == 0
    # Nothing half-stored for the abandoned response.
    assert server.store.statistics().entries == 0
    await assert_nothing_more_generated(server, stats.tokens_generated)


async def test_disconnect_during_prefill_leaves_after_the_current_chunk(
    nursery: Any,
) -> None:
    # Chunks of 4 tokens make a long prompt take many steps to prefill.
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, server_settings(prefill_step_size=4))
    long_input = "Reply with: hello. " * 150
    model = handle.model
    body = {"model": MODEL, "input": long_input, "stream": True}
    with trio.fail_after(DEADLINE):
        async with await open_stream(handle.base_url, "/v1/responses", body) as stream:
            await read_until(stream, b"event: response.in_progress")
            # Wait until the thread is prefilling it, then hang up.
            await wait_until(lambda: model.statistics().prompt_tokens_processed > 0)
            stats = model.statistics()
            assert stats.active == 1
            assert stats.tokens_generated == 0
        await model.wait_idle()
    stats = model.statistics()
    assert stats.sequences_cancelled == 1
    assert stats.tokens_generated == 0
    # Far fewer prompt tokens were processed than the prompt holds: it stopped mid-prefill.
    assert stats.prompt_tokens_processed < 600


async def test_eight_concurrent_streams_equal_their_solo_outputs(server: ServerHandle) -> None:
    prompts = user_prompts()
    assert len(prompts) >= 3
    chosen = [prompts[i % len(prompts)] for i in range(8)]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:

        async def run(text: str) -> dict[str, Any]:
            events = await post_stream(
                http, {"model": MODEL, "input": text, "temperature": 0, "max_output_tokens": 1000}
            )
            return assert_stream_invariants(events)

        with trio.fail_after(DEADLINE):
            solo = {text: await run(text) for text, _ in prompts}
            results: list[dict[str, Any] | None] = [None] * 8

            async def one(i: int, text: str) -> None:
                results[i] = await run(text)

            async with trio.open_nursery() as n:
                for i, (text, _) in enumerate(chosen):
                    n.start_soon(one, i, text)
    for (text, expected), result in zip(chosen, results, strict=True):
        assert result is not None
        assert result["output"] != []
        assert output_text(result) == output_text(solo[text]) == expected
    stats = server.model.statistics()
    assert stats.active == 0
    # They shared the running batch rather than queueing one after another.
    assert stats.peak_decoding >= 4


def shape(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """A stream's event types, each run of text deltas as one entry (how many deltas a run of
    text arrives in follows the batch's timing, on an unloaded server too)."""
    out: list[str] = []
    for name, _ in events:
        if not (name.endswith(".delta") and out and out[-1] == name):
            out.append(name)
    return out


async def test_sixteen_streams_under_load_equal_their_unloaded_streams(
    server: ServerHandle,
) -> None:
    """16 streams at once: the SSE writer joins pending events into fewer writes (issue 12);
    every stream is still strictly valid event by event, numbered without a gap, and carries
    the same events and text as the same request alone."""
    prompts = user_prompts()
    chosen = [prompts[i % len(prompts)][0] for i in range(16)]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:

        async def run(text: str) -> list[tuple[str, dict[str, Any]]]:
            body = {"model": MODEL, "input": text, "temperature": 0, "max_output_tokens": 1000}
            return await post_stream(http, body)

        with trio.fail_after(DEADLINE):
            alone = {text: await run(text) for text, _ in prompts}
            loaded: list[list[tuple[str, dict[str, Any]]]] = [[] for _ in chosen]

            async def one(i: int, text: str) -> None:
                loaded[i] = await run(text)

            async with trio.open_nursery() as n:
                for i, text in enumerate(chosen):
                    n.start_soon(one, i, text)
    for text, events in zip(chosen, loaded, strict=True):
        final = assert_stream_invariants(events)  # strict, numbered 0..n-1, deltas join
        solo = alone[text]
        assert output_text(final) == output_text(assert_stream_invariants(solo))
        assert shape(events) == shape(solo)
        solo_usage = solo[-1][1]["response"]["usage"]
        for count in ("input_tokens", "output_tokens"):  # the cached share may differ
            assert final["usage"][count] == solo_usage[count]
    assert server.model.statistics().peak_decoding > 2  # the writers did coalesce
