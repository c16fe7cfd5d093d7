"""Codex CLI's real request body (0.169.0, captured from `codex exec` with one MCP server, see
tests/fixtures/) replayed against the server: client_metadata, a namespace tool, web_search,
store: false with include reasoning.encrypted_content, parallel tool calls, reasoning summary."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import httpx2 as httpx
import trio

from mlx_responses.server import ServerHandle, serve
from tests.conformance import assert_stream_invariants, parse_sse

from .conftest import START_DEADLINE, server_settings

DEADLINE = 60
FIXTURE = Path(__file__).parent / "fixtures" / "codex-0.169.0-mcp-turn.json"
# Codex's smallest prompt is about 2,100 tokens of the bundled model's small vocabulary, more
# than its 2,048-token window: the replay runs with a bigger window (generation stays short).
CONTEXT = 4096


def codex_body() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(FIXTURE.read_text())
    # The only change: a short, greedy answer (Codex sends neither key).
    return {**body, "max_output_tokens": 16, "temperature": 0}


async def start(nursery: trio.Nursery, *, drop: bool) -> ServerHandle:
    settings = server_settings(context_size=CONTEXT)
    settings = dataclasses.replace(settings, drop_unsupported_tools=drop)
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    return handle


def test_the_fixture_is_what_codex_sends() -> None:
    body = json.loads(FIXTURE.read_text())
    assert body["store"] is False
    assert body["stream"] is True
    assert body["include"] == ["reasoning.encrypted_content"]
    assert "client_metadata" in body
    kinds = [tool["type"] for tool in body["tools"]]
    assert "namespace" in kinds
    assert "web_search" in kinds


async def test_codex_turn_streams_strictly_under_drop(nursery: trio.Nursery) -> None:
    server = await start(nursery, drop=True)
    headers = {"accept": "text/event-stream", "originator": "codex_exec"}
    with trio.fail_after(DEADLINE):
        async with (
            httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http,
            http.stream("POST", "/v1/responses", json=codex_body(), headers=headers) as reply,
        ):
            assert reply.status_code == 200
            raw = b"".join([c async for c in reply.aiter_bytes()])
    events = parse_sse(raw)
    assert_stream_invariants(events)
    final = events[-1][1]["response"]
    assert final["store"] is False
    (namespace,) = [tool for tool in final["tools"] if tool["type"] == "namespace"]
    assert namespace["name"] == "mcp__weather"
    assert all(tool["type"] != "web_search" for tool in final["tools"])


async def test_without_drop_the_only_refusal_names_web_search(nursery: trio.Nursery) -> None:
    server = await start(nursery, drop=False)
    body = codex_body()
    index = next(i for i, tool in enumerate(body["tools"]) if tool["type"] == "web_search")
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            refused = await http.post("/v1/responses", json=body)
            body["tools"] = [tool for tool in body["tools"] if tool["type"] != "web_search"]
            accepted = await http.post("/v1/responses", json={**body, "stream": False})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == f"tools[{index}].type"
    assert "web_search" in error["message"]
    assert accepted.status_code == 200, accepted.text


TOOL_RESULT = Path(__file__).parent / "fixtures" / "codex-0.169.0-mcp-tool-result.json"


async def test_codex_follow_up_with_the_namespaced_call_and_its_output(
    nursery: trio.Nursery,
) -> None:
    # Codex's second request of an MCP round trip (captured): the whole history again, the
    # function_call with `namespace`, the function_call_output as content parts ("Wall time").
    body: dict[str, Any] = json.loads(TOOL_RESULT.read_text())
    kinds = [item.get("type") for item in body["input"]]
    assert kinds[-2:] == ["function_call", "function_call_output"]
    assert body["input"][-2]["namespace"] == "mcp__weather"
    server = await start(nursery, drop=True)
    with trio.fail_after(DEADLINE):
        async with (
            httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http,
            http.stream(
                "POST",
                "/v1/responses",
                json={**body, "max_output_tokens": 16, "temperature": 0},
            ) as reply,
        ):
            assert reply.status_code == 200
            raw = b"".join([c async for c in reply.aiter_bytes()])
    final = assert_stream_invariants(parse_sse(raw))
    assert final["status"] in ("completed", "incomplete")
