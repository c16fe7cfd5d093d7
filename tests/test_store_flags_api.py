"""The store flags end to end: the real server and model under small budgets, and the CLI.

Each HTTP test starts its own server (``serve``) with the limits under test and creates real
responses through ``POST /v1/responses``; what a user notices is which ids ``GET`` still finds.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import trio

from mlx_responses.cli import SERVE_FLAGS, build_parser, settings_from_args
from mlx_responses.server import ServerHandle, serve
from mlx_responses.storage.interface import StoreLimits

from .conftest import MODEL, START_DEADLINE, server_settings

SCRIPT = Path(sys.executable).with_name("mlx-responses")
DEADLINE = 60
BIG = 1 << 30

# Spec 000, Storage Flags: (flag, env var, default).
STORE_FLAGS = (
    ("--responses-store-max-entries", "LLAMA_ARG_RESPONSES_STORE_MAX_ENTRIES", 1024),
    ("--responses-store-max-bytes", "MLXCEL_RESPONSES_STORE_MAX_BYTES", 268435456),
    ("--responses-store-ttl-secs", "LLAMA_ARG_RESPONSES_STORE_TTL_SECS", 3600),
    ("--conversation-store-max-entries", "LLAMA_ARG_CONVERSATION_STORE_MAX_ENTRIES", 256),
    ("--conversation-store-max-bytes", "MLXCEL_CONVERSATION_STORE_MAX_BYTES", 67108864),
    ("--conversation-store-ttl-secs", "LLAMA_ARG_CONVERSATION_STORE_TTL_SECS", 3600),
)


async def start_server(nursery: trio.Nursery, responses_store: StoreLimits) -> ServerHandle:
    settings = dataclasses.replace(server_settings(), responses_store=responses_store)
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    return handle


async def create(http: httpx.AsyncClient) -> dict[str, Any]:
    reply = await http.post(
        "/v1/responses",
        json={
            "model": MODEL,
            "input": "Reply with: hello",
            "temperature": 0,
            "max_output_tokens": 4,
        },
    )
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    assert body["status"] in ("completed", "incomplete")
    return body


async def readable(http: httpx.AsyncClient, response_id: str) -> bool:
    """Whether GET finds the response (each GET refreshes its recency)."""
    reply = await http.get(f"/v1/responses/{response_id}")
    assert reply.status_code in (200, 404), reply.text
    return reply.status_code == 200


async def test_entry_limit_evicts_least_recently_used_responses(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, StoreLimits(max_entries=2, max_bytes=BIG, ttl_seconds=0))
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            first, second, third = [await create(http) for _ in range(3)]
            assert not await readable(http, first["id"])
            missing = await http.get(f"/v1/responses/{first['id']}")
            assert missing.json()["error"]["param"] == "response_id"
            fetched = await http.get(f"/v1/responses/{second['id']}")
            assert fetched.json() == second  # also makes the 2nd the most recent
            assert await readable(http, third["id"])
            assert await readable(http, second["id"])  # read after the 3rd: the 3rd is LRU
            fourth = await create(http)
            assert not await readable(http, third["id"])
            assert await readable(http, second["id"])
            assert await readable(http, fourth["id"])
    assert server.store.statistics().entries == 2


async def test_small_byte_budget_keeps_only_what_fits(nursery: trio.Nursery) -> None:
    # The size of one stored response, as the store charges it, from a server without limits.
    probe = await start_server(nursery, StoreLimits(max_entries=10, max_bytes=BIG, ttl_seconds=0))
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(base_url=probe.base_url, timeout=30) as http:
            await create(http)
    size = probe.store.statistics().bytes
    assert size > 0
    probe.shutdown()

    budget = size * 5 // 2  # room for two, not three
    server = await start_server(
        nursery, StoreLimits(max_entries=10, max_bytes=budget, ttl_seconds=0)
    )
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            ids = [(await create(http))["id"] for _ in range(3)]
            assert [await readable(http, i) for i in ids] == [False, True, True]
    stats = server.store.statistics()
    assert stats.bytes <= budget
    assert (stats.entries, stats.evictions) == (2, 1)


async def test_max_bytes_zero_creates_but_keeps_nothing(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, StoreLimits(max_entries=1024, max_bytes=0, ttl_seconds=0))
    assert server.store.enabled
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            body = await create(http)
            assert body["output"], "the response itself is returned as usual"
            assert not await readable(http, body["id"])
    assert server.store.statistics().entries == 0


# -- the command line ----------------------------------------------------------------------------


def test_help_lists_the_store_flags_with_their_environment_variables() -> None:
    out = subprocess.run(
        [str(SCRIPT), "serve", "--help"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    flat = " ".join(out.split())
    for name, env, default in STORE_FLAGS:
        assert name in out
        assert env in out
        assert f"[env: {env}] (default: {default})" in flat
    assert {name for name, _, _ in STORE_FLAGS} <= {flag.name for flag in SERVE_FLAGS}


def test_defaults_are_spec_000s() -> None:
    settings = settings_from_args(build_parser({}).parse_args(["serve"]))
    assert settings.responses_store == StoreLimits(1024, 268435456, 3600)
    assert settings.conversation_store == StoreLimits(256, 67108864, 3600)


def test_environment_sets_store_flags_and_the_command_line_wins() -> None:
    env = {env: str(i + 1) for i, (_, env, _) in enumerate(STORE_FLAGS)}
    settings = settings_from_args(build_parser(env).parse_args(["serve"]))
    assert settings.responses_store == StoreLimits(1, 2, 3)
    assert settings.conversation_store == StoreLimits(4, 5, 6)
    args = build_parser(env).parse_args(["serve", "--responses-store-max-bytes", "0"])
    assert settings_from_args(args).responses_store == StoreLimits(1, 0, 3)


@pytest.mark.parametrize(("name", "env", "_default"), STORE_FLAGS)
def test_a_negative_store_flag_stops_start_up(name: str, env: str, _default: int) -> None:
    with pytest.raises(SystemExit, match=name):
        settings_from_args(build_parser({}).parse_args(["serve", f"{name}=-1"]))
    with pytest.raises(SystemExit, match=name):
        settings_from_args(build_parser({env: "-5"}).parse_args(["serve"]))


def test_a_non_integer_environment_value_stops_start_up() -> None:
    with pytest.raises(SystemExit):
        build_parser({"LLAMA_ARG_RESPONSES_STORE_TTL_SECS": "soon"})
