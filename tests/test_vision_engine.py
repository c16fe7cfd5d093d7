"""The image prefill against mlx-vlm's own forward pass: on the Qwen2-VL and Qwen3-VL
fixtures, the next-token logits our path gives (mlx-vlm's tower and multimodal positions for the
image span, Qwen3-VL's deepstack features added inside its first decoder layers, then mlx-lm's
text model, as the batch runs it) equal those of mlx-vlm's whole model, with the image before
and after the text, at two sizes, and with the image span prefilled in chunks that split it.
Also when the prompt cache serves a prefix stored under another M-RoPE move (a text turn, or a
turn with fewer images), its keys turned to the new move. The reference is mlx-vlm's own load
of the folder, not the server's (which shares mlx-lm's weight arrays)."""

from __future__ import annotations

import base64
import io
from functools import cache
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_vlm.utils import load_model as load_vlm
from PIL import Image

from mlx_responses.engine.loader import LoadedModel, load_model, render_prompt
from mlx_responses.engine.prompt_cache import PromptCache
from mlx_responses.engine.vision import image_runs, moved_of
from mlx_responses.engine.vision_prefill import model_prompt, moved, vision_prefill
from mlx_responses.protocol.items.images import ImageRef, content_of

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
    image = ImageRef(picture(rgb, size))
    content = content_of([image, QUESTION] if image_first else [QUESTION, image])
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
        image = ImageRef(picture((0, 255, 0), (1000, 700)), detail)
        prompt = vision.render(
            [{"role": "user", "content": (image, QUESTION)}],
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


def whole_forward(family: str, vision: Any, prompt: list[int]) -> Any:
    """mlx-vlm's next-token logits for ``prompt`` and every image in it."""
    ids = mx.array(model_prompt(vision, prompt))[None]
    arrays = [vision.arrays_of(handle) for _, _, handle in image_runs(prompt)]
    forward = reference(family)(
        ids,
        mx.array(np.concatenate([a["pixel_values"] for a in arrays])),
        mask=mx.ones(ids.shape),
        image_grid_thw=mx.array(np.concatenate([a["image_grid_thw"] for a in arrays])),
    )
    return getattr(forward, "logits", forward)[0, -1]


@pytest.mark.parametrize("first_has_image", [False, True])
@pytest.mark.parametrize("family", list(SIZES))
def test_a_prefix_cached_under_another_move_is_turned_and_reused(
    family: str, first_has_image: bool
) -> None:
    """Turn 1 (text only, or one image) is stored in a real ``PromptCache``; turn 2 (turn 1,
    an answer, then a new image: Codex's ``view_image`` turn) is served from it, its keys
    turned from turn 1's move to its own, and only the rest is prefilled: the logits are
    mlx-vlm's of the whole of turn 2."""
    model = loaded(family)
    vision = model.vision
    assert vision is not None

    def render(chat: list[dict[str, Any]]) -> list[int]:
        return vision.render(chat, lambda c: render_prompt(model.tokenizer, c))

    first_image = [ImageRef(picture((255, 0, 0), (84, 84)))] if first_has_image else []
    turn = [{"role": "user", "content": content_of([*first_image, QUESTION])}]
    first = render(turn)
    cache = PromptCache(1 << 30, 8)
    start = vision_prefill(vision, model.model, first, vision.images_for(first), None, 0, 512)
    layers = start.cache if start.cache is not None else None
    if layers is None:
        from mlx_lm.models.cache import make_prompt_cache

        layers = make_prompt_cache(model.model)
    model.model(mx.array(start.prompt[start.start :])[None], cache=layers)
    cache.store("t", first, layers)

    second = render(
        [
            *turn,
            {"role": "assistant", "content": "red"},
            {"role": "user", "content": (ImageRef(picture((0, 0, 255), (300, 200))),)},
        ]
    )
    reuse = cache.fetch("t", second)
    assert reuse.tokens == len(first)
    assert reuse.moved == moved_of(first[0]) != moved_of(second[0])
    turned = moved(model.model, reuse, second)
    assert turned is not None
    start = vision_prefill(
        vision, model.model, second, vision.images_for(second), turned, reuse.tokens, 7
    )
    assert start.reused == len(first)
    ours = model.model(mx.array(start.prompt[start.start :])[None], cache=start.cache)[0, -1]
    theirs = whole_forward(family, vision, second)
    assert float(mx.abs(ours - theirs).max().item()) < 1e-3
    # Unturned, the same reuse is wrong: the test sees the move.
    stale = vision_prefill(
        vision, model.model, second, vision.images_for(second), reuse.cache, reuse.tokens, 7
    )
    wrong = model.model(mx.array(stale.prompt[stale.start :])[None], cache=stale.cache)[0, -1]
    assert float(mx.abs(wrong - theirs).max().item()) > 1e-3


@pytest.mark.parametrize("family", list(SIZES))
def test_a_prefill_into_a_reused_prefix_leaves_the_stored_entry_as_it_was(family: str) -> None:
    """Two prompts that differ before the same image share a few tokens: the second is
    prefilled into the first's fetched (trimmed) cache, and the first, served again from the
    cache, still gives mlx-vlm's logits (the stored arrays were not written into)."""
    model = loaded(family)
    vision = model.vision
    assert vision is not None
    image = ImageRef(picture((0, 255, 0), (84, 84)))

    def render(text: str) -> list[int]:
        return vision.render(
            [{"role": "user", "content": (text, image, QUESTION)}],
            lambda c: render_prompt(model.tokenizer, c),
        )

    def run(prompt: list[int], cache: Any, reused: int) -> Any:
        start = vision_prefill(
            vision, model.model, prompt, vision.images_for(prompt), cache, reused, 512
        )
        if start.start < len(prompt) - 1:
            model.model(mx.array(start.prompt[start.start : -1])[None], cache=start.cache)
        return start.cache, model.model(mx.array(start.prompt[-1:])[None], cache=start.cache)[0, -1]

    cache = PromptCache(1 << 30, 8)
    first, second = render("Look. "), render("See. ")
    layers, _ = run(first, None, 0)
    cache.store("t", first, layers)
    reuse = cache.fetch("t", second)
    assert 0 < reuse.tokens < image_runs(second)[0][0]
    run(second, moved(model.model, reuse, second), reuse.tokens)
    again = cache.fetch("t", first)
    assert again.tokens == len(first) - 1
    _, ours = run(first, again.cache, again.tokens)
    assert float(mx.abs(ours - whole_forward(family, vision, first)).max().item()) < 1e-3
