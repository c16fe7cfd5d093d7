"""Codex CLI's real turns against the bundled model (issue 13, `make conformance`'s tool round trip).

The bundled model is trained on the prompts the server renders for Codex 0.169.0's captured
requests (scripts/codex_prompts.py, scripts/codex_prompts.json, tests/fixtures/codex-0.169.0-
small-*.json). Here: those prompts are the server's own rendering of the captures; through
mlx-lm the built model answers them, also under wall times it was not trained on; and the
captured bodies replayed through the real server give the namespaced MCP call, then the final
answer after the tool's output (with a wall time in no training or check list), then "hello"
for Codex's one-turn prompt.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import trio
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH
from mlx_responses.server import ServerHandle, serve
from tests.conformance import assert_stream_invariants, parse_sse

from .conftest import START_DEADLINE, server_settings
from .scripts_loader import script

ROOT = Path(__file__).parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
SOURCE = ROOT / "scripts" / "codex_prompts.json"
BUILT = BUNDLED_MODEL_PATH / "codex_prompts.json"
# Codex's prompts are ~1,900 tokens of the bundled model's vocabulary: `make conformance`'s window.
CONTEXT = 4096
DEADLINE = 120
# Codex's "Wall time" line differs on every run; this value is in no list of the build.
UNSEEN_WALL_TIME = "0.0093"
ANSWER = "It is sunny and 18 degrees in Paris."


def built() -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = json.loads(BUILT.read_text(encoding="utf-8"))
    return records


def fixture(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return body


def test_the_trained_prompts_are_the_servers_rendering_of_codexs_requests() -> None:
    assert script("codex_prompts").codex_prompts() == json.loads(SOURCE.read_text())


def test_the_built_prompts_are_the_source_under_each_wall_time() -> None:
    source = {p["name"]: p for p in json.loads(SOURCE.read_text())}
    records = built()
    by_name = {r["name"]: r for r in records}
    for name in ("codex_mcp_call", "codex_hello"):
        assert by_name[name]["messages"] == source[name]["messages"]
        assert by_name[name]["tools"] == source[name]["tools"]
        assert by_name[name]["expected"] == source[name]["expected"]
    answer = source["codex_mcp_answer"]
    follow_ups = [r for r in records if r["name"].startswith("codex_mcp_answer@")]
    assert any(r["trained"] for r in follow_ups)
    assert any(not r["trained"] for r in follow_ups)  # checked by the build, never trained
    walls = {r["wall_time"] for r in follow_ups}
    assert UNSEEN_WALL_TIME not in walls
    for record in follow_ups:
        assert record["messages"][:-1] == answer["messages"][:-1]
        captured = answer["messages"][-1]["content"]
        assert record["messages"][-1]["content"] == captured.replace(
            f"Wall time: {answer['wall_time']} ", f"Wall time: {record['wall_time']} "
        )
        assert record["tools"] == answer["tools"]
        assert record["expected"] == ANSWER


@pytest.fixture(scope="module")
def bundled() -> tuple[Any, Any]:
    model, tokenizer = load(str(BUNDLED_MODEL_PATH))[:2]
    return model, tokenizer


UNTRAINED = [r for r in built() if not r.get("trained", True)]
FIRST_TURNS = [r for r in built() if "wall_time" not in r]


@pytest.mark.parametrize(
    "record", FIRST_TURNS + UNTRAINED, ids=[r["name"] for r in FIRST_TURNS + UNTRAINED]
)
def test_the_bundled_model_answers_codexs_prompt(
    bundled: tuple[Any, Any], record: dict[str, Any]
) -> None:
    model, tokenizer = bundled
    ids = tokenizer.apply_chat_template(
        record["messages"], tools=record["tools"], add_generation_prompt=True
    )
    assert len(ids) == record["prompt_tokens"]
    text = "".join(
        r.text
        for r in stream_generate(
            model,
            tokenizer,
            ids,
            max_tokens=record["expected_tokens"] + 20,
            sampler=make_sampler(temp=0.0),
        )
    )
    assert text == record["expected"]


async def start(nursery: trio.Nursery) -> ServerHandle:
    # As `make conformance` serves Codex: --unsupported-tools drop, --default-temperature 0.
    settings = server_settings(context_size=CONTEXT)
    settings = dataclasses.replace(settings, drop_unsupported_tools=True, default_temperature=0.0)
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    return handle


async def codex_request(server: ServerHandle, body: dict[str, Any]) -> dict[str, Any]:
    """Codex's body as it sent it (streamed, no temperature, no token limit): the final
    Response of a strictly valid stream."""
    headers = {"accept": "text/event-stream", "originator": "codex_exec"}
    with trio.fail_after(DEADLINE):
        async with (
            httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http,
            http.stream("POST", "/v1/responses", json=body, headers=headers) as reply,
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


async def test_codexs_first_turn_calls_the_mcp_tool_with_its_namespace(
    nursery: trio.Nursery,
) -> None:
    server = await start(nursery)
    final = await codex_request(server, fixture("codex-0.169.0-small-mcp-turn.json"))
    assert final["status"] == "completed"
    (call,) = [item for item in final["output"] if item["type"] == "function_call"]
    assert (call["name"], call["namespace"]) == ("get_weather", "mcp__weather")
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert texts(final) == []


async def test_codexs_follow_up_answers_under_an_unseen_wall_time(nursery: trio.Nursery) -> None:
    body = fixture("codex-0.169.0-small-mcp-tool-result.json")
    call, output = body["input"][-2:]
    assert (call["type"], call["namespace"]) == ("function_call", "mcp__weather")
    line = output["output"][0]["text"]
    assert line.startswith("Wall time: ")
    assert line.endswith(" seconds\nOutput:")
    output["output"][0]["text"] = f"Wall time: {UNSEEN_WALL_TIME} seconds\nOutput:"
    server = await start(nursery)
    final = await codex_request(server, body)
    assert final["status"] == "completed"
    assert [item["type"] for item in final["output"]] == ["message"]
    assert texts(final) == [ANSWER]


async def test_codexs_one_turn_prompt_says_hello(nursery: trio.Nursery) -> None:
    server = await start(nursery)
    final = await codex_request(server, fixture("codex-0.169.0-small-hello.json"))
    assert final["status"] == "completed"
    assert texts(final) == ["hello"]
