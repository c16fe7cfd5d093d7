"""The conformance helpers must fail on broken input, or every test built on them proves nothing."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from mlx_responses.protocol.machine import Cancel, Fail, Finish, ResponseMachine, Start, TextDelta
from mlx_responses.protocol.objects import ResponseConfig, Usage
from mlx_responses.protocol.sse import encode_sse
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
