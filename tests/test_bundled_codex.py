"""Codex CLI's real turns against the bundled model (`make conformance`'s tool round trip).

The bundled model is trained on the prompts the server renders for Codex 0.169.0's captured
requests (scripts/codex_prompts.py, scripts/codex_prompts.json, tests/fixtures/codex-0.169.0-
small-*.json). Here: those prompts are the server's own rendering of the captures; through
mlx-lm the built model answers them, also under wall times it was not trained on; and the
captured bodies replayed through the real server give the namespaced MCP call, then the final
answer after the tool's output (with a wall time in no training or check list), then "hello"
for Codex's one-turn prompt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH

from .codex_turns import (
    ANSWER,
    FIRST_TURN,
    UNSEEN_WALL_TIME,
    assert_the_answer,
    assert_the_mcp_call,
    codex_request,
    fixture,
    follow_up_at_an_unseen_wall_time,
    start_for_codex,
    texts,
)
from .scripts_loader import script

ROOT = Path(__file__).parent.parent
SOURCE = ROOT / "scripts" / "codex_prompts.json"
BUILT = BUNDLED_MODEL_PATH / "codex_prompts.json"


def built() -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = json.loads(BUILT.read_text(encoding="utf-8"))
    return records


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


async def test_codexs_first_turn_calls_the_mcp_tool_with_its_namespace(
    nursery: trio.Nursery,
) -> None:
    server = await start_for_codex(nursery)
    final = await codex_request(server, fixture(FIRST_TURN))
    assert_the_mcp_call(final)
    assert texts(final) == []


async def test_codexs_follow_up_answers_under_an_unseen_wall_time(nursery: trio.Nursery) -> None:
    body = follow_up_at_an_unseen_wall_time()
    server = await start_for_codex(nursery)
    assert_the_answer(await codex_request(server, body))


async def test_codexs_one_turn_prompt_says_hello(nursery: trio.Nursery) -> None:
    server = await start_for_codex(nursery)
    final = await codex_request(server, fixture("codex-0.169.0-small-hello.json"))
    assert final["status"] == "completed"
    assert texts(final) == ["hello"]
