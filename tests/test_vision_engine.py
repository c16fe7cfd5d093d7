"""The image prefill against mlx-vlm's own forward pass (issue 27): on the Qwen2-VL fixture, the
next-token logits our path gives (mlx-vlm's tower and multimodal positions for the image span,
then mlx-lm's text model, as the batch runs it) equal those of mlx-vlm's whole model, with the
image before and after the text. The reference is mlx-vlm's own load of the folder, not the
server's (which shares mlx-lm's weight arrays)."""

from __future__ import annotations

import base64
import io
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

FIXTURE = Path(__file__).parent / "fixtures" / "vision" / "qwen2-vl"
QUESTION = "What colour is the square?"


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(str(FIXTURE))


@pytest.fixture(scope="module")
def reference() -> Any:
    return load_vlm(FIXTURE)


def square(rgb: tuple[int, int, int], side: int) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), rgb).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


@pytest.mark.parametrize("image_first", [True, False])
@pytest.mark.parametrize(("rgb", "side"), [((255, 0, 0), 84), ((0, 0, 255), 140)])
def test_the_image_prefill_gives_mlx_vlms_logits(
    loaded: LoadedModel, reference: Any, image_first: bool, rgb: tuple[int, int, int], side: int
) -> None:
    vision = loaded.vision
    assert vision is not None
    image = marker(ImageRef(square(rgb, side)))
    content = image + QUESTION if image_first else QUESTION + image
    prompt = vision.render(
        [{"role": "user", "content": content}], lambda c: render_prompt(loaded.tokenizer, c)
    )
    start = vision_prefill(vision, loaded.model, prompt, vision.images_for(prompt), None, 0, 512)
    tail = mx.array(start.prompt[start.start :])[None]
    ours = loaded.model(tail, cache=start.cache)[0, -1]
    ids = mx.array(model_prompt(vision, prompt))[None]
    arrays = vision.arrays_of(image_runs(prompt)[0][2])
    assert arrays is not None
    forward = reference(
        ids,
        mx.array(arrays["pixel_values"]),
        mask=mx.ones(ids.shape),
        image_grid_thw=mx.array(arrays["image_grid_thw"]),
    )
    theirs = getattr(forward, "logits", forward)[0, -1]
    assert float(mx.abs(ours - theirs).max().item()) < 1e-3
    assert int(mx.argmax(ours).item()) == int(mx.argmax(theirs).item())
