"""Codex CLI 0.171.0 with its built-in `openai` provider (issue 28): the frames it sends over the
WebSocket, replayed against the real server with the bundled model.

The frames are Codex's own, captured from `codex exec` with `openai_base_url` pointed at the
server and the conformance profile (tests/fixtures/codex-0.171.0-ws-*.json): a `generate: false`
warm-up, the turn continuing it with `previous_response_id`, then the MCP tool's output. Every
frame carries `stream: true` and each input item Codex's
`internal_chat_message_metadata_passthrough`. Ids the server minted at capture time (the
previous response, the call id) are replaced by this run's.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import trio
import websockets.sync.client as ws_client
from websockets.exceptions import InvalidStatus

from mlx_responses.server import ServerHandle, serve
from tests.conformance import assert_stream_invariants, parse_sse

from .conftest import MODEL, START_DEADLINE, output_text, server_settings, wait_until
from .test_websocket import Event, in_thread, sdk, strict, until_terminal

FIXTURES = Path(__file__).parent / "fixtures"


def frame(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"codex-0.171.0-ws-{name}.json").read_text())
    return data


async def test_codex_builtin_provider_mcp_round_trip_over_the_socket(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    # Codex's frames name no temperature: served greedily (`--default-temperature 0`, as
    # docs/clients.md has a local model run for Codex), the bundled model's answers are its
    # documented ones; at the API's default of 1 it may sample another.
    settings = dataclasses.replace(server_settings(), default_temperature=0.0)
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, settings)
    caplog.set_level(logging.INFO, logger="mlx_responses.requests")
    warmup, turn, result = frame("mcp-warmup"), frame("mcp-turn"), frame("mcp-tool-result")
    assert warmup["stream"] is True
    assert warmup["generate"] is False
    assert "internal_chat_message_metadata_passthrough" in turn["input"][0]

    def run() -> tuple[list[Event], list[Event], list[Event]]:
        with sdk(server).responses.connect() as connection:
            connection.send(warmup)
            warm = until_terminal(connection)
            connection.send({**turn, "previous_response_id": warm[-1]["response"]["id"]})
            called = until_terminal(connection)
            call = next(
                item for item in called[-1]["response"]["output"] if item["type"] == "function_call"
            )
            output = [{**result["input"][0], "call_id": call["call_id"]}]
            connection.send(
                {**result, "input": output, "previous_response_id": called[-1]["response"]["id"]}
            )
            return warm, called, until_terminal(connection)

    warm, called, answered = await in_thread(run)
    assert strict(warm)["output"] == []
    calls = [item for item in strict(called)["output"] if item["type"] == "function_call"]
    assert [(c["namespace"], c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("mcp__weather", "get_weather", {"city": "Paris"})
    ]
    assert output_text(strict(answered)) == "It is sunny and 18 degrees in Paris."
    # The request log has a line per create (and the connection's open), as HTTP requests do.
    lines = [
        json.loads(r.getMessage().removeprefix("request "))
        for r in caplog.records
        if r.name == "mlx_responses.requests" and '"method":"WS"' in r.getMessage()
    ]
    creates = [line for line in lines if line["event"] == "response.create"]
    assert [(c["status"], c["response_status"], c["generate"]) for c in creates] == [
        (200, "completed", False),
        (200, "completed", True),
        (200, "completed", True),
    ]
    assert [c["response_id"] for c in creates] == [
        warm[-1]["response"]["id"],
        called[-1]["response"]["id"],
        answered[-1]["response"]["id"],
    ]
    assert [line["event"] for line in lines][:1] == ["open"]


async def test_stream_false_on_the_socket_is_refused_and_logged(
    server: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mlx_responses.requests")
    body = {"type": "response.create", "model": MODEL, "input": "Reply with: hello"}

    def run() -> tuple[list[Event], list[Event]]:
        with sdk(server).responses.connect() as connection:
            connection.send({**body, "stream": False})
            refused = until_terminal(connection)
            connection.send({**body, "stream": True, "temperature": 0})
            return refused, until_terminal(connection)

    refused, accepted = await in_thread(run)
    assert refused[-1]["type"] == "error"
    assert refused[-1]["error"]["param"] == "stream"
    assert output_text(strict(accepted)) == "hello"
    # The close is logged once the server has seen the client go: wait for it.

    def closes() -> list[str]:
        return [r.getMessage() for r in caplog.records if '"event":"close"' in r.getMessage()]

    with trio.move_on_after(30):
        await wait_until(lambda: bool(closes()))
    assert len(closes()) == 1


async def test_codex_passthrough_metadata_is_accepted_over_http(server: ServerHandle) -> None:
    turn = frame("mcp-turn")
    body = {k: v for k, v in turn.items() if k not in ("type", "previous_response_id")}
    body["stream"] = False
    body["store"] = True
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(60):
            reply = await http.post("/v1/responses", json=body)
            assert reply.status_code == 200, reply.text
            items = await http.get(f"/v1/responses/{reply.json()['id']}/input_items")
    assert items.status_code == 200
    listed = items.json()["data"]
    assert [item["role"] for item in listed] == ["user"]
    assert "internal_chat_message_metadata_passthrough" not in listed[0]  # not echoed


async def test_with_the_socket_off_the_upgrade_is_a_404_and_http_serves_codex(
    nursery: trio.Nursery,
) -> None:
    """`--websocket-max-connections 0`: the upgrade is a 404 (Codex falls back to HTTP on it),
    and Codex's HTTP request, the same body as its socket frame, is served."""
    settings = dataclasses.replace(server_settings(), websocket_max_connections=0)
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, settings)
    url = server.base_url.replace("http://", "ws://") + "/v1/responses"

    def upgrade() -> int:
        try:
            with ws_client.connect(url):
                return 101
        except InvalidStatus as refused:
            return refused.response.status_code

    assert await in_thread(upgrade) == 404
    turn = frame("mcp-turn")
    body = {k: v for k, v in turn.items() if k not in ("type", "previous_response_id")}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(60):
            async with http.stream("POST", "/v1/responses", json=body) as reply:
                assert reply.status_code == 200
                events = parse_sse(await reply.aread())
    assert assert_stream_invariants(events)["status"] == "completed"
