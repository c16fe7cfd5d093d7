"""The pure Anthropic layer: request decoding, the stream encoder, stop sequences, errors.

Strictness as ``shared/design/testing.md`` asks, on the Anthropic side: every message and event
is validated with the ``anthropic`` SDK's pydantic class in strict mode plus a walk for keys no
model declares, and every stream is checked against Anthropic's grammar and re-assembled with
the SDK's own accumulator. The helpers here (``assert_strict_message``,
``assert_message_stream``) are also used by the end-to-end tests in ``test_api_messages.py``.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar

import pydantic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import (
    Message,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
)
from anthropic.types.message_count_tokens_params import MessageCountTokensParams
from anthropic.types.message_create_params import MessageCreateParamsStreaming
from anthropic.types.shared import ErrorResponse
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_responses.protocol.anthropic.request import (
    COUNT_TOKENS_KEYS,
    CREATE_KEYS,
    MessagesRequest,
    parse_count_tokens_request,
    parse_messages_request,
)
from mlx_responses.protocol.anthropic.stream import (
    MessageEncoder,
    StopMatcher,
    error_body,
    error_for_status,
)
from mlx_responses.protocol.errors import ApiError
from mlx_responses.protocol.events.machine import (
    Cancel,
    Fail,
    Finish,
    MachineInput,
    ReasoningDelta,
    ResponseMachine,
    Start,
    TextDelta,
    ToolCallArgs,
    ToolCallBegin,
    ToolCallEnd,
)
from mlx_responses.protocol.items.read import (
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    InputMessage,
    Reasoning,
)
from mlx_responses.protocol.objects import ResponseConfig, Usage
from tests.conformance import unknown_keys

# --- strict validation (shared with test_api_messages.py) -----------------------------------


class PingEvent(pydantic.BaseModel):
    """Anthropic's keep-alive; the SDK skips it and has no class for it."""

    model_config = pydantic.ConfigDict(extra="allow")
    type: Literal["ping"]


EVENT_MODELS: Mapping[str, type[pydantic.BaseModel]] = {
    "message_start": RawMessageStartEvent,
    "content_block_start": RawContentBlockStartEvent,
    "content_block_delta": RawContentBlockDeltaEvent,
    "content_block_stop": RawContentBlockStopEvent,
    "message_delta": RawMessageDeltaEvent,
    "message_stop": RawMessageStopEvent,
    "ping": PingEvent,
    "error": ErrorResponse,
}
_DELTA_FOR_BLOCK = {
    "text": "text_delta",
    "thinking": "thinking_delta",
    "tool_use": "input_json_delta",
}

_M = TypeVar("_M", bound=pydantic.BaseModel)


def strict(cls: type[_M], data: Mapping[str, Any], what: str) -> _M:
    """Validate the JSON text strictly with ``cls`` and refuse keys no model declares."""
    text = json.dumps(data, allow_nan=False)
    try:
        model = cls.model_validate_json(text, strict=True)
    except pydantic.ValidationError as exc:
        raise AssertionError(f"{what}: fails strict {cls.__name__}:\n{exc}") from None
    extra = unknown_keys(model)
    assert not extra, f"{what}: keys the SDK model does not define: {extra}"
    return model


def assert_strict_message(data: Mapping[str, Any]) -> Message:
    message = strict(Message, data, "message")
    assert data["id"].startswith("msg_")
    assert data["stop_reason"] is not None, "a final message has a stop_reason"
    usage = data["usage"]
    assert usage["cache_read_input_tokens"] is not None
    return message


def assert_strict_error(data: Mapping[str, Any]) -> ErrorResponse:
    return strict(ErrorResponse, data, "error body")


def assert_message_stream(
    events: Sequence[tuple[str, Mapping[str, Any]]],
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Check one stream; return (the message the SDK assembles, None) or (None, error)."""
    assert events, "empty stream"
    models = []
    for index, (name, data) in enumerate(events):
        assert name == data.get("type"), f"event #{index}: `event: {name}` but type {data!r}"
        cls = EVENT_MODELS.get(name)
        assert cls is not None, f"event #{index}: unknown type {name!r}"
        models.append(strict(cls, data, f"event #{index} {name}"))
    types = [name for name, _ in events]
    assert types[0] == "message_start", types
    terminals = [i for i, t in enumerate(types) if t in ("message_stop", "error")]
    assert terminals == [len(types) - 1], f"one terminal, last: {types}"
    start = events[0][1]["message"]
    assert start["content"] == [], start
    assert start["stop_reason"] is None, start

    blocks: list[str] = []  # block types by index
    open_index: int | None = None
    signed: set[int] = set()
    deltas_seen = False
    for index, (name, data) in enumerate(events[1:-1], start=1):
        what = f"event #{index} {name}"
        assert name != "message_start", f"{what}: a second message_start"
        assert not deltas_seen, f"{what}: after message_delta"
        if name == "content_block_start":
            assert open_index is None, f"{what}: block {open_index} is still open"
            assert data["index"] == len(blocks), f"{what}: index {data['index']}"
            block = data["content_block"]
            blocks.append(block["type"])
            open_index = data["index"]
            empty = {"text": {"text": ""}, "thinking": {"thinking": "", "signature": ""}}
            for key, value in empty.get(block["type"], {"input": {}}).items():
                assert block[key] == value, f"{what}: starts with {key}={block[key]!r}"
        elif name == "content_block_delta":
            assert data["index"] == open_index, f"{what}: index {data['index']} is not open"
            kind, block_type = data["delta"]["type"], blocks[data["index"]]
            assert open_index not in signed, f"{what}: delta after the signature"
            if kind == "signature_delta":
                assert block_type == "thinking", f"{what}: signature on a {block_type} block"
                signed.add(data["index"])
            else:
                assert kind == _DELTA_FOR_BLOCK[block_type], f"{what}: {kind} in {block_type}"
        elif name == "content_block_stop":
            assert data["index"] == open_index, f"{what}: index {data['index']} is not open"
            if blocks[data["index"]] == "thinking":
                assert data["index"] in signed, f"{what}: thinking block without signature"
            open_index = None
        elif name == "message_delta":
            assert open_index is None, f"{what}: block {open_index} still open"
            deltas_seen = True
        else:
            assert name == "ping", f"{what}: unexpected"
    if types[-1] == "error":
        return None, dict(events[-1][1])
    assert deltas_seen, "message_stop without message_delta"
    assert types[-2] == "message_delta", types[-3:]
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for model in models:
        if not isinstance(model, PingEvent):
            snapshot = accumulate_event(
                event=model,  # type: ignore[arg-type]
                current_snapshot=snapshot,
                json_bufs=json_bufs,
            )
    assert snapshot is not None
    message = snapshot.model_dump(mode="json", exclude_none=True)
    for block in message["content"]:
        block.pop("parsed_output", None)
    return message, None


def same_message(left: Mapping[str, Any], right: Mapping[str, Any]) -> bool:
    """Equal as the SDK reads them (unset optional fields aside). Prompt tokens compare as
    one total: the same prompt sent twice may read the prompt cache the second time."""

    def norm(data: Mapping[str, Any]) -> dict[str, Any]:
        dumped = Message.model_validate(data).model_dump(mode="json", exclude_none=True)
        usage = dumped.get("usage", {})
        usage["input_tokens"] = usage.get("input_tokens", 0) + usage.pop(
            "cache_read_input_tokens", 0
        )
        return dumped

    return norm(left) == norm(right)


# --- request decoding -----------------------------------------------------------------------

MODEL = "m"
USER = {"role": "user", "content": "hi"}
WEATHER = {
    "name": "get_weather",
    "description": "Weather.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 16, "messages": [USER], **fields}


def tool_exchange(result: Any = "sunny", **extra: Any) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "P"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": result, **extra}],
        },
    ]


def test_accepted_keys_are_the_sdks_plus_sampling() -> None:
    sdk_create = MessageCreateParamsStreaming.__required_keys__
    sdk_create |= MessageCreateParamsStreaming.__optional_keys__
    sdk_count = MessageCountTokensParams.__required_keys__
    sdk_count |= MessageCountTokensParams.__optional_keys__
    assert sdk_create == CREATE_KEYS - {"temperature", "top_p", "top_k"}
    assert sdk_count == COUNT_TOKENS_KEYS


def test_a_plain_request_becomes_the_internal_request() -> None:
    decoded = parse_messages_request(
        body(
            system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
            temperature=0,
            top_p=0.5,
            metadata={"user_id": "u1"},
            stream=True,
        ),
        owner="tenant-a",
    )
    create = decoded.create
    assert create.input == (InputMessage("user", "hi"),)
    assert create.stream is True
    assert create.owner == "tenant-a"
    config = create.config
    assert (config.model, config.instructions, config.max_output_tokens) == (MODEL, "Be brief.", 16)
    assert (config.temperature, config.top_p, config.user, config.store) == (0, 0.5, "u1", False)
    assert decoded.stop_sequences == ()


def test_a_tool_round_trip_becomes_calls_and_outputs() -> None:
    decoded = parse_messages_request(body(messages=tool_exchange(), tools=[WEATHER]))
    assert decoded.create.input == (
        InputMessage("user", "Weather in Paris?"),
        InputMessage("assistant", "Let me look."),
        FunctionCall("t1", "get_weather", '{"city": "P"}'),
        FunctionCallOutput("t1", "sunny"),
    )
    (tool,) = decoded.create.tools
    assert (tool.name, tool.description, tool.strict) == ("get_weather", "Weather.", False)
    assert tool.parameters == WEATHER["input_schema"]


@pytest.mark.parametrize(
    ("result", "extra", "expected"),
    [
        ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], {}, "ab"),
        ("boom", {"is_error": True}, "Error: boom"),
        (None, {}, ""),
        (
            [
                {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": "doc"},
                    "title": "T",
                }
            ],
            {},
            "T\n\ndoc",
        ),
    ],
)
def test_tool_result_content(result: Any, extra: dict[str, Any], expected: str) -> None:
    messages = tool_exchange(result, **extra)
    if result is None:
        del messages[2]["content"][0]["content"]
    decoded = parse_messages_request(body(messages=messages, tools=[WEATHER]))
    assert decoded.create.input[-1] == FunctionCallOutput("t1", expected)


def test_thinking_blocks_and_turn_merging() -> None:
    decoded = parse_messages_request(
        body(
            messages=[
                {"role": "user", "content": "a"},
                {"role": "user", "content": [{"type": "text", "text": "b"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "redacted_thinking", "data": "xx"},
                        {"type": "thinking", "thinking": "hmm", "signature": "s"},
                        {"type": "text", "text": "c"},
                    ],
                },
                {"role": "system", "content": "sys"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "d"},
                        {"type": "document", "source": {"type": "content", "content": "e"}},
                    ],
                },
            ]
        )
    )
    assert decoded.create.input == (
        InputMessage("user", "a\n\nb"),
        Reasoning("hmm"),
        InputMessage("assistant", "c"),
        InputMessage("system", "sys"),
        InputMessage("user", "d\n\ne"),
    )


@pytest.mark.parametrize(
    ("fields", "check"),
    [
        (
            {"thinking": {"type": "disabled"}},
            lambda r: r.create.template_kwargs == {"enable_thinking": False},
        ),
        (
            {
                "max_tokens": 2048,
                "thinking": {"type": "enabled", "budget_tokens": 1024, "display": "omitted"},
            },
            lambda r: r.omit_thinking and not r.create.template_kwargs,
        ),
        ({"thinking": {"type": "adaptive"}}, lambda r: not r.omit_thinking),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "any"}},
            lambda r: (
                (r.create.tool_choice.mode, r.create.config.parallel_tool_calls)
                == ("required", True)
            ),
        ),
        (
            {
                "tools": [WEATHER],
                "tool_choice": {
                    "type": "tool",
                    "name": "get_weather",
                    "disable_parallel_tool_use": True,
                },
            },
            lambda r: (
                (r.create.tool_choice.name, r.create.config.parallel_tool_calls)
                == ("get_weather", False)
            ),
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "none"}},
            lambda r: r.create.tool_choice.mode == "none",
        ),
        ({"tool_choice": {"type": "auto"}}, lambda r: r.create.tool_choice.mode == "auto"),
        (
            {
                "output_config": {
                    "effort": "low",
                    "format": {"type": "json_schema", "schema": {"type": "object"}},
                }
            },
            lambda r: r.create.text_format.kind == "json_schema",
        ),
        ({"stop_sequences": ["x", "y", "x"]}, lambda r: r.stop_sequences == ("x", "y")),
        ({"top_k": 5, "temperature": 0}, lambda r: r.create.config.temperature == 0),
        ({"top_k": 5}, lambda r: r.create.top_k == 5),
        (
            {"max_tokens": 0},
            lambda r: r.max_tokens == 0 and r.create.config.max_output_tokens is None,
        ),
        (
            {
                "cache_control": {"type": "ephemeral"},
                "service_tier": "auto",
                "speed": "fast",
                "inference_geo": "eu",
                "container": None,
                "diagnostics": {"previous_message_id": None},
                "user_profile_id": "p",
                "workspace_id": "w",
                "temperature": None,
            },
            lambda r: r.create.config.temperature is None,
        ),
    ],
)
def test_settings_map_onto_the_internal_request(fields: dict[str, Any], check: Any) -> None:
    assert check(parse_messages_request(body(**fields)))


def _bad_messages(*messages: Any) -> dict[str, Any]:
    return body(messages=list(messages))


BAD_REQUESTS: list[tuple[str, Any, str]] = [
    # (name, body, expected start of the message)
    ("not an object", [1], "body:"),
    ("unknown key", body(foo=1), "foo: Extra inputs"),
    ("missing model", {"max_tokens": 1, "messages": [USER]}, "model: Field required"),
    ("missing max_tokens", {"model": MODEL, "messages": [USER]}, "max_tokens: Field required"),
    ("negative max_tokens", body(max_tokens=-1), "max_tokens:"),
    ("boolean max_tokens", body(max_tokens=True), "max_tokens: expected an integer"),
    ("float max_tokens", body(max_tokens=1.5), "max_tokens: expected an integer"),
    ("stream not a boolean", body(stream="yes"), "stream:"),
    ("temperature too high", body(temperature=1.5), "temperature:"),
    ("top_p a string", body(top_p="1"), "top_p:"),
    ("negative top_k", body(top_k=-1), "top_k:"),
    ("no messages", body(messages=[]), "messages:"),
    ("messages an object", body(messages={}), "messages:"),
    ("bad role", _bad_messages({"role": "tool", "content": "x"}), "messages.0.role:"),
    ("message extra key", _bad_messages({**USER, "name": "x"}), "messages.0.name:"),
    ("empty content", _bad_messages({"role": "user", "content": ""}), "messages.0.content:"),
    ("empty blocks", _bad_messages({"role": "user", "content": []}), "messages.0.content:"),
    (
        "empty text block",
        _bad_messages({"role": "user", "content": [{"type": "text", "text": ""}]}),
        "messages.0.content.0.text:",
    ),
    (
        "image",
        _bad_messages(
            {
                "role": "user",
                "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}],
            }
        ),
        "messages.0.content.0.type: 'image' is not supported: the served model is text-only",
    ),
    (
        "pdf document",
        _bad_messages(
            {
                "role": "user",
                "content": [
                    {
                        "type": "document",
                        "source": {
                            "type": "base64",
                            "media_type": "application/pdf",
                            "data": "AA==",
                        },
                    }
                ],
            }
        ),
        "messages.0.content.0.source.type:",
    ),
    (
        "block without type",
        _bad_messages({"role": "user", "content": [{"text": "x"}]}),
        "messages.0.content.0.type: Field required",
    ),
    (
        "thinking from the user",
        _bad_messages(
            {"role": "user", "content": [{"type": "thinking", "thinking": "x", "signature": ""}]}
        ),
        "messages.0.content.0.type:",
    ),
    (
        "server tool block",
        _bad_messages(
            {
                "role": "user",
                "content": [{"type": "web_search_tool_result", "tool_use_id": "x", "content": []}],
            }
        ),
        "messages.0.content.0.type:",
    ),
    (
        "final assistant (prefill)",
        _bad_messages(USER, {"role": "assistant", "content": "x"}),
        "messages.1: a final assistant message (prefill)",
    ),
    (
        "result without a call",
        _bad_messages(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "x"}],
            }
        ),
        "messages.0.content.0: unexpected tool_use_id",
    ),
    (
        "call without a result",
        _bad_messages(*tool_exchange()[:2], USER),
        "messages.2: tool_use ids were found without tool_result",
    ),
    (
        "result after text",
        _bad_messages(
            *tool_exchange()[:2],
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "x"},
                    {"type": "tool_result", "tool_use_id": "t1", "content": "x"},
                ],
            },
        ),
        "messages.2.content.1: tool_result blocks must come first",
    ),
    (
        "tool input not an object",
        _bad_messages(
            USER,
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "[]"}],
            },
            USER,
        ),
        "messages.1.content.0.input:",
    ),
    (
        "server tool",
        body(tools=[{"type": "web_search_20250305", "name": "web_search"}]),
        "tools.0.type:",
    ),
    ("tool without schema", body(tools=[{"name": "f"}]), "tools.0.input_schema: Field required"),
    (
        "tool schema not an object type",
        body(tools=[{"name": "f", "input_schema": {"type": "array"}}]),
        "tools.0.input_schema.type:",
    ),
    ("bad tool name", body(tools=[{**WEATHER, "name": "a b"}]), "tools.0.name:"),
    ("duplicate tools", body(tools=[WEATHER, WEATHER]), "tools.1.name:"),
    ("deferred tool", body(tools=[{**WEATHER, "defer_loading": True}]), "tools.0.defer_loading:"),
    ("tool_choice any without tools", body(tool_choice={"type": "any"}), "tool_choice:"),
    (
        "tool_choice unknown tool",
        body(tools=[WEATHER], tool_choice={"type": "tool", "name": "x"}),
        "tool_choice.name:",
    ),
    ("tool_choice bad type", body(tool_choice={"type": "required"}), "tool_choice.type:"),
    (
        "thinking budget too small",
        body(max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 10}),
        "thinking.budget_tokens: must be at least 1024",
    ),
    (
        "thinking budget over max_tokens",
        body(thinking={"type": "enabled", "budget_tokens": 2048}),
        "thinking.budget_tokens: must be less than max_tokens",
    ),
    ("thinking bad type", body(thinking={"type": "on"}), "thinking.type:"),
    ("empty stop sequence", body(stop_sequences=[""]), "stop_sequences.0:"),
    ("stop sequences a string", body(stop_sequences="x"), "stop_sequences:"),
    ("container", body(container="c1"), "container:"),
    ("metadata extra key", body(metadata={"user": "x"}), "metadata.user:"),
    (
        "output format not a schema",
        body(output_config={"format": {"type": "text"}}),
        "output_config.format.type:",
    ),
]


@pytest.mark.parametrize(("name", "raw", "start"), BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_bad_requests_are_400s_naming_the_path(name: str, raw: Any, start: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_messages_request(raw)
    assert caught.value.status == 400, name
    assert caught.value.message.startswith(start), caught.value.message


def test_count_tokens_takes_no_generation_settings() -> None:
    decoded = parse_count_tokens_request({"model": MODEL, "messages": [USER]})
    assert decoded.create.input == (InputMessage("user", "hi"),)
    for key, value in [("max_tokens", 5), ("stream", False), ("temperature", 0)]:
        with pytest.raises(ApiError, match=f"^{key}: Extra inputs"):
            parse_count_tokens_request({"model": MODEL, "messages": [USER], key: value})


# Generated conversations: what was put in is what comes out, and any stray key is named.

texts = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
tool_inputs = st.dictionaries(
    st.text(max_size=4), st.integers() | st.text(max_size=4) | st.booleans(), max_size=3
)


@st.composite
def conversations(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[InputItem]]:
    """(messages, the items they must decode to): user and assistant turns alternate."""
    messages: list[dict[str, Any]] = []
    expected: list[InputItem] = []
    pending: list[str] = []
    turns = draw(st.integers(1, 4))
    for turn in range(turns):
        blocks: list[dict[str, Any]] = []
        for call_id in pending:
            output = draw(texts)
            blocks.append({"type": "tool_result", "tool_use_id": call_id, "content": output})
            expected.append(FunctionCallOutput(call_id, output))
        parts = draw(st.lists(texts, min_size=0 if pending else 1, max_size=2))
        blocks += [{"type": "text", "text": part} for part in parts]
        if parts:
            expected.append(InputMessage("user", "".join(parts)))
        as_string = not pending and len(parts) == 1 and draw(st.booleans())
        messages.append({"role": "user", "content": parts[0] if as_string else blocks})
        if turn == turns - 1:
            break
        blocks = []
        if draw(st.booleans()):
            thinking = draw(texts)
            blocks.append({"type": "thinking", "thinking": thinking, "signature": "s"})
            expected.append(Reasoning(thinking))
        text = draw(st.none() | texts)
        if text is not None:
            blocks.append({"type": "text", "text": text})
            expected.append(InputMessage("assistant", text))
        calls = draw(st.integers(0 if blocks else 1, 2))
        pending = [f"toolu_{turn}_{i}" for i in range(calls)]
        for call_id in pending:
            arguments = draw(tool_inputs)
            blocks.append({"type": "tool_use", "id": call_id, "name": "f", "input": arguments})
            expected.append(FunctionCall(call_id, "f", json.dumps(arguments)))
        messages.append({"role": "assistant", "content": blocks})
    return messages, expected


def _objects(value: Any, path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every object a client wrote (schemas and tool inputs aside), with its dotted path."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(value, dict):
        found.append((path, value))
        for key, item in value.items():
            if key not in ("input", "input_schema"):
                found += _objects(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _objects(item, f"{path}.{index}")
    return found


@settings(max_examples=300, deadline=None)
@given(conversation=conversations())
def test_generated_conversations_decode_to_their_items(
    conversation: tuple[list[dict[str, Any]], list[InputItem]],
) -> None:
    messages, expected = conversation
    decoded = parse_messages_request(body(messages=messages))
    assert list(decoded.create.input) == expected


@settings(max_examples=300, deadline=None)
@given(conversation=conversations(), data=st.data())
def test_a_stray_key_anywhere_is_named(
    conversation: tuple[list[dict[str, Any]], list[InputItem]], data: st.DataObject
) -> None:
    raw = copy.deepcopy(
        body(messages=conversation[0], tools=[WEATHER], tool_choice={"type": "auto"})
    )
    path, target = data.draw(st.sampled_from(_objects(raw, "")))
    target["zz_unknown"] = 1
    with pytest.raises(ApiError) as caught:
        parse_messages_request(raw)
    where = f"{path}.zz_unknown" if path else "zz_unknown"
    assert caught.value.message.startswith(f"{where}: Extra inputs"), caught.value.message


# --- stop sequences ------------------------------------------------------------------------

stop_alphabet = st.text("ab \n", min_size=1, max_size=3)


def reference_stop(text: str, sequences: Sequence[str]) -> tuple[str, str | None]:
    """The text before the first stop sequence to be completed (earliest end, then longest)."""
    found = [(text.find(s) + len(s), -len(s), s) for s in sequences if s and text.find(s) >= 0]
    if not found:
        return text, None
    end, negative_length, sequence = min(found)
    return text[: end + negative_length], sequence


def chunked(data: st.DataObject, text: str) -> list[str]:
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=len(text))))
    bounds = [0, *[c for c in cuts if c < len(text)], len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


@settings(max_examples=1000, deadline=None)
@given(
    text=st.text("ab \n", max_size=30),
    sequences=st.lists(stop_alphabet, max_size=3),
    data=st.data(),
)
def test_stop_matcher_is_the_reference_whatever_the_chunking(
    text: str, sequences: list[str], data: st.DataObject
) -> None:
    matcher = StopMatcher(sequences)
    sent: list[str] = []
    matched = None
    for chunk in chunked(data, text):
        safe, matched = matcher.feed(chunk)
        sent.append(safe)
        if matched is not None:
            break
    else:
        sent.append(matcher.flush())
    assert ("".join(sent), matched) == reference_stop(text, sequences)


# --- the encoder, fed by the real Responses machine ----------------------------------------

Step = tuple[str, Any]
steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("text"),
            st.lists(st.text("ab \n", min_size=1, max_size=6), min_size=1, max_size=3),
        ),
        st.tuples(st.just("reasoning"), st.lists(texts, min_size=1, max_size=2)),
        st.tuples(st.just("call"), st.tuples(st.sampled_from(["f", "get_weather"]), tool_inputs)),
    ),
    max_size=5,
)


def _script(
    plan: list[Step], ending: str, data: st.DataObject
) -> tuple[list[MachineInput], list[dict[str, Any]]]:
    """Machine inputs for a plan, and the content blocks it must give (before stop sequences)."""
    inputs: list[MachineInput] = [Start()]
    blocks: list[dict[str, Any]] = []
    for index, (kind, value) in enumerate(plan):
        last = index == len(plan) - 1
        if kind == "text":
            inputs += [TextDelta(chunk) for chunk in value]
            blocks.append({"type": "text", "text": "".join(value)})
        elif kind == "reasoning":
            inputs += [ReasoningDelta(chunk) for chunk in value]
            blocks.append({"type": "thinking", "thinking": "".join(value)})
        else:
            name, arguments = value
            text = json.dumps(arguments)
            inputs.append(ToolCallBegin(name))
            if last and ending != "stop" and data.draw(st.booleans()):
                blocks.append({"type": "tool_use", "name": name, "input": {}})  # cut off
                break
            inputs += [ToolCallArgs(chunk) for chunk in chunked(data, text)]
            inputs.append(ToolCallEnd(text))
            blocks.append({"type": "tool_use", "name": name, "input": arguments})
    # Adjacent text (or reasoning) steps stream into one item, hence one block.
    merged: list[dict[str, Any]] = []
    for block in blocks:
        if merged and block["type"] in ("text", "thinking") and merged[-1]["type"] == block["type"]:
            key = block["type"]
            merged[-1] = {**merged[-1], key: merged[-1][key] + block[key]}
        else:
            merged.append(block)
    return inputs, merged


def _expected(
    blocks: list[dict[str, Any]], sequences: list[str], omit: bool
) -> tuple[list[dict[str, Any]], str | None]:
    out: list[dict[str, Any]] = []
    for block in blocks:
        if block["type"] == "text":
            text, matched = reference_stop(block["text"], sequences)
            if text:
                out.append({"type": "text", "text": text})
            if matched is not None:
                return out, matched
        elif block["type"] == "thinking":
            out.append({"type": "thinking", "thinking": "" if omit else block["thinking"]})
        else:
            out.append(block)
    return out, None


def _shape(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keep = {"text": ("text",), "thinking": ("thinking",), "tool_use": ("name", "input")}
    return [{"type": b["type"], **{k: b[k] for k in keep[b["type"]]}} for b in content]


@settings(max_examples=500, deadline=None)
@given(
    plan=steps,
    ending=st.sampled_from(["stop", "length", "fail", "cancel"]),
    sequences=st.lists(stop_alphabet, max_size=2),
    omit=st.booleans(),
    exhausted=st.booleans(),
    data=st.data(),
)
def test_encoder_streams_are_anthropic_and_match_the_message(
    plan: list[Step],
    ending: str,
    sequences: list[str],
    omit: bool,
    exhausted: bool,
    data: st.DataObject,
) -> None:
    inputs, blocks = _script(plan, ending, data)
    output_tokens = 10
    usage = Usage(input_tokens=7, output_tokens=output_tokens, cached_tokens=2)
    match ending:
        case "stop" | "length":
            inputs.append(Finish(ending, usage, 1))
        case "fail":
            inputs.append(Fail("server_error", "boom", usage))
        case "cancel":
            inputs.append(Cancel(usage))
    machine = ResponseMachine("resp_1", ResponseConfig(model=MODEL), 0)
    encoder = MessageEncoder(
        message_id="msg_1",
        model=MODEL,
        input_tokens=7,
        max_tokens=output_tokens if exhausted else output_tokens + 5,
        stop_sequences=sequences,
        omit_thinking=omit,
    )
    out: list[dict[str, Any]] = []
    for step in inputs:
        for event in machine.feed(step):
            out += encoder.feed(event)
            if encoder.stopped_at is not None and not encoder.finished:
                out += encoder.stop_on_sequence(usage)
    assert encoder.finished
    assembled, error = assert_message_stream([(event["type"], event) for event in out])
    expected, matched = _expected(blocks, sequences, omit)
    if ending in ("fail", "cancel") and matched is None:
        assert error is not None
        assert error["error"]["type"] == "api_error"
        assert encoder.error is not None
        return
    assert assembled is not None
    final = encoder.message()
    assert_strict_message(final)
    assert same_message(assembled, final)
    assert _shape(final["content"]) == expected
    assert final["stop_sequence"] == matched
    reason = final["stop_reason"]
    if matched is not None:
        assert reason == "stop_sequence"
    elif ending == "length":
        assert reason == ("max_tokens" if exhausted else "model_context_window_exceeded")
    else:
        assert reason == (
            "tool_use" if any(b["type"] == "tool_use" for b in expected) else "end_turn"
        )
    assert final["usage"]["input_tokens"] == 5
    assert final["usage"]["cache_read_input_tokens"] == 2
    assert final["usage"]["output_tokens"] == output_tokens


def test_message_start_carries_the_prompt_tokens_and_a_ping_follows() -> None:
    encoder = MessageEncoder(message_id="msg_1", model=MODEL, input_tokens=42, max_tokens=5)
    start, ping = encoder.start()
    assert strict(RawMessageStartEvent, start, "start").message.usage.input_tokens == 42
    assert ping == {"type": "ping"}
    assert encoder.start() == []


def test_an_empty_message_is_max_tokens_with_the_prompt_counted() -> None:
    encoder = MessageEncoder(message_id="msg_1", model=MODEL, input_tokens=9, max_tokens=0)
    events = encoder.finish_empty(Usage(9, 0))
    assembled, _ = assert_message_stream([(event["type"], event) for event in events])
    assert assembled is not None
    final = assert_strict_message(encoder.message())
    assert (final.stop_reason, final.content, final.usage.input_tokens) == ("max_tokens", [], 9)


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, (400, "invalid_request_error")),
        (401, (401, "authentication_error")),
        (403, (403, "permission_error")),
        (404, (404, "not_found_error")),
        (413, (413, "invalid_request_error")),
        (422, (422, "invalid_request_error")),
        (429, (429, "rate_limit_error")),
        (500, (500, "api_error")),
        (503, (529, "overloaded_error")),
    ],
)
def test_error_statuses_map_to_anthropic_types(status: int, expected: tuple[int, str]) -> None:
    assert error_for_status(status) == expected
    error = assert_strict_error(error_body(expected[1], "why"))
    assert (error.error.type, error.error.message) == (expected[1], "why")


def test_messages_request_is_frozen() -> None:
    decoded = parse_messages_request(body())
    assert isinstance(decoded, MessagesRequest)
    with pytest.raises(AttributeError):
        decoded.max_tokens = 3  # type: ignore[misc]
