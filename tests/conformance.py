"""Strict conformance checks for Response objects and SSE streams (shared/design/testing.md).

The SDK builds objects without validating them, so "it parsed with the SDK" proves little.
These helpers validate with the SDK's pydantic models in strict mode, reject every key a model
does not define (SDK models allow extras, so a typo would otherwise pass), and check the stream
invariants of decision 8. Every failure is an ``AssertionError`` naming the path or event.

Import as ``from tests.conformance import ...`` (``tests`` is a package).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar, get_args

import pydantic
from openai.types.responses import Response
from openai.types.responses.response_stream_event import ResponseStreamEvent

from mlx_responses.protocol.sse import SseDecoder

__all__ = [
    "EVENT_MODELS",
    "TERMINAL_EVENT_TYPES",
    "assert_no_unknown_keys",
    "assert_stream_invariants",
    "assert_strict_event",
    "assert_strict_response",
    "parse_sse",
    "unknown_keys",
]

TERMINAL_EVENT_TYPES = frozenset(
    {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}
)
_TERMINAL_STATUS = {
    "response.completed": "completed",
    "response.incomplete": "incomplete",
    "response.failed": "failed",
    "response.cancelled": "cancelled",
}


# --- Our extension events, modelled the way the SDK models its own (extras allowed, walked) ---


class _Extension(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")


class ResponseCancelledEvent(_Extension):
    """Decision 8: the SDK has no class for this terminal event."""

    response: Response
    sequence_number: int
    type: Literal["response.cancelled"]


class MlxCompactionStartedEvent(_Extension):
    """Spec 000, Compaction."""

    input_tokens: int
    response_id: str
    sequence_number: int
    type: Literal["mlx.compaction.started"]


class MlxCompactionCompletedEvent(_Extension):
    """Spec 000, Compaction."""

    input_tokens_after: int
    input_tokens_before: int
    response_id: str
    sequence_number: int
    type: Literal["mlx.compaction.completed"]


def _event_models() -> dict[str, type[pydantic.BaseModel]]:
    # ResponseStreamEvent is Annotated[Union[...], PropertyInfo]; unwrap to the member classes.
    (union, *_) = get_args(ResponseStreamEvent)
    models: dict[str, type[pydantic.BaseModel]] = {}
    members: list[type[pydantic.BaseModel]] = [
        *get_args(union),
        ResponseCancelledEvent,
        MlxCompactionStartedEvent,
        MlxCompactionCompletedEvent,
    ]
    for cls in members:
        (type_name,) = get_args(cls.model_fields["type"].annotation)
        assert type_name not in models, f"two event classes claim {type_name!r}"
        models[type_name] = cls
    return models


EVENT_MODELS: Mapping[str, type[pydantic.BaseModel]] = _event_models()
"""Event ``type`` -> the one class that validates it (SDK classes plus our extensions)."""


# --- Strict validation ----------------------------------------------------------------------


def unknown_keys(value: object, path: str = "$") -> list[str]:
    """Paths of keys that no model along the validated tree declares (``model_extra``)."""
    found: list[str] = []
    if isinstance(value, pydantic.BaseModel):
        found.extend(f"{path}.{key}" for key in value.model_extra or {})
        for name in type(value).model_fields:
            found.extend(unknown_keys(getattr(value, name), f"{path}.{name}"))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found.extend(unknown_keys(item, f"{path}[{index}]"))
    elif isinstance(value, dict):
        for key, item in value.items():
            found.extend(unknown_keys(item, f"{path}.{key}"))
    return found


def assert_no_unknown_keys(model: pydantic.BaseModel, what: str) -> None:
    extra = unknown_keys(model)
    assert not extra, f"{what}: keys the SDK model does not define: {extra}"


_M = TypeVar("_M", bound=pydantic.BaseModel)


def _strict(cls: type[_M], data: Mapping[str, Any], what: str) -> _M:
    # Validate the JSON text, as a client would see it: this also proves the dict is JSON
    # (no NaN, no tuples, no non-str keys). Strict mode: no str->int coercion and the like.
    try:
        text = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise AssertionError(f"{what}: not JSON-serialisable: {exc}") from None
    try:
        model = cls.model_validate_json(text, strict=True)
    except pydantic.ValidationError as exc:
        raise AssertionError(f"{what}: fails strict {cls.__name__}:\n{exc}") from None
    assert_no_unknown_keys(model, what)
    return model


def _check_response_extras(data: Mapping[str, Any], what: str) -> None:
    """Our own promises on top of the SDK's types."""
    # The SDK types timestamps as float; OpenAI (and we) send integer seconds.
    for key in ("created_at", "completed_at"):
        value = data.get(key)
        assert value is None or (type(value) is int), f"{what}.{key} is not an int: {value!r}"
    assert data.get("background", True) is True, (
        f"{what}: a foreground response must have no `background` key, got {data['background']!r}"
    )
    assert data.get("status") is not None, f"{what}: status missing"


def assert_strict_response(data: Mapping[str, Any], what: str = "response") -> Response:
    """Validate a Response object strictly; return the SDK model."""
    model = _strict(Response, data, what)
    _check_response_extras(data, what)
    return model


def assert_strict_event(data: Mapping[str, Any]) -> pydantic.BaseModel:
    """Validate one stream event with the class its ``type`` selects; return the model."""
    event_type = data.get("type")
    what = f"event #{data.get('sequence_number')} {event_type!r}"
    assert isinstance(event_type, str), f"{what}: no string `type`"
    cls = EVENT_MODELS.get(event_type)
    assert cls is not None, f"{what}: unknown event type"
    model = _strict(cls, data, what)
    if "response" in data:
        _check_response_extras(data["response"], f"{what}.response")
    return model


# --- Stream invariants ----------------------------------------------------------------------


def parse_sse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """Decode a whole SSE body; it must end on an event boundary."""
    decoder = SseDecoder()
    events = decoder.feed(raw)
    assert decoder.at_boundary, f"SSE body ends inside an event: {raw[-200:]!r}"
    return events


def _text_parts(item: Mapping[str, Any]) -> list[tuple[int, str]]:
    if item.get("type") != "message":
        return []
    return [
        (index, part["text"])
        for index, part in enumerate(item.get("content", []))
        if part.get("type") == "output_text"
    ]


def assert_stream_invariants(events: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """Check a whole stream (``(event line, data)`` pairs); return the final Response object."""
    assert events, "empty stream"
    for index, (name, data) in enumerate(events):
        assert name == data.get("type"), (
            f"event #{index}: `event: {name}` but type {data['type']!r}"
        )
        assert data.get("sequence_number") == index, (
            f"event #{index} ({name}): sequence_number {data.get('sequence_number')!r}, "
            f"expected {index}"
        )
        assert_strict_event(data)

    types = [data["type"] for _, data in events]
    assert types[0] == "response.created", f"first event is {types[0]!r}, not response.created"
    terminals = [i for i, t in enumerate(types) if t in TERMINAL_EVENT_TYPES]
    assert len(terminals) == 1, f"expected exactly one terminal event, got {terminals} in {types}"
    assert terminals[0] == len(events) - 1, f"terminal event #{terminals[0]} is not last"

    final: dict[str, Any] = dict(events[-1][1]["response"])
    assert final["status"] == _TERMINAL_STATUS[types[-1]], (
        f"{types[-1]} carries status {final['status']!r}"
    )
    for name, data in events[:-1]:
        if "response" in data:
            status = data["response"]["status"]
            assert status in ("queued", "in_progress"), f"{name} before the terminal is {status!r}"
    ids = {data["response"]["id"] for _, data in events if "response" in data}
    assert len(ids) == 1, f"response ids differ across events: {ids}"

    added: dict[int, Mapping[str, Any]] = {}  # output_index -> item
    done: dict[int, Mapping[str, Any]] = {}
    open_parts: dict[tuple[str, int], str] = {}  # (item_id, content_index) -> deltas so far
    done_texts: dict[tuple[str, int], str] = {}
    done_parts: dict[tuple[str, int], Mapping[str, Any]] = {}

    def open_item_id(data: Mapping[str, Any], what: str) -> str:
        index = data["output_index"]
        item = added.get(index)
        assert item is not None, f"{what}: output_index {index} was never added"
        assert index not in done, f"{what}: output_index {index} is already done"
        assert item["id"] == data["item_id"], (
            f"{what}: item_id {data['item_id']!r} but output_index {index} is {item['id']!r}"
        )
        return str(item["id"])

    for seq, (_, data) in enumerate(events):
        kind, what = data["type"], f"event #{seq} {data['type']}"
        if kind == "response.output_item.added":
            index = data["output_index"]
            assert index == len(added), f"{what}: output_index {index}, expected {len(added)}"
            added[index] = data["item"]
        elif kind == "response.output_item.done":
            index, item = data["output_index"], data["item"]
            assert index in added, f"{what}: output_index {index} was never added"
            assert index not in done, f"{what}: output_index {index} done twice"
            assert (item["id"], item["type"]) == (added[index]["id"], added[index]["type"]), (
                f"{what}: done item {item['id']}/{item['type']} does not match added "
                f"{added[index]['id']}/{added[index]['type']}"
            )
            still_open = [key for key in open_parts if key[0] == item["id"]]
            assert not still_open, f"{what}: content parts still open: {still_open}"
            for content_index, text in _text_parts(item):
                key = (item["id"], content_index)
                assert done_texts.get(key) == text, (
                    f"{what}: part {content_index} text {text!r} != output_text.done "
                    f"{done_texts.get(key)!r}"
                )
            done[index] = item
        elif kind == "response.content_part.added":
            key = (open_item_id(data, what), data["content_index"])
            assert key not in open_parts, f"{what}: part {key} added twice"
            assert key not in done_parts, f"{what}: part {key} added again after done"
            assert data["part"].get("text", "") == "", f"{what}: part added with text"
            open_parts[key] = ""
        elif kind == "response.output_text.delta":
            key = (open_item_id(data, what), data["content_index"])
            assert key in open_parts, f"{what}: part {key} not open"
            assert key not in done_texts, f"{what}: part {key} text already done"
            open_parts[key] += data["delta"]
        elif kind == "response.output_text.done":
            key = (open_item_id(data, what), data["content_index"])
            assert key in open_parts, f"{what}: part {key} not open"
            assert key not in done_texts, f"{what}: part {key} text already done"
            assert data["text"] == open_parts[key], (
                f"{what}: text {data['text']!r} != concatenated deltas {open_parts[key]!r}"
            )
            done_texts[key] = data["text"]
        elif kind == "response.content_part.done":
            key = (open_item_id(data, what), data["content_index"])
            assert key in open_parts, f"{what}: part {key} not open"
            if data["part"].get("type") == "output_text":
                assert data["part"]["text"] == done_texts.get(key), (
                    f"{what}: part text != output_text.done text"
                )
            done_parts[key] = data["part"]
            del open_parts[key]

    unclosed = sorted(set(added) - set(done))
    if types[-1] != "response.failed":
        # A failed stream may abandon an open item (machine.py); every other terminal closes all.
        assert not unclosed, f"output items added but never done: {unclosed}"
    done_items = [dict(done[index]) for index in sorted(done)]
    assert final["output"] == done_items, (
        f"final output != output_item.done items:\n{final['output']}\n!=\n{done_items}"
    )
    final_text = "".join(text for item in final["output"] for _, text in _text_parts(item))
    done_ids = {item["id"] for item in done_items}
    streamed = "".join(
        done_texts[key] for key in sorted(done_texts, key=_part_order(added)) if key[0] in done_ids
    )
    assert final_text == streamed, f"final text {final_text!r} != streamed {streamed!r}"
    assert_strict_response(final, "final response")
    return final


def _part_order(added: Mapping[int, Mapping[str, Any]]) -> Any:
    position = {item["id"]: index for index, item in added.items()}
    return lambda key: (position[key[0]], key[1])
