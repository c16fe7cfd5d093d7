"""The pure parts of image input: images as typed parts of an item's content, items that carry
them, image runs in a rendered prompt, the prompt-cache key of an image prompt, the
prepared-image registry, and what an Admit leaves out of an image the prompt cache holds."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlx_responses.engine.vision import (
    Prepared,
    _Registry,
    image_arrays,
    image_runs,
    shift_tag,
    untag,
)
from mlx_responses.engine.vision_prefill import keyed
from mlx_responses.protocol.anthropic.messages import decode_messages
from mlx_responses.protocol.errors import ApiError
from mlx_responses.protocol.items.conversation import parse_item as parse_conversation_item
from mlx_responses.protocol.items.images import (
    ImageRef,
    Piece,
    content_of,
    content_parts,
    holds_images,
    join_content,
    pieces_of,
    text_of,
)
from mlx_responses.protocol.items.read import parse_item, read_item
from mlx_responses.protocol.items.values import Compaction, FunctionCallOutput, InputMessage
from mlx_responses.protocol.items.write import item_json
from mlx_responses.text.chat import to_chat

RED = ImageRef("data:image/png;base64,AAAA", "low")
BLUE = ImageRef("data:image/png;base64,BB")


def test_content_is_text_runs_and_images_in_order() -> None:
    content = content_of(["before ", "", RED, " af", "ter", BLUE])
    assert content == ("before ", RED, " after", BLUE)
    assert content_parts(content, "input_text")[1] == {
        "type": "input_image",
        "image_url": RED.url,
        "detail": "low",
    }
    assert text_of(content, "<img>") == "before <img> after<img>"
    # Without an image it is plain text, however it was built.
    assert content_of(["a", "", "b"]) == "ab"
    assert join_content(["x", ("y", RED)], "\n\n") == ("x\n\ny", RED)
    assert not holds_images("\ue000image auto data:image/png;base64,AA\ue001")


pieces = st.lists(st.one_of(st.text(max_size=4), st.sampled_from([RED, BLUE])), max_size=6)


@given(pieces)
def test_content_is_normalized_whatever_its_pieces(raw: list[Piece]) -> None:
    content = content_of(raw)
    assert text_of(content, "|") == "".join("|" if isinstance(p, ImageRef) else p for p in raw)
    assert content_of(pieces_of(content)) == content
    assert holds_images(content) == any(isinstance(p, ImageRef) for p in raw)
    assert "" not in pieces_of(content)


def test_stored_items_with_images_read_back_as_they_were() -> None:
    message = InputMessage("user", (RED, "What colour?"))
    output = FunctionCallOutput("call_1", (RED,))
    custom = FunctionCallOutput("call_2", ("seen: ", RED), custom=True)
    for item in (message, output, custom):
        shaped = item_json(item, "id_1")
        assert read_item(shaped) == item
    listed = item_json(message, "id_1")
    assert [p["type"] for p in listed["content"]] == ["input_image", "input_text"]
    # The stored shape is the one the API always listed.
    assert item_json(output, "id_2")["output"] == [
        {"type": "input_image", "image_url": RED.url, "detail": "low"}
    ]


def test_an_image_the_edge_accepted_is_a_typed_part_of_the_item() -> None:
    # The edge puts an ImageRef in place of the part it checked; no client JSON holds one.
    item: dict[str, Any] = {
        "role": "user",
        "content": [RED, {"type": "input_text", "text": "What colour?"}],
    }
    assert parse_item(item, "input[0]") == InputMessage("user", (RED, "What colour?"))
    output = {"type": "function_call_output", "call_id": "c", "output": [BLUE]}
    assert parse_item(output, "input[0]") == FunctionCallOutput("c", (BLUE,))


def test_a_clients_input_image_is_still_refused_by_the_parser() -> None:
    # Only the HTTP edge turns an image part into an ImageRef; the parser itself never does.
    item: dict[str, Any] = {
        "role": "user",
        "content": [{"type": "input_image", "image_url": RED.url}],
    }
    with pytest.raises(ApiError, match="text-only"):
        parse_item(item, "input[0]")


def test_client_text_holding_u_e000_is_ordinary_text() -> None:
    # What the old marker looked like is text now: it is neither refused nor an image.
    posing = f"\ue000image auto {RED.url}\ue001What colour?"
    item = parse_item({"role": "user", "content": posing}, "input[0]")
    assert item == InputMessage("user", posing)
    assert read_item(item_json(item, "id_1")) == item
    chat = to_chat(posing, [item])
    assert [m["content"] for m in chat] == [posing, posing]


def test_images_in_chat_messages_keep_their_places() -> None:
    items = [
        InputMessage("system", ("look: ", RED)),
        InputMessage("user", (BLUE, "which?")),
        FunctionCallOutput("c", (RED,)),
    ]
    chat = to_chat("Be brief.", items)
    assert chat[0]["content"] == ("Be brief.\n\nlook: ", RED)
    assert chat[1]["content"] == (BLUE, "which?")


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


texts = st.text(max_size=6)
contents = st.builds(
    content_of, st.lists(st.one_of(texts, st.sampled_from([RED, BLUE])), max_size=5)
)


@given(contents, contents, st.sampled_from(["user", "system", "developer"]))
def test_items_with_images_round_trip_through_their_stored_shape(
    message_content: Any, output_content: Any, role: Any
) -> None:
    """``read_item(item_json(x)) == x`` for any content, a compaction's retained items
    included; a content without images keeps the one-part shape the API always listed."""
    message = InputMessage(role, message_content)
    output = FunctionCallOutput("call_1", output_content)
    compaction = Compaction("summary", (message, output))
    for item in (message, output, compaction):
        assert read_item(item_json(item, "id_1")) == item
    shaped = item_json(message, "id_1")
    if isinstance(output_content, str):
        assert item_json(output, "id_2")["output"] == output_content
    if isinstance(message_content, str):
        assert shaped["content"] == [{"type": "input_text", "text": message_content}]
    else:
        assert [p["type"] for p in shaped["content"]] == [
            "input_image" if isinstance(p, ImageRef) else "input_text" for p in message_content
        ]


def test_anthropic_image_blocks_the_edge_accepted_are_typed_parts() -> None:
    # The edge puts an ImageRef in place of each image block (of a message or a tool_result).
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Look: "}, RED]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "see", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [BLUE], "is_error": True},
                {"type": "text", "text": "which?"},
            ],
        },
    ]
    items = decode_messages(messages)
    assert items[0] == InputMessage("user", ("Look: ", RED))
    assert items[2] == FunctionCallOutput("t1", ("Error: ", BLUE))
    assert items[3] == InputMessage("user", "which?")
    # Two user messages in a row are one, their images kept in place.
    merged = decode_messages(
        [{"role": "user", "content": [RED]}, {"role": "user", "content": "hi"}]
    )
    assert merged == (InputMessage("user", (RED, "\n\nhi")),)


def test_a_conversation_stores_an_accepted_image_as_its_input_image_part() -> None:
    stored = parse_conversation_item(
        {"type": "message", "role": "user", "content": [RED, {"type": "input_text", "text": "?"}]},
        "items[0]",
    )
    assert stored["content"] == [
        {"type": "input_image", "image_url": RED.url, "detail": "low"},
        {"type": "input_text", "text": "?"},
    ]
    assert read_item(stored) == InputMessage("user", (RED, "?"))
