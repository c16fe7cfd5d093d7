"""Codex's ``view_image`` round trip on the Qwen3-VL fixture, through the real server.

The fixture (``tests/fixtures/vision/qwen3-vl``, docs/vision.md) is a tiny Qwen3-VL (deepstack,
interleaved M-RoPE, the real Qwen3-VL template with its hermes ``<tool_call>`` tools), trained on
the server's rendering of Codex 0.171.0's captured ``view_image`` turns
(tests/fixtures/codex-0.171.0-small-view-image-*.json). Here, against one real server on it
(started once for the module, in its own thread, as ``make conformance`` serves Codex):

- each colour is answered from a data URL, and ``/v1/responses/input_tokens`` counts what the
  prefill takes (``detail`` low and high);
- Codex's captured first request, replayed as sent (streamed), gives the ``view_image`` call
  with ``{"path": "square.png"}``; the captured follow-up (the call, then its output holding the
  image) gives the image's colour, also with green and blue squares put in its place; the
  prompt ids the server hands the model are exactly those the fixture was trained on;
- Codex's agent loop with ``store: false`` (the whole history sent again, the call answered
  with a blue square): the follow-up is served from the first turn's cached prompt although
  its image moves every M-RoPE position (docs/vision.md, "The prompt cache").
"""

from __future__ import annotations

import base64
import copy
import io
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import trio
from PIL import Image

from mlx_responses.api_keys import load_api_keys
from mlx_responses.engine.vision import untag
from mlx_responses.server import ServerHandle
from tests.conformance import assert_stream_invariants, parse_sse

from .conftest import output_text, server_settings
from .test_background_state_machine import ThreadedServer

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE = FIXTURES / "vision" / "qwen3-vl"
MODEL = "qwen3-vl-tiny"  # the name Codex was configured with when its requests were captured
DEADLINE = 120
QUESTION = "What colour is the square?"
MAX_TOKENS = 40  # the longest trained answer is the call, ~25 tokens
COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}
FIRST_TURN = "codex-0.171.0-small-view-image-turn.json"
FOLLOW_UP = "codex-0.171.0-small-view-image-tool-result.json"
# Two tenants: the agent loop's prompt cache holds nothing the other tests stored.
KEY, LOOP_KEY = "sk-tests", "sk-agent-loop"
pytestmark = pytest.mark.skipif(
    not (FIXTURE / "config.json").is_file(), reason=f"{FIXTURE} is not built"
)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    """The server on the fixture, as ``make conformance`` starts it for Codex (greedy when no
    temperature is sent; unsupported tools dropped)."""
    import dataclasses

    settings = server_settings()
    settings = dataclasses.replace(
        settings,
        model=dataclasses.replace(settings.model, model_path=str(FIXTURE), alias=MODEL),
        drop_unsupported_tools=True,
        default_temperature=0.0,
        api_keys=load_api_keys([KEY, LOOP_KEY]),
    )
    threaded = ThreadedServer(settings)
    handle = threaded.start()
    try:
        yield handle
    finally:
        threaded.stop(handle)


def png(rgb: tuple[int, int, int], size: tuple[int, int] = (56, 56)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, rgb).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def captured(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return body


def trained() -> dict[str, dict[str, Any]]:
    records = json.loads((FIXTURE / "prompts.json").read_text(encoding="utf-8"))
    return {r["name"]: r for r in records}


def record_prompts(server: ServerHandle, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """Every prompt the model actor is handed from now on, in order (the real submit runs)."""
    seen: list[tuple[int, ...]] = []
    real: Callable[..., Awaitable[Any]] = server.actors.model.submit

    async def submit(request: Any, *rest: Any) -> Any:
        seen.append(request.prompt)
        return await real(request, *rest)

    monkeypatch.setattr(server.actors.model, "submit", submit)
    return seen


def model_ids(prompt: tuple[int, ...]) -> list[int]:
    """A rendered prompt as the model takes it: the image token at each image position."""
    config = json.loads((FIXTURE / "config.json").read_text())
    image = int(config["image_token_id"])
    return [image if t < 0 else t for t in (untag(t) for t in prompt)]


def client(server: ServerHandle, key: str = KEY) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {key}"}
    return httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE, headers=headers)


async def stream(server: ServerHandle, body: dict[str, Any], key: str = KEY) -> dict[str, Any]:
    """``body`` as Codex sends it (streamed, no temperature; a token limit added, which the
    prompt does not show): the final Response of a strictly valid stream."""
    headers = {"accept": "text/event-stream", "originator": "codex_exec"}
    body = {**body, "max_output_tokens": MAX_TOKENS}
    async with (
        client(server, key) as http,
        http.stream("POST", "/v1/responses", json=body, headers=headers) as reply,
    ):
        assert reply.status_code == 200, await reply.aread()
        raw = b"".join([c async for c in reply.aiter_bytes()])
    return assert_stream_invariants(parse_sse(raw))


def with_image(body: dict[str, Any], url: str) -> dict[str, Any]:
    """The captured follow-up with ``url`` as the view_image output's image."""
    changed = copy.deepcopy(body)
    (part,) = changed["input"][-1]["output"]
    assert part["type"] == "input_image"
    part["image_url"] = url
    return changed


def calls(final: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        (item["name"], json.loads(item["arguments"]))
        for item in final["output"]
        if item["type"] == "function_call"
    ]


async def test_each_colour_is_answered_and_counted_as_prefilled(server: ServerHandle) -> None:
    async with client(server) as http:
        with trio.fail_after(DEADLINE):
            answers = {}
            for colour, rgb in COLOURS.items():
                for side in (56, 96):
                    parts = [
                        {"type": "input_image", "image_url": png(rgb, (side, side))},
                        {"type": "input_text", "text": QUESTION},
                    ]
                    if side == 96:
                        parts.reverse()  # the image after the text
                    body = {"model": MODEL, "input": [{"role": "user", "content": parts}]}
                    reply = await http.post(
                        "/v1/responses",
                        json={**body, "temperature": 0, "max_output_tokens": MAX_TOKENS},
                    )
                    assert reply.status_code == 200, reply.text
                    answers[colour, side] = output_text(reply.json())
            counted = {}
            for detail in ("low", "high"):
                url = png((0, 0, 255), (1000, 700))
                content = [{"type": "input_image", "image_url": url, "detail": detail}]
                body = {"model": MODEL, "input": [{"role": "user", "content": content}]}
                count = await http.post("/v1/responses/input_tokens", json=body)
                made = await http.post("/v1/responses", json={**body, "max_output_tokens": 1})
                assert count.status_code == 200, count.text
                assert made.status_code == 200, made.text
                usage = made.json()["usage"]
                assert count.json()["input_tokens"] == usage["input_tokens"]
                counted[detail] = usage["input_tokens"]
    assert answers == {(colour, side): colour for colour in COLOURS for side in (56, 96)}
    # 1000x700 at detail low: at most 256 image tokens (32x32 pixels each), high: the model's own.
    assert counted["low"] < 256 + 40 < counted["high"], counted


async def test_codexs_captured_turns_call_view_image_then_answer_the_colour(
    server: ServerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = record_prompts(server, monkeypatch)
    follow_up = captured(FOLLOW_UP)
    with trio.fail_after(DEADLINE):
        first = await stream(server, captured(FIRST_TURN))
        answers = {}
        for colour, rgb in COLOURS.items():
            final = await stream(server, with_image(follow_up, png(rgb)))
            answers[colour] = [item["type"] for item in final["output"]], output_text(final)
        captured_image = await stream(server, follow_up)  # as sent: a red square
    # The prompts the model took are those the fixture was trained on, token for token: the
    # first turn, then each follow-up (the captured red square last).
    records = trained()
    names = ["call", *COLOURS, "red"]
    assert len(seen) == len(names)
    for prompt, name in zip(seen, names, strict=True):
        assert model_ids(prompt) == records[f"codex_view_image_{name}"]["prompt_ids"], name
    assert first["status"] == "completed"
    assert calls(first) == [("view_image", {"path": "square.png"})]
    assert output_text(first) == ""
    assert answers == {colour: (["message"], colour) for colour in COLOURS}
    assert output_text(captured_image) == "red"


async def test_a_store_false_agent_loop_reuses_the_first_turns_prompt(
    server: ServerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Codex's loop: the first turn's output sent back whole with the call's output (a blue
    square) appended; the follow-up's cached tokens cover the whole first prompt although its
    image moves every M-RoPE position. Its own tenant: the cache holds nothing else for it."""
    seen = record_prompts(server, monkeypatch)
    body = captured(FIRST_TURN)
    with trio.fail_after(DEADLINE):
        first = await stream(server, body, LOOP_KEY)
        (call,) = [item for item in first["output"] if item["type"] == "function_call"]
        output = {
            "type": "function_call_output",
            "call_id": call["call_id"],
            "output": [{"type": "input_image", "image_url": png(COLOURS["blue"])}],
        }
        body["input"] = [*body["input"], *first["output"], output]
        second = await stream(server, body, LOOP_KEY)
    assert output_text(second) == "blue"
    assert len(seen) == 2
    assert min(seen[1]) < 0  # the follow-up holds the image
    assert second["usage"]["input_tokens_details"]["cached_tokens"] >= len(seen[0])
