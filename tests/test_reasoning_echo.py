"""The reasoning echo: a replayed plain reply renders with the reasoning it was generated with."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx2 as httpx
import trio

from mlx_responses.server import ServerHandle, serve

from .conftest import MODEL, START_DEADLINE, server_settings

DEADLINE = 60
QUESTION = "Think, then answer: what is 2 + 2?"


async def replay_counts(server: ServerHandle) -> tuple[int, int]:
    """Input tokens of the next turn with the reasoning item replayed, and without it."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            first = (
                await http.post(
                    "/v1/responses", json={"model": MODEL, "input": QUESTION, "temperature": 0}
                )
            ).json()
            assert [item["type"] for item in first["output"]] == ["reasoning", "message"]
            follow = {"role": "user", "content": "Reply with: hello"}
            full: list[dict[str, Any]] = [
                {"role": "user", "content": QUESTION},
                *first["output"],
                follow,
            ]
            without = [item for item in full if item.get("type") != "reasoning"]
            counts = []
            for items in (full, without):
                reply = await http.post(
                    "/v1/responses/input_tokens", json={"model": MODEL, "input": items}
                )
                counts.append(reply.json()["input_tokens"])
    return counts[0], counts[1]


async def test_a_reply_replayed_without_its_reasoning_gets_it_back(server: ServerHandle) -> None:
    with_reasoning, without_reasoning = await replay_counts(server)
    assert without_reasoning == with_reasoning


async def test_with_the_echo_disabled_the_reasoning_is_gone(nursery: trio.Nursery) -> None:
    settings = dataclasses.replace(server_settings(), reasoning_echo_max_bytes=0)
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, settings)
    with_reasoning, without_reasoning = await replay_counts(server)
    assert without_reasoning < with_reasoning
