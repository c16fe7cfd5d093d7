"""Forced hosted calls on every family's trained fixture: whatever the family's notation for a
call, a ``tool_choice`` naming ``web_search`` or an MCP server's tool makes the model call it
in that notation, the server parses it with the family's parser, runs it (a search of the
local index, a call to a real MCP server) and the response goes on to its end.

The forced tools are finite by construction (the search's bounded ``query``, the MCP server's
argument-less ``fail``), so "the call is valid and ends" is the grammar's promise, not the tiny
model's luck (``test_family_e2e.py`` says why)."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx2 as httpx
import pytest
import trio

from mlx_responses.server import ServerHandle, serve

from .conftest import MODEL, START_DEADLINE
from .mcp_servers import start_mcp_server
from .test_api_hosted_tools import hosted_settings
from .test_family_fixtures import FAMILIES, built

DEADLINE = 120
BUDGET = 1200  # room for the bounded reasoning a format may allow before a forced call


async def _start(nursery: trio.Nursery, family: str) -> ServerHandle:
    settings = hosted_settings()
    model = dataclasses.replace(settings.model, model_path=str(built(family)))
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(
            serve, dataclasses.replace(settings, model=model)
        )
    return server


def _the(output: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    calls = [item for item in output if item["type"] == kind]
    assert calls, [item["type"] for item in output]
    return calls[0]


@pytest.mark.parametrize("family", FAMILIES)
async def test_forced_hosted_calls_run_on_every_family(nursery: trio.Nursery, family: str) -> None:
    server = await _start(nursery, family)
    async with (
        start_mcp_server("streamable-http") as mcp,
        httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http,
    ):
        common = {"model": MODEL, "temperature": 0, "max_output_tokens": BUDGET}
        with trio.fail_after(DEADLINE):
            search = await http.post(
                "/v1/responses",
                json={
                    **common,
                    "input": "What is the capital of France?",
                    "tools": [{"type": "web_search"}],
                    "tool_choice": {"type": "web_search"},
                },
            )
            tool = {
                "type": "mcp",
                "server_label": "tools",
                "server_url": mcp.url,
                "require_approval": "never",
            }
            called = await http.post(
                "/v1/responses",
                json={
                    **common,
                    "input": "Break something.",
                    "tools": [tool],
                    "tool_choice": {"type": "mcp", "server_label": "tools", "name": "fail"},
                },
            )
    assert search.status_code == 200, search.text
    searched = _the(search.json()["output"], "web_search_call")
    # Run either way: a search of what the model asked, or a page it named that the index
    # does not hold (the model is told it failed).
    assert searched["status"] in ("completed", "failed"), searched
    assert searched["action"]["type"] in ("search", "open_page", "find_in_page")
    assert called.status_code == 200, called.text
    call = _the(called.json()["output"], "mcp_call")
    assert (call["name"], call["status"]) == ("fail", "failed")
    assert call["error"]["type"] == "mcp_tool_execution_error"
    for reply in (search, called):
        assert reply.json()["status"] in ("completed", "incomplete")
    assert server.model.statistics().active == 0
