"""The pure parts of image input (issue 27): markers in text, items that carry them, image runs
in a rendered prompt, the prompt-cache key of an image prompt, the prepared-image registry."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from mlx_responses.model.vision import (
    Prepared,
    _Registry,
    image_arrays,
    image_runs,
    shift_tag,
    untag,
)
from mlx_responses.model.vision_prefill import keyed
from mlx_responses.protocol.errors import ApiError
from mlx_responses.protocol.images import ImageRef, image_parts, marker, split_text
from mlx_responses.protocol.item_json import item_json
from mlx_responses.protocol.item_types import FunctionCallOutput, InputMessage
from mlx_responses.protocol.items import parse_item, read_item

RED = ImageRef("data:image/png;base64,AAAA", "low")


def test_a_marker_round_trips_inside_text() -> None:
    text = "before " + marker(RED) + " after" + marker(ImageRef("data:image/png;base64,BB"))
    assert split_text(text) == [
        "before ",
        RED,
        " after",
        ImageRef("data:image/png;base64,BB", "auto"),
    ]
    assert image_parts(text, "input_text")[1] == {
        "type": "input_image",
        "image_url": RED.url,
        "detail": "low",
    }


def test_stored_items_with_images_read_back_as_they_were() -> None:
    message = InputMessage("user", marker(RED) + "What colour?")
    output = FunctionCallOutput("call_1", marker(RED))
    custom = FunctionCallOutput("call_2", "seen: " + marker(RED), custom=True)
    for item in (message, output, custom):
        shaped = item_json(item, "id_1")
        assert read_item(shaped) == item
    listed = item_json(message, "id_1")
    assert [p["type"] for p in listed["content"]] == ["input_image", "input_text"]


def test_a_clients_input_image_is_still_refused_by_the_parser() -> None:
    # The HTTP edge turns accepted images into markers first; the parser itself never does.
    item: dict[str, Any] = {
        "role": "user",
        "content": [{"type": "input_image", "image_url": RED.url}],
    }
    with pytest.raises(ApiError, match="text-only"):
        parse_item(item, "input[0]")


def test_image_runs_and_the_cache_key_of_an_image_prompt() -> None:
    prompt = [5, 6, -7, -7, -7, 8, -9, -9, 10]
    assert image_runs(prompt) == [(2, 5, 7), (6, 8, 9)]
    model_ids = [5, 6, 1, 1, 1, 8, 1, 1, 10, 11, 12]  # the generator's tokens, reply included
    assert keyed(model_ids, prompt) == (5, 6, -7, -7, -7, 8, -9, -9, 10, 11, 12)


def test_the_registry_keeps_the_newest_within_its_bounds() -> None:
    registry = _Registry(capacity=2, max_bytes=100)

    def prepared(handle: int, size: int) -> Prepared:
        return Prepared(handle, {"pixel_values": np.zeros(size, np.uint8)}, (-handle,))

    registry.put(("a", "auto"), prepared(1, 40))
    registry.put(("b", "auto"), prepared(2, 40))
    registry.put(("c", "auto"), prepared(3, 40))  # over both bounds: the oldest goes
    assert registry.get(1) is None
    assert registry.get(2) is not None
    assert registry.by_url(("c", "auto")) is not None
    registry.put(("d", "auto"), prepared(4, 500))  # alone over the byte bound: still kept
    assert registry.get(4) is not None
    assert registry.get(2) is None


def test_a_moved_prompt_is_keyed_apart_from_unmoved_ones() -> None:
    tagged = shift_tag(6, 151644)
    assert tagged < 0
    assert untag(tagged) == 151644
    assert untag(42) == 42
    # The tag is not an image: the runs are the images only.
    assert image_runs([tagged, 5, -7, -7, 8]) == [(2, 4, 7)]


def test_an_image_travels_as_plain_bytes_and_is_dropped_with_its_entry() -> None:
    pixels = np.arange(24, dtype=np.float32).reshape(4, 6)
    grid = np.array([[1, 2, 2]], dtype=np.int64)
    prepared = Prepared(7, {"pixel_values": pixels, "image_grid_thw": grid}, (5, -7, -7, 6))
    plain = prepared.plain()
    # What an Admit carries: picklable, comparable, and the same arrays on the other side.
    assert pickle.loads(pickle.dumps(plain)) == plain
    assert plain.tokens == 2
    back = image_arrays(plain)
    assert back["pixel_values"].dtype == np.float32
    assert np.array_equal(back["pixel_values"], pixels)
    assert np.array_equal(back["image_grid_thw"], grid)
    registry = _Registry(capacity=1)
    registry.put(("a", "auto"), prepared)
    assert registry.plain(7) == plain
    registry.put(("b", "auto"), Prepared(8, {"pixel_values": pixels}, (-8,)))
    assert registry.plain(7) is None  # evicted: the edge renders the prompt again
