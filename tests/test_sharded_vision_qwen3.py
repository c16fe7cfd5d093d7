"""The Qwen3-VL fixture split by tensors over 2 ranks (ring backend, loopback) answers each colour:
each rank prefills the image span through mlx-vlm's Qwen3-VL language model
holding its share of mlx-lm's split layers (``vision._share_split_layers``), deepstack features
included, and Codex's ``view_image`` follow-up is served from the first turn's cached prompt
turned to the image's M-RoPE move on every rank alike. A shutdown after which rank 1 exits 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from openai import AsyncOpenAI

from .sharded import Ranks, start_ranks
from .test_vision_codex import COLOURS, FIRST_TURN, MODEL, captured, png

FIXTURE = Path(__file__).parent / "fixtures" / "vision" / "qwen3-vl"
DEADLINE = 120


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ranks]:
    started = start_ranks(
        FIXTURE, tmp_path_factory.mktemp("sharded-qwen3-vl"), "--alias", MODEL, "--ctx-size", "4096"
    )
    try:
        yield started
    finally:
        started.close()


async def test_the_split_model_answers_each_colour_and_codexs_follow_up(ranks: Ranks) -> None:
    body = captured(FIRST_TURN)
    tools = body["tools"]
    history = body["input"]
    async with AsyncOpenAI(base_url=f"{ranks.base_url}/v1", api_key="x", max_retries=0) as sdk:
        with trio.fail_after(DEADLINE):
            answers = {}
            for colour, rgb in COLOURS.items():
                square = {"type": "input_image", "image_url": png(rgb)}
                question = {"type": "input_text", "text": "What colour is the square?"}
                response = await sdk.responses.create(
                    model=MODEL,
                    input=[{"role": "user", "content": [square, question]}],  # type: ignore[list-item]
                    temperature=0,
                    max_output_tokens=8,
                )
                answers[colour] = response.output_text
            first = await sdk.responses.create(
                model=MODEL,
                input=history,
                tools=tools,
                temperature=0,
                store=False,
                max_output_tokens=40,
            )
            (call,) = [item for item in first.output if item.type == "function_call"]
            output = {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": [{"type": "input_image", "image_url": png(COLOURS["green"])}],
            }
            items = [item.model_dump(exclude_none=True) for item in first.output]
            second = await sdk.responses.create(
                model=MODEL,
                input=[*history, *items, output],  # type: ignore[list-item]
                tools=tools,
                temperature=0,
                store=False,
                max_output_tokens=40,
            )
    assert answers == {colour: colour for colour in COLOURS}
    assert (call.name, json.loads(call.arguments)) == ("view_image", {"path": "square.png"})
    assert second.output_text == "green"
    assert first.usage is not None
    assert second.usage is not None
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    codes = ranks.stop(DEADLINE)
    assert codes == [0, 0], ranks.log(0) + ranks.log(1)
