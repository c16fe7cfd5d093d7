"""The trained vision fixture's answers through the real server and the ``openai`` SDK.

The fixture (docs/vision.md, "The test fixture") answers "What colour is the square?" with the
square's colour; these tests hold the server to the answers mlx-vlm itself gives
(tests/test_vision_fixture.py), so a wrong image path, wrong positions or a wrong cache entry
shows as a wrong word.
"""

from __future__ import annotations

import trio
from openai import AsyncOpenAI

from .conftest import MODEL, output_text
from .test_api_prompt_cache_templates import start
from .test_vision_api import COLOURS, DEADLINE, FIXTURE, data_url, image_message, png

COUNT = "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"


async def ask(sdk: AsyncOpenAI, input_: object) -> str:
    response = await sdk.responses.create(
        model=MODEL,
        input=input_,  # type: ignore[arg-type]
        temperature=0,
        max_output_tokens=64,
    )
    return output_text(response.model_dump())


async def test_each_colour_is_answered_from_a_data_url(nursery: trio.Nursery) -> None:
    server = await start(nursery, FIXTURE)
    async with AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0) as sdk:
        with trio.fail_after(DEADLINE):
            answers = {
                colour: await ask(sdk, [image_message(data_url(png(rgb)))])
                for colour, rgb in COLOURS.items()
            }
            # A size and shade the fixture never trained on.
            unseen = await ask(sdk, [image_message(data_url(png((230, 15, 10), side=98)))])
            counted = await ask(
                sdk, [image_message(data_url(png(COLOURS["blue"], side=56)), "Count from 1 to 20.")]
            )
    assert answers == {colour: colour for colour in COLOURS}
    assert unseen == "red"
    assert counted == COUNT


# Found by bench/vision.py: an image prompt's prefill moves its M-RoPE positions (docs/vision.md,
# "Qwen2-VL's multimodal positions"); a text request must never be served from that entry (the
# prompt's first id carries the move, so only a prompt moved alike matches it).
async def test_a_text_prompt_after_an_image_prompt_is_answered_as_alone(
    nursery: trio.Nursery,
) -> None:
    server = await start(nursery, FIXTURE)
    async with AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0) as sdk:
        with trio.fail_after(DEADLINE):
            colour = await ask(sdk, [image_message(data_url(png(COLOURS["red"], side=224)))])
            hello = await ask(sdk, "Reply with: hello")
            count = await ask(sdk, "Count from 1 to 20.")
    assert colour == "red"
    assert (hello, count) == ("hello", COUNT)
