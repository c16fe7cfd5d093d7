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
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, get_args

import pydantic
from openai.types.responses import CompactedResponse, Response, ResponseItemList
from openai.types.responses.response_stream_event import ResponseStreamEvent

from mlx_responses.protocol.events.sse import SseDecoder

__all__ = [
    "EVENT_MODELS",
    "TERMINAL_EVENT_TYPES",
    "assert_no_unknown_keys",
    "assert_stream_invariants",
    "assert_strict_compaction",
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


# Decision 21: Open Responses requires these on every Response (and on every event's
# `response`); the pinned SDK's Response model does not declare them (docs/api.md).
RESPONSE_EXTENSION_KEYS = frozenset({"store", "presence_penalty", "frequency_penalty"})
_EXTENSION_PATHS = frozenset(
    f"{root}.{key}" for root in ("$", "$.response") for key in RESPONSE_EXTENSION_KEYS
)


def assert_no_unknown_keys(model: pydantic.BaseModel, what: str) -> None:
    extra = unknown_keys(model)
    if isinstance(model, Response) or isinstance(getattr(model, "response", None), Response):
        extra = [path for path in extra if path not in _EXTENSION_PATHS]
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


def _check_response_extras(data: Mapping[str, Any], what: str, background_key: bool) -> None:
    """Our own promises on top of the SDK's types. ``background_key``: the server runs with
    ``--background-key always`` (every Response says ``background``)."""
    # The SDK types timestamps as float; OpenAI (and we) send integer seconds.
    for key in ("created_at", "completed_at"):
        value = data.get(key)
        assert value is None or (type(value) is int), f"{what}.{key} is not an int: {value!r}"
    if background_key:
        assert type(data.get("background")) is bool, f"{what}: `background` missing"
    else:
        assert data.get("background", True) is True, (
            f"{what}: a foreground response must have no `background` key, got "
            f"{data['background']!r}"
        )
    assert data.get("status") is not None, f"{what}: status missing"
    missing = sorted(RESPONSE_EXTENSION_KEYS - set(data))
    assert not missing, f"{what}: Open Responses fields missing: {missing}"
    assert type(data["store"]) is bool, f"{what}.store is not a boolean"
    for key in ("presence_penalty", "frequency_penalty"):
        assert type(data[key]) in (int, float), f"{what}.{key} is not a number"


def assert_strict_response(
    data: Mapping[str, Any], what: str = "response", *, background_key: bool = False
) -> Response:
    """Validate a Response object strictly; return the SDK model."""
    model = _strict(Response, data, what)
    _check_response_extras(data, what, background_key)
    return model


def assert_strict_event(
    data: Mapping[str, Any], *, background_key: bool = False
) -> pydantic.BaseModel:
    """Validate one stream event with the class its ``type`` selects; return the model."""
    event_type = data.get("type")
    what = f"event #{data.get('sequence_number')} {event_type!r}"
    assert isinstance(event_type, str), f"{what}: no string `type`"
    cls = EVENT_MODELS.get(event_type)
    assert cls is not None, f"{what}: unknown event type"
    model = _strict(cls, data, what)
    if "response" in data:
        _check_response_extras(data["response"], f"{what}.response", background_key)
    return model


# --- Stream invariants ----------------------------------------------------------------------


def parse_sse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """Decode a whole SSE body; it must end on an event boundary."""
    decoder = SseDecoder()
    events = decoder.feed(raw)
    assert decoder.at_boundary, f"SSE body ends inside an event: {raw[-200:]!r}"
    return events


_PART_TYPES = {"message": ("output_text", "refusal"), "reasoning": ("reasoning_text",)}
"""Item type -> the content part types it may hold (a function_call holds none)."""
_TEXT_EVENTS = {
    "response.output_text.delta": "output_text",
    "response.output_text.done": "output_text",
    "response.reasoning_text.delta": "reasoning_text",
    "response.reasoning_text.done": "reasoning_text",
}
"""Text event type -> the part type it writes into."""


@dataclass
class _PartTrack:
    """One content part as the stream told it so far."""

    type: str
    deltas: list[str] = field(default_factory=list)
    delta_logprobs: list[Any] = field(default_factory=list)  # event-shaped, output_text only
    done_text: str | None = None
    done_logprobs: list[Any] | None = None
    done_part: Mapping[str, Any] | None = None


@dataclass
class _CallTrack:
    """One function call's arguments as the stream told them so far."""

    deltas: list[str] = field(default_factory=list)
    done_arguments: str | None = None


def _event_shape(logprobs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Part-shaped logprob entries as a text event carries them (``bytes`` dropped)."""
    return [
        {
            "token": entry["token"],
            "logprob": entry["logprob"],
            "top_logprobs": [
                {"token": top["token"], "logprob": top["logprob"]} for top in entry["top_logprobs"]
            ],
        }
        for entry in logprobs
    ]


def _check_added_item(item: Mapping[str, Any], what: str) -> None:
    """An item is added empty and in progress; its content arrives in later events."""
    assert item.get("status", "in_progress") == "in_progress", (
        f"{what}: item added with status {item.get('status')!r}"
    )
    if item["type"] == "function_call":
        assert item["arguments"] == "", f"{what}: call added with arguments {item['arguments']!r}"
    elif item["type"] in _PART_TYPES:
        assert not item.get("content"), f"{what}: item added with content {item['content']!r}"


def assert_stream_invariants(
    events: Sequence[tuple[str, Mapping[str, Any]]], *, background_key: bool = False
) -> dict[str, Any]:
    """Check a whole stream (``(event line, data)`` pairs); return the final Response object.

    Beyond strict validation of every event by its own class and the framing rules of decision
    8: items are added empty and ``in_progress`` and done once, with the same id and type; parts
    fit their item (``output_text`` in a message, ``reasoning_text`` in a reasoning item) and text
    events fit their part; text and argument deltas join to their ``.done``; ``output_text``
    logprobs join too, and equal the part's (``bytes`` aside); each done item holds exactly its
    done parts or ``.done`` arguments; the final output is the done items.
    """
    assert events, "empty stream"
    for index, (name, data) in enumerate(events):
        assert name == data.get("type"), (
            f"event #{index}: `event: {name}` but type {data['type']!r}"
        )
        assert data.get("sequence_number") == index, (
            f"event #{index} ({name}): sequence_number {data.get('sequence_number')!r}, "
            f"expected {index}"
        )
        assert_strict_event(data, background_key=background_key)

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
    parts: dict[tuple[str, int], _PartTrack] = {}  # (item_id, content_index) -> part
    calls: dict[str, _CallTrack] = {}  # item_id -> function call arguments

    def open_item(data: Mapping[str, Any], what: str) -> Mapping[str, Any]:
        index = data["output_index"]
        item = added.get(index)
        assert item is not None, f"{what}: output_index {index} was never added"
        assert index not in done, f"{what}: output_index {index} is already done"
        assert item["id"] == data["item_id"], (
            f"{what}: item_id {data['item_id']!r} but output_index {index} is {item['id']!r}"
        )
        return item

    def open_part(data: Mapping[str, Any], what: str) -> _PartTrack:
        key = (open_item(data, what)["id"], data["content_index"])
        part = parts.get(key)
        assert part is not None, f"{what}: part {key} was never added"
        assert part.done_part is None, f"{what}: part {key} is already done"
        return part

    def open_call(data: Mapping[str, Any], what: str) -> _CallTrack:
        item = open_item(data, what)
        assert item["type"] == "function_call", f"{what}: item {item['id']} is a {item['type']}"
        call = calls[item["id"]]
        assert call.done_arguments is None, f"{what}: arguments of {item['id']} already done"
        return call

    for seq, (_, data) in enumerate(events):
        kind, what = data["type"], f"event #{seq} {data['type']}"
        if kind == "response.output_item.added":
            index = data["output_index"]
            assert index == len(added), f"{what}: output_index {index}, expected {len(added)}"
            _check_added_item(data["item"], what)
            added[index] = data["item"]
            if data["item"]["type"] == "function_call":
                calls[data["item"]["id"]] = _CallTrack()
        elif kind == "response.output_item.done":
            index, item = data["output_index"], data["item"]
            assert index in added, f"{what}: output_index {index} was never added"
            assert index not in done, f"{what}: output_index {index} done twice"
            assert (item["id"], item["type"]) == (added[index]["id"], added[index]["type"]), (
                f"{what}: done item {item['id']}/{item['type']} does not match added "
                f"{added[index]['id']}/{added[index]['type']}"
            )
            # A hosted call the server ran may end failed (the SDK's web_search_call and
            # mcp_call statuses); every other item completes or is cut short.
            endings = ("completed", "incomplete")
            if item["type"] in ("web_search_call", "mcp_call"):
                endings = (*endings, "failed")
            assert item.get("status", "completed") in endings, (
                f"{what}: item done with status {item.get('status')!r}"
            )
            _check_done_item(item, added[index], parts, calls, what)
            done[index] = item
        elif kind == "response.content_part.added":
            item = open_item(data, what)
            key = (item["id"], data["content_index"])
            assert key not in parts, f"{what}: part {key} added twice"
            part_type = data["part"]["type"]
            assert part_type in _PART_TYPES.get(item["type"], ()), (
                f"{what}: a {part_type} part in a {item['type']} item"
            )
            assert data["part"].get("text", "") == "", f"{what}: part added with text"
            parts[key] = _PartTrack(part_type)
        elif kind in _TEXT_EVENTS:
            part = open_part(data, what)
            assert part.type == _TEXT_EVENTS[kind], f"{what}: writes into a {part.type} part"
            assert part.done_text is None, f"{what}: part text already done"
            if kind.endswith(".delta"):
                part.deltas.append(data["delta"])
                part.delta_logprobs.extend(data.get("logprobs", []))
                continue
            assert data["text"] == "".join(part.deltas), (
                f"{what}: text {data['text']!r} != concatenated deltas {''.join(part.deltas)!r}"
            )
            part.done_text = data["text"]
            if "logprobs" in data:
                assert data["logprobs"] == part.delta_logprobs, (
                    f"{what}: logprobs {data['logprobs']} != the deltas' {part.delta_logprobs}"
                )
                part.done_logprobs = data["logprobs"]
        elif kind == "response.content_part.done":
            part = open_part(data, what)
            assert data["part"]["type"] == part.type, (
                f"{what}: part done as {data['part']['type']}, added as {part.type}"
            )
            assert data["part"].get("text") == part.done_text, (
                f"{what}: part text {data['part'].get('text')!r} != {part.type} .done text "
                f"{part.done_text!r}"
            )
            if part.type == "output_text":
                shaped = _event_shape(data["part"].get("logprobs") or [])
                assert shaped == part.done_logprobs, (
                    f"{what}: part logprobs {shaped} != output_text.done {part.done_logprobs}"
                )
            part.done_part = data["part"]
        elif kind == "response.function_call_arguments.delta":
            open_call(data, what).deltas.append(data["delta"])
        elif kind == "response.function_call_arguments.done":
            call = open_call(data, what)
            assert data["arguments"] == "".join(call.deltas), (
                f"{what}: arguments {data['arguments']!r} != concatenated deltas "
                f"{''.join(call.deltas)!r}"
            )
            call.done_arguments = data["arguments"]

    unclosed = sorted(set(added) - set(done))
    if types[-1] != "response.failed":
        # A failed stream may abandon an open item (machine.py); every other terminal closes all.
        assert not unclosed, f"output items added but never done: {unclosed}"
    # The chain deltas -> `.done` text/arguments -> `content_part.done` part -> done item (each
    # link checked above) -> final output makes the final text equal the streamed text.
    done_items = [dict(done[index]) for index in sorted(done)]
    assert final["output"] == done_items, (
        f"final output != output_item.done items:\n{final['output']}\n!=\n{done_items}"
    )
    if types[-1] == "response.completed":
        unfinished = [item["id"] for item in done_items if item.get("status") == "incomplete"]
        assert not unfinished, f"a completed response holds incomplete items: {unfinished}"
    assert_strict_response(final, "final response", background_key=background_key)
    _check_compaction_events(events, final)
    return final


def _check_compaction_events(
    events: Sequence[tuple[str, Mapping[str, Any]]], final: Mapping[str, Any]
) -> None:
    """Spec 000, Compaction: ``mlx.compaction.started`` then ``.completed`` right after
    ``response.in_progress``, then the compaction item added and done at output_index 0."""
    types = [data["type"] for _, data in events]
    if "mlx.compaction.started" not in types and "mlx.compaction.completed" not in types:
        assert not [i for i in final["output"] if i["type"] == "compaction"], (
            "a streamed response holds a compaction item but sent no compaction events"
        )
        return
    at = types.index("mlx.compaction.started")
    assert types.count("mlx.compaction.started") == types.count("mlx.compaction.completed") == 1
    assert types[at - 1] == "response.in_progress", f"compaction events after {types[at - 1]}"
    assert types[at + 1 : at + 4] == [
        "mlx.compaction.completed",
        "response.output_item.added",
        "response.output_item.done",
    ], f"after mlx.compaction.started: {types[at + 1 : at + 4]}"
    started, completed = events[at][1], events[at + 1][1]
    added, done = events[at + 2][1], events[at + 3][1]
    assert started["response_id"] == completed["response_id"] == final["id"]
    assert started["input_tokens"] == completed["input_tokens_before"]
    if len(final["output"]) > 1:  # automatic compaction; a compaction_trigger's one item
        # need not shorten a short history (issue 28, docs/compaction.md)
        assert completed["input_tokens_after"] < completed["input_tokens_before"]
    assert added["output_index"] == done["output_index"] == 0
    assert added["item"]["type"] == "compaction"
    assert added["item"] == done["item"] == final["output"][0]


def assert_strict_compaction(data: Mapping[str, Any], what: str = "compaction") -> None:
    """A ``response.compaction`` object (``POST /v1/responses/compact``), strictly. The SDK's
    ``CompactedResponse`` has no ``model`` (spec 000 adds it) and types ``output`` as output
    items, though it holds the kept input messages too: each item is checked as a
    ``ResponseItem`` instead (what ``input_items`` lists)."""
    assert set(data) == {"id", "object", "created_at", "model", "output", "usage"}, sorted(data)
    assert isinstance(data["model"], str), f"{what}.model is {data['model']!r}"
    assert type(data["created_at"]) is int, f"{what}.created_at is not an int"
    shell = {key: value for key, value in data.items() if key != "model"}
    _strict(CompactedResponse, {**shell, "output": []}, what)
    listing = {
        "object": "list",
        "data": list(data["output"]),
        "first_id": "",
        "last_id": "",
        "has_more": False,
    }
    _strict(ResponseItemList, listing, f"{what}.output")
    types = [item["type"] for item in data["output"]]
    assert types.count("compaction") == 1, types
    assert types[-1] == "compaction", types


def _check_done_item(
    item: Mapping[str, Any],
    added: Mapping[str, Any],
    parts: Mapping[tuple[str, int], _PartTrack],
    calls: Mapping[str, _CallTrack],
    what: str,
) -> None:
    """The done item holds exactly what its part and argument events said."""
    if item["type"] == "function_call":
        call = calls[item["id"]]
        assert call.done_arguments is not None, f"{what}: no function_call_arguments.done"
        assert item["arguments"] == call.done_arguments, (
            f"{what}: arguments {item['arguments']!r} != function_call_arguments.done "
            f"{call.done_arguments!r}"
        )
        for key in ("call_id", "name"):
            assert item[key] == added[key], f"{what}: {key} {item[key]!r} != added {added[key]!r}"
        return
    mine = {index: part for (item_id, index), part in parts.items() if item_id == item["id"]}
    still_open = [index for index, part in mine.items() if part.done_part is None]
    assert not still_open, f"{what}: content parts still open: {still_open}"
    content = item.get("content") or []
    assert sorted(mine) == list(range(len(content))), (
        f"{what}: {len(content)} parts, but parts {sorted(mine)} were streamed"
    )
    for index, part in enumerate(content):
        assert part == mine[index].done_part, (
            f"{what}: part {index} {part!r} != content_part.done {mine[index].done_part!r}"
        )
