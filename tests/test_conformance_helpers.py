"""The conformance helpers must fail on broken input, or every test built on them proves nothing."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

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
from mlx_responses.protocol.events.sse import encode_sse
from mlx_responses.protocol.objects import ResponseConfig, Usage
from tests.conformance import (
    EVENT_MODELS,
    assert_stream_invariants,
    assert_strict_event,
    assert_strict_response,
    parse_sse,
)

Stream = list[tuple[str, dict[str, Any]]]


def _good_stream(*deltas: str, background: bool = False) -> Stream:
    machine = ResponseMachine("resp_1", ResponseConfig(model="m", background=background), 100)
    events = machine.feed(Start())
    for delta in deltas:
        events += machine.feed(TextDelta(delta))
    events += machine.feed(Finish("stop", Usage(4, 2), 101))
    return [(e["type"], e) for e in events]


def _index(stream: Stream, type_: str) -> int:
    return next(i for i, (name, _) in enumerate(stream) if name == type_)


def _renumber(stream: Stream) -> Stream:
    return [(name, {**data, "sequence_number": i}) for i, (name, data) in enumerate(stream)]


def test_the_good_stream_passes() -> None:
    final = assert_stream_invariants(_good_stream("Hel", "lo"))
    assert final["status"] == "completed"
    assert assert_stream_invariants(parse_sse(b"".join(encode_sse(d) for _, d in _good_stream())))


def test_event_map_covers_the_sdk_union_and_our_extensions() -> None:
    assert EVENT_MODELS["response.output_text.delta"].__name__ == "ResponseTextDeltaEvent"
    assert EVENT_MODELS["response.created"].__name__ == "ResponseCreatedEvent"
    assert EVENT_MODELS["response.reasoning_text.delta"].__name__ == (
        "ResponseReasoningTextDeltaEvent"
    )
    assert EVENT_MODELS["response.function_call_arguments.done"].__name__ == (
        "ResponseFunctionCallArgumentsDoneEvent"
    )
    assert "response.cancelled" in EVENT_MODELS
    assert "mlx.compaction.started" in EVENT_MODELS


def _drop(type_: str) -> Callable[[Stream], Stream]:
    def breaker(stream: Stream) -> Stream:
        del stream[_index(stream, type_)]
        return _renumber(stream)

    return breaker


def _gap(stream: Stream) -> Stream:
    del stream[3]
    return stream


def _event_line(stream: Stream) -> Stream:
    stream[2] = ("response.output_item.done", stream[2][1])
    return stream


def _typo_in_event(stream: Stream) -> Stream:
    stream[4][1]["logprob"] = stream[4][1].pop("logprobs")
    return stream


def _typo_in_response(stream: Stream) -> Stream:
    stream[-1][1]["response"]["incomplete_detail"] = None
    return stream


def _typo_in_part(stream: Stream) -> Stream:
    stream[-1][1]["response"]["output"][0]["content"][0]["annotation"] = []
    return stream


def _delta_text(stream: Stream) -> Stream:
    stream[_index(stream, "response.output_text.delta")][1]["delta"] = "XX"
    return stream


def _final_text(stream: Stream) -> Stream:
    stream[-1][1]["response"]["output"][0]["content"][0]["text"] = "other"
    return stream


def _done_id(stream: Stream) -> Stream:
    stream[_index(stream, "response.output_item.done")][1]["item"]["id"] = "msg_other"
    return stream


def _two_terminals(stream: Stream) -> Stream:
    stream.append(copy.deepcopy(stream[-1]))
    return _renumber(stream)


def _terminal_not_last(stream: Stream) -> Stream:
    stream.append(copy.deepcopy(stream[_index(stream, "response.output_text.done")]))
    return _renumber(stream)


def _float_created_at(stream: Stream) -> Stream:
    stream[0][1]["response"]["created_at"] = 100.5
    return stream


def _missing_required_usage_field(stream: Stream) -> Stream:
    del stream[-1][1]["response"]["usage"]["input_tokens_details"]["cache_write_tokens"]
    return stream


def _lax_type(stream: Stream) -> Stream:
    stream[4][1]["output_index"] = "0"  # lax mode would coerce this
    return stream


def _status_mismatch(stream: Stream) -> Stream:
    stream[-1][1]["response"]["status"] = "incomplete"
    return stream


def _unknown_event(stream: Stream) -> Stream:
    stream.insert(2, ("response.thinking", {"type": "response.thinking"}))
    return _renumber(stream)


def _foreground_background_false(stream: Stream) -> Stream:
    stream[-1][1]["response"]["background"] = False
    return stream


BREAKERS: dict[str, Callable[[Stream], Stream]] = {
    "missing created": _drop("response.created"),
    "missing terminal": _drop("response.completed"),
    "missing item done": _drop("response.output_item.done"),
    "missing part added": _drop("response.content_part.added"),
    "missing text done": _drop("response.output_text.done"),
    "sequence gap": _gap,
    "event line differs from type": _event_line,
    "typo key in event": _typo_in_event,
    "typo key in response": _typo_in_response,
    "typo key in content part": _typo_in_part,
    "deltas differ from done text": _delta_text,
    "final text differs": _final_text,
    "done item id differs from added": _done_id,
    "two terminals": _two_terminals,
    "terminal not last": _terminal_not_last,
    "float created_at": _float_created_at,
    "missing required usage field": _missing_required_usage_field,
    "string where int is required": _lax_type,
    "terminal status mismatch": _status_mismatch,
    "unknown event type": _unknown_event,
    "background false key": _foreground_background_false,
}


@pytest.mark.parametrize("name", list(BREAKERS))
def test_a_broken_stream_fails(name: str) -> None:
    stream = BREAKERS[name](copy.deepcopy(_good_stream("Hel", "lo")))
    with pytest.raises(AssertionError):
        assert_stream_invariants(stream)


# --- Reasoning, function calls and logprobs: each new check must fire on its own breakage ---

_LOGPROB = {"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": []}
_TOP = {"token": "!", "bytes": [33], "logprob": -3.0}
_LOGPROB2 = {"token": "!", "logprob": -0.1, "bytes": [33], "top_logprobs": [_TOP]}


def _rich_stream() -> Stream:
    """reasoning (output 0), a message with logprobs (1), a function call (2), completed."""
    machine = ResponseMachine("resp_1", ResponseConfig(model="m"), 100)
    inputs: list[MachineInput] = [
        Start(),
        ReasoningDelta("th"),
        ReasoningDelta("ink"),
        TextDelta("Hi", [_LOGPROB]),
        TextDelta("!", [_LOGPROB2]),
        ToolCallBegin("f"),
        ToolCallArgs('{"a"'),
        ToolCallEnd('{"a": 1}'),
        Finish("stop", Usage(4, 6, reasoning_tokens=2), 101),
    ]
    return [(e["type"], e) for inp in inputs for e in machine.feed(inp)]


def _at(stream: Stream, type_: str, output_index: int | None = None, nth: int = 0) -> int:
    """Index of the nth event of ``type_`` (at ``output_index`` when given)."""
    hits = [
        i
        for i, (name, data) in enumerate(stream)
        if name == type_ and output_index in (None, data.get("output_index"))
    ]
    return hits[nth]


def _data(stream: Stream, type_: str, output_index: int | None = None, nth: int = 0) -> Any:
    return stream[_at(stream, type_, output_index, nth)][1]


def _done_and_final(stream: Stream, output_index: int) -> list[dict[str, Any]]:
    """The item in its output_item.done event and in the final object (to break both alike)."""
    done = _data(stream, "response.output_item.done", output_index)["item"]
    return [done, stream[-1][1]["response"]["output"][output_index]]


def _reasoning_delta(stream: Stream) -> Stream:
    _data(stream, "response.reasoning_text.delta")["delta"] = "TH"
    return stream


def _reasoning_part_text(stream: Stream) -> Stream:
    _data(stream, "response.content_part.done", 0)["part"]["text"] = "thought"
    return stream


def _reasoning_final_content(stream: Stream) -> Stream:
    for item in _done_and_final(stream, 0):
        item["content"][0]["text"] = "other"
    return stream


def _reasoning_final_only(stream: Stream) -> Stream:
    stream[-1][1]["response"]["output"][0]["content"][0]["text"] = "other"
    return stream


def _reasoning_delta_into_message(stream: Stream) -> Stream:
    delta = copy.deepcopy(_data(stream, "response.reasoning_text.delta"))
    message_delta = _data(stream, "response.output_text.delta")
    delta.update(item_id=message_delta["item_id"], output_index=message_delta["output_index"])
    stream.insert(_at(stream, "response.output_text.delta") + 1, (delta["type"], delta))
    return _renumber(stream)


def _text_delta_into_reasoning(stream: Stream) -> Stream:
    index = _at(stream, "response.reasoning_text.delta")
    data = {**stream[index][1], "type": "response.output_text.delta", "logprobs": []}
    stream[index] = (data["type"], data)
    return stream


def _reasoning_part_in_message(stream: Stream) -> Stream:
    _data(stream, "response.content_part.added", 1)["part"] = {"type": "reasoning_text", "text": ""}
    return stream


def _reasoning_item_added_with_content(stream: Stream) -> Stream:
    added = _data(stream, "response.output_item.added", 0)["item"]
    added["content"] = [{"type": "reasoning_text", "text": ""}]
    return stream


def _added_as_completed(stream: Stream) -> Stream:
    _data(stream, "response.output_item.added", 1)["item"]["status"] = "completed"
    return stream


def _arguments_delta(stream: Stream) -> Stream:
    _data(stream, "response.function_call_arguments.delta")["delta"] = '{"b"'
    return stream


def _final_arguments(stream: Stream) -> Stream:
    for item in _done_and_final(stream, 2):
        item["arguments"] = '{"a": 2}'
    return stream


def _call_renamed_at_done(stream: Stream) -> Stream:
    for item in _done_and_final(stream, 2):
        item["name"] = "g"
    return stream


def _call_added_with_arguments(stream: Stream) -> Stream:
    _data(stream, "response.output_item.added", 2)["item"]["arguments"] = "{"
    return stream


def _arguments_delta_on_message(stream: Stream) -> Stream:
    delta = copy.deepcopy(_data(stream, "response.function_call_arguments.delta"))
    message_delta = _data(stream, "response.output_text.delta")
    delta.update(item_id=message_delta["item_id"], output_index=message_delta["output_index"])
    stream.insert(_at(stream, "response.output_text.delta") + 1, (delta["type"], delta))
    return _renumber(stream)


def _arguments_delta_after_done(stream: Stream) -> Stream:
    delta = copy.deepcopy(_data(stream, "response.function_call_arguments.delta"))
    stream.insert(_at(stream, "response.function_call_arguments.done") + 1, (delta["type"], delta))
    return _renumber(stream)


def _drop_call_done(stream: Stream) -> Stream:
    del stream[_at(stream, "response.output_item.done", 2)]
    return _renumber(stream)


def _done_logprobs(stream: Stream) -> Stream:
    _data(stream, "response.output_text.done")["logprobs"].pop()
    return stream


def _part_logprobs(stream: Stream) -> Stream:
    _data(stream, "response.content_part.done", 1)["part"]["logprobs"][0]["logprob"] = -9.0
    return stream


def _final_part_logprobs(stream: Stream) -> Stream:
    for item in _done_and_final(stream, 1):
        item["content"][0]["logprobs"][1]["top_logprobs"] = []
    return stream


def _bytes_on_delta_logprob(stream: Stream) -> Stream:
    _data(stream, "response.output_text.delta")["logprobs"][0]["bytes"] = [72, 105]
    return stream


def _incomplete_item_in_completed(stream: Stream) -> Stream:
    for item in _done_and_final(stream, 2):
        item["status"] = "incomplete"
    return stream


def _extra_part_at_done(stream: Stream) -> Stream:
    for item in _done_and_final(stream, 0):
        item["content"].append({"type": "reasoning_text", "text": ""})
    return stream


RICH_BREAKERS: dict[str, tuple[Callable[[Stream], Stream], str]] = {
    "reasoning deltas differ from done": (_reasoning_delta, "concatenated deltas"),
    "missing reasoning text done": (
        _drop("response.reasoning_text.done"),
        r"reasoning_text \.done text None",
    ),
    "reasoning part text differs from done": (_reasoning_part_text, "reasoning_text .done text"),
    "final reasoning content differs": (_reasoning_final_content, "content_part.done"),
    "final object differs from done item": (_reasoning_final_only, "final output"),
    "reasoning delta into a message part": (
        _reasoning_delta_into_message,
        "writes into a output_text part",
    ),
    "text delta into a reasoning part": (
        _text_delta_into_reasoning,
        "writes into a reasoning_text part",
    ),
    "reasoning part in a message": (_reasoning_part_in_message, "reasoning_text part in a message"),
    "reasoning item added with content": (_reasoning_item_added_with_content, "added with content"),
    "missing reasoning part done": (_drop("response.content_part.done"), "still open"),
    "item added completed": (_added_as_completed, "added with status"),
    "extra part at done": (_extra_part_at_done, "parts"),
    "arguments deltas differ from done": (_arguments_delta, "concatenated deltas"),
    "missing arguments done": (
        _drop("response.function_call_arguments.done"),
        "no function_call_arguments.done",
    ),
    "final arguments differ": (_final_arguments, "!= function_call_arguments.done"),
    "call renamed at done": (_call_renamed_at_done, "name"),
    "call added with arguments": (_call_added_with_arguments, "call added with arguments"),
    "arguments delta on a message": (_arguments_delta_on_message, "is a message"),
    "arguments delta after done": (_arguments_delta_after_done, "already done"),
    "missing call item done": (_drop_call_done, "never done"),
    "text done logprobs differ from deltas": (_done_logprobs, "the deltas'"),
    "part logprobs differ from done": (_part_logprobs, "part logprobs"),
    "final part logprobs differ": (_final_part_logprobs, "content_part.done"),
    "bytes on an event logprob": (_bytes_on_delta_logprob, "bytes"),
    "incomplete item in a completed response": (
        _incomplete_item_in_completed,
        "incomplete items",
    ),
}


def test_the_rich_stream_passes() -> None:
    final = assert_stream_invariants(_rich_stream())
    assert [item["type"] for item in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][1]["content"][0]["logprobs"] == [_LOGPROB, _LOGPROB2]


@pytest.mark.parametrize("name", list(RICH_BREAKERS))
def test_a_broken_rich_stream_fails_for_its_reason(name: str) -> None:
    breaker, reason = RICH_BREAKERS[name]
    stream = breaker(copy.deepcopy(_rich_stream()))
    with pytest.raises(AssertionError, match=reason):
        assert_stream_invariants(stream)


def test_abandoned_item_is_allowed_only_on_failure() -> None:
    machine = ResponseMachine("resp_1", ResponseConfig(model="m"), 100)
    events = machine.feed(Start()) + machine.feed(TextDelta("par"))
    failed = events + machine.feed(Fail("server_error", "boom", None))
    assert assert_stream_invariants([(e["type"], e) for e in failed])["output"] == []
    # The same abandoned item under a cancelled terminal is a broken stream.
    forged = copy.deepcopy(failed)
    forged[-1]["type"] = "response.cancelled"
    forged[-1]["response"]["status"] = "cancelled"
    forged[-1]["response"]["error"] = None
    with pytest.raises(AssertionError, match="never done"):
        assert_stream_invariants([(e["type"], e) for e in forged])


def test_cancelled_extension_event_is_strict() -> None:
    machine = ResponseMachine("resp_1", ResponseConfig(model="m"), 100)
    machine.feed(Start())
    (event,) = machine.feed(Cancel(None))
    assert_strict_event(event)
    event["extra"] = 1
    with pytest.raises(AssertionError, match="extra"):
        assert_strict_event(event)


def test_strict_response_rejects_typos_and_coercions() -> None:
    machine = ResponseMachine("resp_1", ResponseConfig(model="m"), 100)
    machine.feed(Start())
    good = machine.snapshot()
    assert_strict_response(good)
    for broken in (
        {**good, "metdata": {}},
        {**good, "parallel_tool_calls": "true"},
        {**good, "status": "done"},
        {**good, "temperature": float("nan")},
        {k: v for k, v in good.items() if k != "tools"},
    ):
        with pytest.raises(AssertionError):
            assert_strict_response(broken)


def test_parse_sse_rejects_a_truncated_body() -> None:
    raw = b"".join(encode_sse(d) for _, d in _good_stream("a"))
    with pytest.raises(AssertionError, match="inside an event"):
        parse_sse(raw[:-1])
