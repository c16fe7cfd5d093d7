"""Property tests for the pure conversation item rules (``protocol.conversation_items``).

Generated valid items must become stored items that the pinned SDK's ``ConversationItem``
validates strictly with no undeclared key, keep their text, roles and call fields, and be
valid input again (clients such as the Agents SDK replay what they read). Any other JSON is
refused with a 400 whose ``param`` is a path inside ``items``, never another exception.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.conversations import ConversationItem

from mlx_responses.http.conversations import parse_list_query
from mlx_responses.protocol.errors import ApiError
from mlx_responses.protocol.items.conversation import (
    MAX_ITEMS_PER_REQUEST,
    parse_create_body,
    parse_items,
    parse_items_body,
    parse_metadata,
    parse_update_body,
)

from .conformance import unknown_keys

_ITEM = pydantic.TypeAdapter[Any](ConversationItem)

text = st.text(max_size=20)
ident = st.text(min_size=1, max_size=12)


def counting_mint() -> Callable[[str], str]:
    counter = itertools.count()
    return lambda prefix: f"{prefix}_{next(counter)}"


def parts_for(role: str) -> st.SearchStrategy[list[dict[str, Any]]]:
    input_text = st.builds(lambda t: {"type": "input_text", "text": t}, text)
    if role != "assistant":
        return st.lists(input_text, max_size=3)
    output_text = st.builds(
        lambda t, extra: {"type": "output_text", "text": t, **extra},
        text,
        st.sampled_from([{}, {"annotations": []}, {"annotations": [], "logprobs": []}]),
    )
    refusal = st.builds(lambda t: {"type": "refusal", "refusal": t}, text)
    return st.lists(st.one_of(output_text, refusal, input_text), max_size=3)


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["user", "system", "developer", "assistant"]))
    item: dict[str, Any] = {"role": role, "content": draw(st.one_of(text, parts_for(role)))}
    if draw(st.booleans()):
        item["type"] = "message"
    if draw(st.booleans()):
        item["id"] = draw(st.sampled_from(["msg_x", "anything", None]))
    if draw(st.booleans()):
        item["status"] = draw(st.sampled_from(["in_progress", "completed", "incomplete", None]))
    if role == "assistant" and draw(st.booleans()):
        item["phase"] = draw(st.sampled_from(["commentary", "final_answer", None]))
    return item


function_calls = st.builds(
    lambda call_id, name, arguments: {
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    },
    ident,
    ident,
    text,
)
function_outputs = st.builds(
    lambda call_id, output: {"type": "function_call_output", "call_id": call_id, "output": output},
    ident,
    st.one_of(text, parts_for("user")),
)
valid_items = st.one_of(messages(), function_calls, function_outputs)
valid_lists = st.lists(valid_items, max_size=MAX_ITEMS_PER_REQUEST)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=12,
)


def attempt(parse: Callable[..., Any], *args: Any) -> Any:
    """What ``parse`` returns, or the ``ApiError`` it raises."""
    try:
        return parse(*args)
    except ApiError as error:
        return error


def text_of(item: dict[str, Any]) -> str:
    content = item.get("content", item.get("output"))
    if isinstance(content, str):
        return content
    return "".join(part.get("text", part.get("refusal", "")) for part in content or [])


def assert_strict_item(item: dict[str, Any]) -> None:
    model = _ITEM.validate_json(json.dumps(item), strict=True)
    assert not unknown_keys(model), unknown_keys(model)


@given(valid_lists)
def test_valid_items_become_strict_sdk_items(raw: list[dict[str, Any]]) -> None:
    stored = parse_items(raw, counting_mint(), allow_empty=True)
    assert len(stored) == len(raw)
    assert len({item["id"] for item in stored}) == len(stored)
    for given_item, item in zip(raw, stored, strict=True):
        assert_strict_item(item)
        assert item["status"] == "completed"
        assert text_of(item) == text_of(given_item)
        if item["type"] == "message":
            assert item["id"].startswith("msg_")
            assert item["role"] == given_item["role"]
            kinds = {part["type"] for part in item["content"]}
            if isinstance(given_item["content"], str):
                assert kinds == {"output_text" if item["role"] == "assistant" else "input_text"}
        else:
            assert item["id"].startswith("fc_")
            assert item["call_id"] == given_item["call_id"]
            assert item["type"] == given_item["type"]


@given(valid_lists)
def test_stored_items_are_valid_input_again(raw: list[dict[str, Any]]) -> None:
    stored = parse_items(raw, counting_mint(), allow_empty=True)
    again = parse_items(json.loads(json.dumps(stored)), counting_mint(), allow_empty=True)
    assert again == stored  # same counting minter, so the fresh ids coincide too


MUTATIONS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("unknown key", lambda item: item.__setitem__("zz_unknown", 1), "zz_unknown"),
    ("hosted type", lambda item: item.__setitem__("type", "web_search_call"), "type"),
    ("type a number", lambda item: item.__setitem__("type", 3), "type"),
    ("status bogus", lambda item: item.__setitem__("status", "done"), "status"),
    ("id a number", lambda item: item.__setitem__("id", 5), "id"),
]


@given(valid_lists.filter(bool), st.data())
def test_a_bad_item_is_refused_at_its_path(raw: list[dict[str, Any]], data: st.DataObject) -> None:
    index = data.draw(st.integers(0, len(raw) - 1))
    _, mutate, key = data.draw(st.sampled_from(MUTATIONS))
    mutate(raw[index])
    with pytest.raises(ApiError) as caught:
        parse_items(raw, counting_mint(), allow_empty=True)
    assert caught.value.status == 400
    assert caught.value.param == f"items[{index}].{key}"
    assert f"items[{index}].{key}" in caught.value.message


@given(valid_lists.filter(bool), st.data())
def test_bad_message_fields_are_refused_at_their_path(
    raw: list[dict[str, Any]], data: st.DataObject
) -> None:
    index = data.draw(st.integers(0, len(raw) - 1))
    item = raw[index]
    if item.get("type", "message") != "message":
        item.clear()
        item.update({"role": "user", "content": "x"})
    bad: list[tuple[str, object]] = [("role", "tool"), ("role", None), ("content", 7)]
    field, value = data.draw(st.sampled_from([*bad, ("content", {})]))
    item[field] = value
    with pytest.raises(ApiError) as caught:
        parse_items(raw, counting_mint(), allow_empty=True)
    assert caught.value.param == f"items[{index}].{field}"


@given(json_values)
def test_any_json_is_stored_strictly_or_refused_inside_items(value: Any) -> None:
    for raw in (value, [value]):
        outcome = attempt(lambda r: parse_items(r, counting_mint(), allow_empty=True), raw)
        if isinstance(outcome, ApiError):
            assert outcome.status == 400
            assert outcome.param is not None
            assert outcome.param.startswith("items")
        else:
            for item in outcome:
                assert_strict_item(item)


@given(st.lists(valid_items, min_size=MAX_ITEMS_PER_REQUEST + 1, max_size=30))
def test_more_than_twenty_items_is_refused(raw: list[dict[str, Any]]) -> None:
    with pytest.raises(ApiError) as caught:
        parse_items(raw, counting_mint(), allow_empty=True)
    assert caught.value.param == "items"


@given(
    st.dictionaries(
        st.text(max_size=70), st.one_of(st.text(max_size=520), st.integers()), max_size=18
    )
)
def test_metadata_limits(metadata: dict[str, Any]) -> None:
    valid = len(metadata) <= 16 and all(
        len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in metadata.items()
    )
    outcome = attempt(parse_metadata, metadata)
    if isinstance(outcome, ApiError):
        assert not valid
        assert outcome.param is not None
        assert outcome.param.startswith("metadata")
    else:
        assert valid
        assert outcome == metadata


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=4))
def test_bodies_accept_only_their_keys(body: dict[str, Any]) -> None:
    for parse, keys in (
        (parse_create_body, {"items", "metadata"}),
        (parse_update_body, {"metadata"}),
        (parse_items_body, {"items"}),
    ):
        outcome = attempt(parse, body)
        unknown = sorted(set(body) - keys)
        if isinstance(outcome, ApiError):
            assert outcome.status == 400
            if unknown:
                assert outcome.param == unknown[0]
        else:
            assert not unknown


@given(
    st.dictionaries(
        st.sampled_from(["limit", "order", "after", "include[]", "other"]),
        st.lists(st.text(max_size=5), min_size=1, max_size=2),
    )
)
def test_list_query(args: dict[str, list[str]]) -> None:
    query = attempt(parse_list_query, args)
    if isinstance(query, ApiError):
        assert query.status == 400
        assert query.param in {"limit", "order", "after", "include"}
    else:
        assert 1 <= query.limit <= 100
        assert query.order in ("asc", "desc")
        assert query.limit == int(args.get("limit", ["20"])[0])
        assert query.order == args.get("order", ["desc"])[0]
        assert query.after == args.get("after", [None])[0]
