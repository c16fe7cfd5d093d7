"""A response answered whole (``stream: false``) builds its events at most every 250 ms after its
first token (``actors/pacing.py``, ``answered_whole``), a streamed one every 25 ms at one stream.

What a user sees of it: following the running answer (``GET /v1/responses/{id}?stream=true``,
the id from the status data) gives the same text as the answer, in deltas no more often than
one per 250 ms tick. Generation is slowed by a sleep before each step (the real model and
batch, only slower: ``test_status_page.SlowSteps``), so the answer runs for seconds and a
streamed one on the same server has many more deltas than that bound allows, which shows the
bound is the pacing's and not the model's speed."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx2 as httpx
import trio

from mlx_responses.actors.pacing import MAX_INTERVAL_SECONDS

from .conftest import wait_until
from .test_status_page import COUNT, SlowSteps, start_server

DEADLINE = 120
STEP_SLEEP = 0.01  # 331 tokens: ~3.5 s


def most_deltas(seconds: float) -> int:
    """The most text deltas lingering on 250 ms ticks can make in ``seconds``: one per tick,
    the first token's and the finish's."""
    return int(seconds / MAX_INTERVAL_SECONDS) + 3


async def sse_deltas(reply: httpx.Response) -> list[str]:
    deltas = []
    async for line in reply.aiter_lines():
        if line.startswith("data: "):
            event = json.loads(line.removeprefix("data: "))
            if event["type"] == "response.output_text.delta":
                deltas.append(event["delta"])
    return deltas


async def test_an_answer_not_streamed_builds_its_deltas_at_most_every_250_ms(
    nursery: trio.Nursery,
) -> None:
    server = await start_server(nursery, SlowSteps(STEP_SLEEP))
    answer: dict[str, Any] = {}
    followed: list[str] = []
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):

            async def ask() -> None:
                started = time.monotonic()
                reply = await http.post("/v1/responses", json=COUNT)
                assert reply.status_code == 200, reply.text
                answer.update(reply.json(), seconds=time.monotonic() - started)

            async with trio.open_nursery() as asking:
                asking.start_soon(ask)
                await wait_until(lambda: server.model.statistics().tokens_generated > 0)
                running = (await http.get("/status")).json()["responses"]
                assert [r["kind"] for r in running] == ["foreground"]
                path = f"/v1/responses/{running[0]['id']}"
                async with http.stream("GET", path, params={"stream": "true"}) as reply:
                    assert reply.status_code == 200
                    followed = await sse_deltas(reply)

            started = time.monotonic()
            async with http.stream("POST", "/v1/responses", json={**COUNT, "stream": True}) as s:
                streamed = await sse_deltas(s)
            streamed_seconds = time.monotonic() - started

    text = answer["output"][0]["content"][0]["text"]
    assert answer["usage"]["output_tokens"] > 300
    assert "".join(followed) == text == "".join(streamed)
    assert len(followed) <= most_deltas(answer["seconds"])
    # The same answer streamed on the same server: a delta per 25 ms tick, far more.
    assert len(streamed) > 2 * most_deltas(streamed_seconds)
