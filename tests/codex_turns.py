"""What the Codex round-trip tests share (``test_bundled_codex.py`` on the bundled model,
``test_gpt_oss_codex.py`` on the gpt-oss fixture): the captured bodies, the server started as
``make conformance`` serves a model to Codex, a body sent as Codex sends it, and the turns both
models are trained to answer: the namespaced MCP call, then the answer after the tool's output
under a wall time neither build trained or checked."""

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

FIXTURES = Path(__file__).parent / "fixtures"
# `make conformance`'s window: Codex's prompts are ~1,900 tokens of the bundled model's
# vocabulary, its follow-up ~1,300 of the gpt-oss fixture's.
CONTEXT = 4096
DEADLINE = 120
# Codex's "Wall time" line differs on every run; this value is in no list of either build.
UNSEEN_WALL_TIME = "0.0093"
ANSWER = "It is sunny and 18 degrees in Paris."
FIRST_TURN = "codex-0.169.0-small-mcp-turn.json"
FOLLOW_UP = "codex-0.169.0-small-mcp-tool-result.json"


def fixture(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return body


async def start_for_codex(
    nursery: trio.Nursery, model_path: Path | None = None, alias: str | None = None
) -> ServerHandle:
    """A server as `make conformance` serves a model to Codex: --unsupported-tools drop,
    --default-temperature 0, --ctx-size 4096 (the bundled model unless ``model_path``)."""
    settings = server_settings(context_size=CONTEXT)
    if model_path is not None:
        model = dataclasses.replace(settings.model, model_path=str(model_path), alias=alias)
        settings = dataclasses.replace(settings, model=model)
    settings = dataclasses.replace(settings, drop_unsupported_tools=True, default_temperature=0.0)
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    return handle


async def codex_request(
    server: ServerHandle, body: dict[str, Any], alias: str | None = None
) -> dict[str, Any]:
    """Codex's body as it sent it (streamed, no temperature, no token limit), for ``alias``
    when given: the final Response of a strictly valid stream."""
    headers = {"accept": "text/event-stream", "originator": "codex_exec"}
    sent = body if alias is None else {**body, "model": alias}
    with trio.fail_after(DEADLINE):
        async with (
            httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http,
            http.stream("POST", "/v1/responses", json=sent, headers=headers) as reply,
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


def assert_the_mcp_call(final: dict[str, Any]) -> None:
    """Codex's first turn answered with the one namespaced MCP call it was trained on."""
    assert final["status"] == "completed"
    (call,) = [item for item in final["output"] if item["type"] == "function_call"]
    assert (call["name"], call["namespace"]) == ("get_weather", "mcp__weather")
    assert json.loads(call["arguments"]) == {"city": "Paris"}


def follow_up_at_an_unseen_wall_time() -> dict[str, Any]:
    """Codex's follow-up (the MCP call and its output) with ``UNSEEN_WALL_TIME`` in the output."""
    body = fixture(FOLLOW_UP)
    call, output = body["input"][-2:]
    assert (call["type"], call["namespace"]) == ("function_call", "mcp__weather")
    line = output["output"][0]["text"]
    assert line.startswith("Wall time: ")
    assert line.endswith(" seconds\nOutput:")
    output["output"][0]["text"] = f"Wall time: {UNSEEN_WALL_TIME} seconds\nOutput:"
    return body


def assert_the_answer(final: dict[str, Any]) -> None:
    """The follow-up answered with the trained answer, as one message."""
    assert final["status"] == "completed"
    assert [item["type"] for item in final["output"]] == ["message"]
    assert texts(final) == [ANSWER]
