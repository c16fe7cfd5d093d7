"""Cheap refusals stay cheap: an unfittable 24 MiB body is refused ``context_length_exceeded``
before it is tokenized, with resident memory growth a small multiple of the body."""

from __future__ import annotations

import json

import httpx2 as httpx
import trio

from mlx_responses.server import ServerHandle

from .conftest import MODEL
from .memory import PeakGrowth

DEADLINE = 120
MIB = 1024 * 1024


def state(server: ServerHandle) -> tuple[int, ...]:
    return (
        server.store.statistics().entries,
        server.conversations.statistics().entries,
        server.responses.statistics().jobs_started,
        server.model.statistics().sequences_finished,
    )


async def test_a_24_mib_unfittable_body_is_refused_in_bounded_memory(server: ServerHandle) -> None:
    # One long word: the input that made the tokenizer's memory explode.
    body = json.dumps({"model": MODEL, "instructions": "x" * (24 * MIB), "input": "hi"}).encode()
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            before = state(server)
            with PeakGrowth() as growth:
                reply = await http.post(
                    "/v1/responses", content=body, headers={"content-type": "application/json"}
                )
            assert reply.status_code == 400, reply.text[:300]
            error = reply.json()["error"]
            assert (error["code"], error["param"]) == ("context_length_exceeded", "input")
            assert "context window of 2048 tokens" in error["message"]
            assert state(server) == before
            # Client and server share this process: the body, its decoded text and the
            # rendered prompt are each ~24 MiB. Tokenizing it took ~100 times the body.
            assert growth.bytes < 10 * len(body), growth.bytes // MIB
            ok = await http.post(
                "/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2}
            )
            assert ok.status_code == 200


async def test_a_prompt_just_inside_the_window_is_still_admitted(server: ServerHandle) -> None:
    # ~1900 tokens of ordinary text: over the bound's cheap estimate is no reason to refuse.
    words = " ".join(f"w{i % 10}" for i in range(900))
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            counted = await http.post(
                "/v1/responses/input_tokens", json={"model": MODEL, "input": words}
            )
            tokens = counted.json()["input_tokens"]
            assert 1000 < tokens < 2047, tokens
            reply = await http.post(
                "/v1/responses", json={"model": MODEL, "input": words, "max_output_tokens": 1}
            )
            assert reply.status_code == 200, reply.text[:300]
