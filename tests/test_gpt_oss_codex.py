"""Codex CLI's real turns against the gpt-oss fixture (`make conformance`'s round trip on
harmony).

The gpt-oss fixture (``tests/fixtures/families/gpt-oss``) is trained, besides its documented
prompts, on the prompts the server renders with its template for Codex 0.169.0's captured MCP
requests (``Family.codex`` in scripts/family_specs.py, rendered by scripts/codex_prompts.py with
the harmony format's replay; what the build checked is in the fixture's codex_prompts.json).
Here: those records are the server's own rendering of the captures; the captured bodies replayed
through the real server give the namespaced MCP call in harmony, then the final answer after the
tool's output under a wall time the build never trained or checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import trio

from mlx_responses.server import ServerHandle

from .codex_turns import (
    CONTEXT,
    FIRST_TURN,
    FIXTURES,
    UNSEEN_WALL_TIME,
    assert_the_answer,
    assert_the_mcp_call,
    codex_request,
    fixture,
    follow_up_at_an_unseen_wall_time,
    start_for_codex,
)
from .scripts_loader import script

GPT_OSS = FIXTURES / "families" / "gpt-oss"
ALIAS = "gpt-oss-tiny"


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
    return await start_for_codex(nursery, GPT_OSS, ALIAS)


async def test_codexs_first_turn_calls_the_mcp_tool_in_harmony(nursery: trio.Nursery) -> None:
    server = await start(nursery)
    final = await codex_request(server, fixture(FIRST_TURN), ALIAS)
    assert [item["type"] for item in final["output"]] == ["function_call"]
    assert_the_mcp_call(final)


async def test_codexs_follow_up_answers_under_an_unseen_wall_time(nursery: trio.Nursery) -> None:
    body = follow_up_at_an_unseen_wall_time()
    server = await start(nursery)
    assert_the_answer(await codex_request(server, body, ALIAS))
