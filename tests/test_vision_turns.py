"""An image answered on a later turn, through the real server and the ``openai`` SDK.

The fixture (docs/vision.md, "The test fixture") is trained on two shapes where the image is not
in the last message: Codex's ``view_image`` (the model called a tool and the tool's output is the
image) and a ``previous_response_id`` chain (the image asked about on the first turn, then asked
about again in text). A wrong answer here means the server lost the image from the history, put
it at the wrong positions or served a wrong cache entry.
"""

from __future__ import annotations

from typing import Any

import trio
from openai import AsyncOpenAI

from .conftest import MODEL, output_text
from .test_api_prompt_cache_templates import start
from .test_vision_api import COLOURS, DEADLINE, FIXTURE, QUESTION, data_url, image_message, png

ASK: dict[str, Any] = {"model": MODEL, "temperature": 0, "max_output_tokens": 16}
VIEW_IMAGE = {
    "type": "function",
    "name": "view_image",
    "description": "View a local image file.",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
}


def view_image_turns(url: str, ask: str) -> list[dict[str, Any]]:
    """The user's request, the model's view_image call and its output: the image as a part."""
    return [
        {"role": "user", "content": ask},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "view_image",
            "arguments": '{"path": "square.png"}',
        },
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": [{"type": "input_image", "image_url": url}],
        },
    ]


async def test_an_image_in_a_tool_output_is_answered_on_the_next_turn(
    nursery: trio.Nursery,
) -> None:
    server = await start(nursery, FIXTURE)
    async with AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0) as sdk:
        with trio.fail_after(DEADLINE):
            answers, after_question = {}, {}
            for colour, rgb in COLOURS.items():
                url = data_url(png(rgb))
                turns: Any = view_image_turns(url, "What colour is the square in square.png?")
                called = await sdk.responses.create(
                    input=turns,
                    tools=[VIEW_IMAGE],  # type: ignore[list-item]
                    **ASK,
                )
                answers[colour] = output_text(called.model_dump())
                turns = [
                    *view_image_turns(url, "Look at the picture."),
                    {"role": "user", "content": QUESTION},
                ]
                asked = await sdk.responses.create(input=turns, **ASK)
                after_question[colour] = output_text(asked.model_dump())
    assert answers == {colour: colour for colour in COLOURS}
    assert after_question == {colour: colour for colour in COLOURS}


async def test_a_chain_asks_again_from_the_stored_image_and_a_replay_hits_the_cache(
    nursery: trio.Nursery,
) -> None:
    server = await start(nursery, FIXTURE)
    follow_up = "What colour was the square?"
    async with AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0) as sdk:
        with trio.fail_after(DEADLINE):
            seen: dict[str, list[str]] = {}
            cached: dict[str, tuple[int, int]] = {}
            for colour, rgb in COLOURS.items():
                first_turn = [image_message(data_url(png(rgb)))]
                first = await sdk.responses.create(input=first_turn, **ASK)  # type: ignore[arg-type]
                second = await sdk.responses.create(
                    previous_response_id=first.id, input=follow_up, **ASK
                )
                # The same history sent whole, stored nowhere: the prompt cache serves it.
                replay = await sdk.responses.create(
                    input=[
                        *first_turn,
                        {"role": "assistant", "content": output_text(first.model_dump())},
                        {"role": "user", "content": follow_up},
                    ],  # type: ignore[arg-type]
                    store=False,
                    **ASK,
                )
                seen[colour] = [output_text(r.model_dump()) for r in (first, second, replay)]
                assert second.usage is not None
                assert replay.usage is not None
                assert replay.usage.input_tokens == second.usage.input_tokens
                cached[colour] = (
                    replay.usage.input_tokens_details.cached_tokens,
                    second.usage.input_tokens,
                )
    assert seen == {colour: [colour] * 3 for colour in COLOURS}
    # Everything but the last prompt token (the one whose logits start the answer) is cached.
    assert all(hit >= total - 1 for hit, total in cached.values()), cached
