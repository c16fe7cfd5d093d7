"""The vision fixture answers its documented prompts through mlx-vlm itself.

``tests/fixtures/vision/qwen2-vl/prompts.json`` lists each prompt, its image and its answer
(scripts/build_vision_fixture.py, docs/vision.md "The test fixture"). Run through mlx-vlm's own
``load`` and ``generate``, greedy, each must come out exactly: a change of the mlx-vlm or
transformers pin that moved the processor, the template or the architecture shows here first,
apart from the server.
"""

from __future__ import annotations

import json
from importlib.resources import files
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

FIXTURE = Path(__file__).parent / "fixtures" / "vision" / "qwen2-vl"
PROMPTS: list[dict[str, Any]] = json.loads((FIXTURE / "prompts.json").read_text())


def image_of(spec: dict[str, Any]) -> Image.Image:
    if spec["kind"] == "solid square":
        side = spec["side"]
        return Image.new("RGB", (side, side), tuple(spec["rgb"]))
    # llm-comply's photo, from the installed package (pinned in the test extras).
    assert spec["kind"].startswith("llm-comply"), spec
    data = (files("llm_comply") / "specs" / "test_image.jpg").read_bytes()
    return Image.open(BytesIO(data)).convert("RGB")


@pytest.fixture(scope="module")
def loaded() -> tuple[Any, Any]:
    from mlx_vlm import load

    return load(str(FIXTURE))


def test_the_documented_prompts_cover_every_colour_and_the_plain_text_ones() -> None:
    answers = {p["expected"] for p in PROMPTS if p["image"] is not None}
    assert {"red", "green", "blue"} <= answers
    assert any(p["image"] is None for p in PROMPTS)


@pytest.mark.parametrize("prompt", PROMPTS, ids=[p["name"] for p in PROMPTS])
def test_mlx_vlm_answers_each_documented_prompt(
    loaded: tuple[Any, Any], prompt: dict[str, Any]
) -> None:
    from mlx_vlm import generate

    model, processor = loaded
    text = processor.tokenizer.apply_chat_template(
        prompt["messages"], tokenize=False, add_generation_prompt=True
    )
    image = None if prompt["image"] is None else [image_of(prompt["image"])]
    result = generate(
        model, processor, text, image=image, max_tokens=400, temperature=0.0, verbose=False
    )
    assert result.text.strip() == prompt["expected"]
