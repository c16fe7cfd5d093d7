"""Images through HTTP on a vision-language model (issue 27): the tiny Qwen2-VL fixture
(``tests/fixtures/vision/qwen2-vl``, docs/vision.md) served for real, asked through the
``openai`` SDK.

Every test starts the real server on the fixture: mlx-lm runs the language model in the batch,
mlx-vlm's processor and vision tower take the image.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import httpx2 as httpx
import trio
from openai import AsyncOpenAI
from PIL import Image

from .conftest import MODEL
from .test_api_prompt_cache_templates import start

DEADLINE = 120
FIXTURE = Path(__file__).parent / "fixtures" / "vision" / "qwen2-vl"
QUESTION = "What colour is the square?"
COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}


def png(rgb: tuple[int, int, int], side: int = 84) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), rgb).save(buffer, "PNG")
    return buffer.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def image_message(url: str, text: str = QUESTION) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [
            {"type": "input_image", "image_url": url, "detail": "auto"},
            {"type": "input_text", "text": text},
        ],
    }


async def test_a_data_url_image_is_answered_and_counted(nursery: trio.Nursery) -> None:
    server = await start(nursery, FIXTURE)
    async with AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0) as sdk:
        with trio.fail_after(DEADLINE):
            models = await sdk.models.list()
            with_image = await sdk.responses.create(
                model=MODEL,
                input=[image_message(data_url(png(COLOURS["red"])))],  # type: ignore[list-item]
                temperature=0,
                max_output_tokens=8,
            )
            text_only = await sdk.responses.create(
                model=MODEL,
                input=[{"role": "user", "content": QUESTION}],
                temperature=0,
                max_output_tokens=8,
            )
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
                counted = await http.post(
                    "/v1/responses/input_tokens",
                    json={"model": MODEL, "input": [image_message(data_url(png((9, 9, 9))))]},
                )
    assert [m.model_dump().get("input_modalities") for m in models.data] == [["text", "image"]]
    assert with_image.status in ("completed", "incomplete")
    assert with_image.usage is not None
    assert text_only.usage is not None
    # An 84x84 square is 36 patches, 9 image tokens after the 2x2 merge, between vision marks.
    extra = with_image.usage.input_tokens - text_only.usage.input_tokens
    assert extra == 9 + 2, (with_image.usage, text_only.usage)
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] == with_image.usage.input_tokens
