"""Codex CLI's real turns against the gpt-oss fixture (issue 24, `make conformance`'s round trip
on harmony).

The gpt-oss fixture (``tests/fixtures/families/gpt-oss``) is trained, besides its documented
prompts, on the prompts the server renders with its template for Codex 0.169.0's captured MCP
requests (``Family.codex`` in scripts/family_specs.py, rendered by scripts/codex_prompts.py with
the harmony format's replay; what the build checked is in the fixture's codex_prompts.json).
Here: those records are the server's own rendering of the captures; the captured bodies replayed
through the real server give the namespaced MCP call in harmony, then the final answer after the
tool's output under a wall time the build never trained or checked.
"""

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
from .scripts_loader import script

ROOT = Path(__file__).parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
GPT_OSS = FIXTURES / "families" / "gpt-oss"
ALIAS = "gpt-oss-tiny"
# `make conformance`'s window for the fixture (Codex's follow-up is ~1,300 of its tokens).
CONTEXT = 4096
DEADLINE = 120
# Codex's "Wall time" line differs on every run; this value is in no list of the build.
UNSEEN_WALL_TIME = "0.0093"
ANSWER = "It is sunny and 18 degrees in Paris."


def fixture(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return body


def test_the_trained_turns_are_the_servers_harmony_rendering_of_codexs_requests() -> None:
    render = script("codex_prompts").render
    records = json.loads((GPT_OSS / "codex_prompts.json").read_text(encoding="utf-8"))
    assert [r["name"] for r in records] == ["codex_mcp_call", "codex_mcp_answer"]
    for record in records:
        rendered = render(fixture(Path(record["fixture"]).name), "harmony")
        assert record["messages"] == rendered["messages"]
        assert record["tools"] == rendered["tools"]
        assert record["prompt_tokens"] < CONTEXT // 2
    answer = records[1]
    assert UNSEEN_WALL_TIME not in answer["trained_wall_times"] + answer["checked_wall_times"]
    assert f"Wall time: {answer['wall_time']} seconds" in answer["messages"][-1]["content"]


async def start(nursery: trio.Nursery) -> ServerHandle:
    # As `make conformance` serves the fixture to Codex: --unsupported-tools drop,
    # --default-temperature 0, --ctx-size 4096.
    base = server_settings(context_size=CONTEXT)
    model = dataclasses.replace(base.model, model_path=str(GPT_OSS), alias=ALIAS)
    settings = dataclasses.replace(
        base, model=model, drop_unsupported_tools=True, default_temperature=0.0
    )
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    return handle


async def codex_request(server: ServerHandle, body: dict[str, Any]) -> dict[str, Any]:
    """Codex's body as it sent it (streamed, no temperature, no token limit), for the fixture's
    alias: the final Response of a strictly valid stream."""
    headers = {"accept": "text/event-stream", "originator": "codex_exec"}
    with trio.fail_after(DEADLINE):
        async with (
            httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http,
            http.stream(
                "POST", "/v1/responses", json={**body, "model": ALIAS}, headers=headers
            ) as reply,
        ):
            assert reply.status_code == 200
            raw = b"".join([c async for c in reply.aiter_bytes()])
    return assert_stream_invariants(parse_sse(raw))


def texts(final: dict[str, Any]) -> list[str]:
    return [
        part["text"]
        for item in final["output"]
        if item["type"] == "message"
        for part in item["content"]
    ]


async def test_codexs_first_turn_calls_the_mcp_tool_in_harmony(nursery: trio.Nursery) -> None:
    server = await start(nursery)
    final = await codex_request(server, fixture("codex-0.169.0-small-mcp-turn.json"))
    assert final["status"] == "completed"
    assert [item["type"] for item in final["output"]] == ["function_call"]
    (call,) = final["output"]
    assert (call["name"], call["namespace"]) == ("get_weather", "mcp__weather")
    assert json.loads(call["arguments"]) == {"city": "Paris"}


async def test_codexs_follow_up_answers_under_an_unseen_wall_time(nursery: trio.Nursery) -> None:
    body = fixture("codex-0.169.0-small-mcp-tool-result.json")
    call, output = body["input"][-2:]
    assert (call["type"], call["namespace"]) == ("function_call", "mcp__weather")
    line = output["output"][0]["text"]
    assert line.startswith("Wall time: ")
    output["output"][0]["text"] = f"Wall time: {UNSEEN_WALL_TIME} seconds\nOutput:"
    server = await start(nursery)
    final = await codex_request(server, body)
    assert final["status"] == "completed"
    assert [item["type"] for item in final["output"]] == ["message"]
    assert texts(final) == [ANSWER]
