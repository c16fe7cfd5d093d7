"""The vision fixture (Qwen2-VL) split by tensors over 2 ranks (ring backend, loopback) answers
each colour as one process does: the image's arrays travel in its ``Admit``, which rank 0
broadcasts before it applies it (without the pixels of an image its prompt cache already
holds), and every rank holds the whole vision tower and prefills the image with its share of
the language model. Images beside a text request in one
burst, a text request after image ones, and a shutdown after which rank 1 exits 0 having
generated what rank 0 generated. A split by layers (``--pipeline``) is refused by name.

One sharded server serves the module (2 cores); the last test shuts it down.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest
import trio
from openai import AsyncOpenAI

from .conftest import MODEL, output_text
from .sharded import Ranks, start_ranks
from .test_vision_answers import COUNT
from .test_vision_api import COLOURS, FIXTURE, data_url, image_message, png

DEADLINE = 120


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ranks]:
    started = start_ranks(FIXTURE, tmp_path_factory.mktemp("sharded-vision"), "--alias", MODEL)
    try:
        yield started
    finally:
        started.close()


async def ask(sdk: AsyncOpenAI, input_: object) -> str:
    response = await sdk.responses.create(
        model=MODEL,
        input=input_,  # type: ignore[arg-type]
        temperature=0,
        max_output_tokens=64,
    )
    return output_text(response.model_dump())


async def test_each_colour_is_answered_by_the_split_model(ranks: Ranks) -> None:
    async with AsyncOpenAI(base_url=f"{ranks.base_url}/v1", api_key="x", max_retries=0) as sdk:
        with trio.fail_after(DEADLINE):
            answers = {
                colour: await ask(sdk, [image_message(data_url(png(rgb)))])
                for colour, rgb in COLOURS.items()
            }
            unseen = await ask(sdk, [image_message(data_url(png((230, 15, 10), side=98)))])
    assert answers == {colour: colour for colour in COLOURS}
    assert unseen == "red"


async def test_images_and_text_in_one_burst_answer_as_alone(ranks: Ranks) -> None:
    found: dict[str, str] = {}
    async with AsyncOpenAI(base_url=f"{ranks.base_url}/v1", api_key="x", max_retries=0) as sdk:

        async def one(name: str, input_: object) -> None:
            found[name] = await ask(sdk, input_)

        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as nursery:
                for colour, rgb in COLOURS.items():  # new sizes: no prompt-cache hit
                    image = [image_message(data_url(png(rgb, side=112)))]
                    nursery.start_soon(one, colour, image)
                nursery.start_soon(one, "count", "Count from 1 to 20.")
            after = await ask(sdk, "Count from 1 to 20.")
    assert found == {**{colour: colour for colour in COLOURS}, "count": COUNT}
    assert after == COUNT


async def broadcast_bytes(http: httpx.AsyncClient) -> float:
    metrics = (await http.get("/metrics")).text
    found = re.search(
        r"^mlx_responses_distributed_broadcast_bytes(?:_total)? (\S+)$", metrics, re.M
    )
    assert found, metrics
    return float(found.group(1))


async def test_an_image_the_prompt_cache_holds_is_not_broadcast_again(ranks: Ranks) -> None:
    """The next turn of an image conversation reuses the prefix that holds its image: its
    Admit goes to rank 1 without the image's pixels (rank 1's prompt cache holds the same
    prefix), a small fraction of the first turn's bytes, and the answer is the same (the
    shutdown test below checks that rank 1 failed no sequence)."""
    async with (
        AsyncOpenAI(base_url=f"{ranks.base_url}/v1", api_key="x", max_retries=0) as sdk,
        httpx.AsyncClient(base_url=ranks.base_url, timeout=30) as http,
    ):
        with trio.fail_after(DEADLINE):
            before = await broadcast_bytes(http)
            first = await sdk.responses.create(
                model=MODEL,
                input=[image_message(data_url(png(COLOURS["red"], side=70)))],  # type: ignore[list-item]
                temperature=0,
                max_output_tokens=64,
            )
            between = await broadcast_bytes(http)
            second = await sdk.responses.create(
                model=MODEL,
                previous_response_id=first.id,
                input="What colour is the square?",
                temperature=0,
                max_output_tokens=64,
            )
            after = await broadcast_bytes(http)
    assert (output_text(first.model_dump()), output_text(second.model_dump())) == ("red", "red")
    assert first.usage is not None
    assert second.usage is not None
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    assert after - between < (between - before) / 4, (before, between, after)


def test_shutdown_leaves_every_rank_having_generated_alike(ranks: Ranks) -> None:
    metrics = httpx.get(f"{ranks.base_url}/metrics", timeout=30).text
    generated = re.search(r"^mlx_responses_generated_tokens_total (\S+)$", metrics, re.M)
    assert generated, metrics
    codes = ranks.stop(DEADLINE)
    assert codes == [0, 0], ranks.log(0) + ranks.log(1)
    pattern = r"rank 1: (\d+) tokens generated, \d+ sequences finished, \d+ cancelled, (\d+) failed"
    followed = re.search(pattern, ranks.log(1))
    assert followed, ranks.log(1)
    assert int(followed.group(1)) == float(generated.group(1)) > 0
    assert followed.group(2) == "0"


def test_a_vision_model_split_by_layers_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(AssertionError) as refused:
        start_ranks(FIXTURE, tmp_path, "--pipeline")
    message = str(refused.value)
    assert "did not start" in message
    assert "a vision model cannot be split by layers (--pipeline)" in message
