"""Stream replay from compact records: ``GET /v1/responses/{id}?stream=true`` gives the live
stream back event for event (types, ids, sequence numbers, deltas, logprobs, snapshots),
though the store keeps only the final object and a tape of the delta boundaries."""

from __future__ import annotations

from typing import Any

import httpx2 as httpx
import pytest
import trio

from mlx_responses.engine.bundled_model import load_bundled_prompts
from mlx_responses.server import ServerHandle
from tests.conformance import assert_stream_invariants, parse_sse

from .conftest import MODEL

DEADLINE = 90
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    **next(p for p in load_bundled_prompts() if p.name == "tool_call").tools[0]["function"],  # type: ignore[index]
}


def _prompt(name: str) -> str:
    return str(next(p for p in load_bundled_prompts() if p.name == name).messages[-1]["content"])


BODIES: dict[str, dict[str, Any]] = {
    "text with logprobs": {
        "input": _prompt("count"),
        "top_logprobs": 2,
        "include": ["message.output_text.logprobs"],
    },
    "reasoning": {"input": _prompt("think")},
    "tool call": {"input": _prompt("tool_call"), "tools": [WEATHER_TOOL]},
    "incomplete": {"input": _prompt("count"), "max_output_tokens": 5},
}


async def _post_stream(http: httpx.AsyncClient, body: dict[str, Any]) -> list[Any]:
    full = {"model": MODEL, "temperature": 0, **body, "stream": True}
    async with http.stream("POST", "/v1/responses", json=full) as reply:
        assert reply.status_code == 200, await reply.aread()
        raw = b"".join([chunk async for chunk in reply.aiter_bytes()])
    return parse_sse(raw)


async def _replay(http: httpx.AsyncClient, response_id: str, after: int | None = None) -> list[Any]:
    query = "stream=true" + ("" if after is None else f"&starting_after={after}")
    reply = await http.get(f"/v1/responses/{response_id}?{query}")
    assert reply.status_code == 200
    return parse_sse(reply.content)


@pytest.mark.parametrize("case", list(BODIES))
async def test_replay_equals_the_live_stream(server: ServerHandle, case: str) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            live = await _post_stream(http, BODIES[case])
            final = assert_stream_invariants(live)
            replayed = await _replay(http, final["id"])
            assert replayed == live
            middle = len(live) // 2
            assert await _replay(http, final["id"], middle) == live[middle + 1 :]
    kinds = {name for name, _ in live}
    expected = {
        "text with logprobs": "response.output_text.delta",
        "reasoning": "response.reasoning_text.delta",
        "tool call": "response.function_call_arguments.done",
        "incomplete": "response.incomplete",
    }[case]
    assert expected in kinds
    if case == "text with logprobs":
        assert any(data.get("logprobs") for name, data in live if name.endswith(".delta"))


async def test_background_replay_equals_its_live_follow(server: ServerHandle) -> None:
    body = {"model": MODEL, "input": _prompt("count"), "temperature": 0, "background": True}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            created = (await http.post("/v1/responses", json=body)).json()
            live = await _replay(http, created["id"])  # follows the running job to its end
            assert live[-1][0] == "response.completed"
            assert await _replay(http, created["id"]) == live


async def test_the_store_keeps_a_tape_not_the_events(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            live = await _post_stream(http, BODIES["text with logprobs"])
            record = await server.store.get(live[-1][1]["response"]["id"])
    assert record is not None
    assert record.replay is not None
    assert record.literal_events == ()
    assert [e["sequence_number"] for e in record.events] == list(range(len(live)))
