"""``--background-key always`` (issue 28): every Response carries ``background``, false for a
foreground one, on every path a Response reaches a client; the default keeps spec 000's shape
(no key on a foreground Response)."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx2 as httpx
import trio

from mlx_responses.cli import build_parser, settings_from_args
from mlx_responses.server import ServerHandle, serve
from tests.conformance import assert_stream_invariants, assert_strict_response, parse_sse

from .conftest import MODEL, START_DEADLINE, server_settings

DEADLINE = 60
HELLO = {"model": MODEL, "input": "Reply with: hello", "temperature": 0}


async def start(nursery: trio.Nursery, *, always: bool) -> ServerHandle:
    settings = dataclasses.replace(server_settings(), background_key=always)
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    return handle


async def stream(http: httpx.AsyncClient, method: str, url: str, **kw: Any) -> list[Any]:
    async with http.stream(method, url, **kw) as reply:
        assert reply.status_code == 200
        return parse_sse(await reply.aread())


async def test_always_puts_background_false_on_every_foreground_response(
    nursery: trio.Nursery,
) -> None:
    server = await start(nursery, always=True)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            created = (await http.post("/v1/responses", json=HELLO)).json()
            events = await stream(http, "POST", "/v1/responses", json={**HELLO, "stream": True})
            streamed_id = events[-1][1]["response"]["id"]
            retrieved = (await http.get(f"/v1/responses/{streamed_id}")).json()
            replayed = await stream(http, "GET", f"/v1/responses/{streamed_id}?stream=true")
            job = (await http.post("/v1/responses", json={**HELLO, "background": True})).json()
    assert_strict_response(created, background_key=True)
    assert created["background"] is False
    final = assert_stream_invariants(events, background_key=True)
    snapshots = [data["response"] for _, data in events if "response" in data]
    assert snapshots
    assert all(snapshot["background"] is False for snapshot in snapshots)
    assert final["background"] is False
    assert retrieved["background"] is False
    assert all(
        data["response"]["background"] is False for _, data in replayed if "response" in data
    )
    assert job["background"] is True


async def test_by_default_a_foreground_response_has_no_background_key(
    nursery: trio.Nursery,
) -> None:
    server = await start(nursery, always=False)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            created = (await http.post("/v1/responses", json=HELLO)).json()
    assert "background" not in created


def test_the_flag_and_its_environment_variable() -> None:
    def parse(argv: list[str], env: dict[str, str]) -> bool:
        args = build_parser(env).parse_args(["serve", "--store", "memory", *argv])
        return settings_from_args(args).background_key

    assert parse([], {}) is False
    assert parse(["--background-key", "always"], {}) is True
    assert parse([], {"MLX_RESPONSES_BACKGROUND_KEY": "always"}) is True
    assert (
        parse(["--background-key", "omitted"], {"MLX_RESPONSES_BACKGROUND_KEY": "always"}) is False
    )
