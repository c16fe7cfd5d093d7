"""The image prefill against mlx-vlm's own forward pass (issue 27): on the Qwen2-VL and Qwen3-VL
fixtures, the next-token logits our path gives (mlx-vlm's tower and multimodal positions for the
image span, Qwen3-VL's deepstack features added inside its first decoder layers, then mlx-lm's
text model, as the batch runs it) equal those of mlx-vlm's whole model, with the image before
and after the text, at two sizes, and with the image span prefilled in chunks that split it.
The reference is mlx-vlm's own load of the folder, not the server's (which shares mlx-lm's
weight arrays)."""

from __future__ import annotations

import base64
import io
from functools import cache
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_vlm.utils import load_model as load_vlm
from PIL import Image

from mlx_responses.model.loader import LoadedModel, load_model, render_prompt
from mlx_responses.model.vision import image_runs
from mlx_responses.model.vision_prefill import model_prompt, vision_prefill
from mlx_responses.protocol.images import ImageRef, marker

VISION = Path(__file__).parent / "fixtures" / "vision"
QUESTION = "What colour is the square?"
# Per fixture, two image sizes (width, height): Qwen3-VL's processor scales anything under
# 65,536 pixels up, so its sizes are large enough to give two different grids, one not square.
SIZES = {
    "qwen2-vl": [((255, 0, 0), (84, 84)), ((0, 0, 255), (140, 140))],
    "qwen3-vl": [((255, 0, 0), (84, 84)), ((0, 0, 255), (400, 300))],
}
CASES = [(family, rgb, size) for family, sizes in SIZES.items() for rgb, size in sizes]


@cache
def loaded(family: str) -> LoadedModel:
    folder = VISION / family
    if not (folder / "config.json").is_file():
        pytest.skip(f"{folder} is not built")
    return load_model(str(folder))


@cache
def reference(family: str) -> Any:
    return load_vlm(VISION / family)


def picture(rgb: tuple[int, int, int], size: tuple[int, int]) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, rgb).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


@pytest.mark.parametrize("step", [512, 7])
@pytest.mark.parametrize("image_first", [True, False])
@pytest.mark.parametrize(("family", "rgb", "size"), CASES)
def test_the_image_prefill_gives_mlx_vlms_logits(
    family: str, rgb: tuple[int, int, int], size: tuple[int, int], image_first: bool, step: int
) -> None:
    model = loaded(family)
    vision = model.vision
    assert vision is not None
    image = marker(ImageRef(picture(rgb, size)))
    content = image + QUESTION if image_first else QUESTION + image
    prompt = vision.render(
        [{"role": "user", "content": content}], lambda c: render_prompt(model.tokenizer, c)
    )
    images = vision.images_for(prompt)
    # A step of 7 splits the image span into chunks that start and end inside it.
    start = vision_prefill(vision, model.model, prompt, images, None, 0, step)
    tail = mx.array(start.prompt[start.start :])[None]
    ours = model.model(tail, cache=start.cache)[0, -1]
    ids = mx.array(model_prompt(vision, prompt))[None]
    arrays = vision.arrays_of(image_runs(prompt)[0][2])
    assert arrays is not None
    forward = reference(family)(
        ids,
        mx.array(arrays["pixel_values"]),
        mask=mx.ones(ids.shape),
        image_grid_thw=mx.array(arrays["image_grid_thw"]),
    )
    theirs = getattr(forward, "logits", forward)[0, -1]
    assert float(mx.abs(ours - theirs).max().item()) < 1e-3
    assert int(mx.argmax(ours).item()) == int(mx.argmax(theirs).item())


@pytest.mark.parametrize("family", list(SIZES))
def test_low_detail_caps_the_image_tokens_and_the_prefill_takes_them_all(family: str) -> None:
    """``detail: "low"`` is 256 image tokens at most (Qwen2-VL's ``max_pixels``, Qwen3-VL's
    ``size.longest_edge``, each at its own pixels per token); the prompt the server counts is
    the prompt the prefill and the batch take, to the last token."""
    model = loaded(family)
    vision = model.vision
    assert vision is not None
    counts = {}
    for detail in ("low", "high"):
        image = marker(ImageRef(picture((0, 255, 0), (1000, 700)), detail))
        prompt = vision.render(
            [{"role": "user", "content": image + QUESTION}],
            lambda c: render_prompt(model.tokenizer, c),
        )
        (run,) = image_runs(prompt)
        counts[detail] = run[1] - run[0]
        start = vision_prefill(vision, model.model, prompt, vision.images_for(prompt), None, 0, 64)
        assert start.start == run[1]
        assert start.cache is not None
        assert start.cache[0].offset == run[1]
        assert len(start.prompt) == len(prompt)
    assert 128 <= counts["low"] <= 256 < counts["high"], counts
