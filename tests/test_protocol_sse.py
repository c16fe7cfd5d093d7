"""SSE encoding and the incremental decoder: any chunking of the same bytes gives the same events."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_responses.protocol.events.machine import Finish, ResponseMachine, Start, TextDelta
from mlx_responses.protocol.events.sse import SseDecoder, SseError, encode_sse
from mlx_responses.protocol.objects import ResponseConfig, Usage
from tests.conformance import assert_stream_invariants, parse_sse

scalar_text = st.text(st.characters(codec="utf-8"), max_size=20)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | scalar_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(scalar_text, inner, max_size=4),
    max_leaves=12,
)
event_types = st.from_regex(r"[a-z][a-z_.]{0,30}", fullmatch=True)
events = st.builds(
    lambda type_, seq, extra: {**extra, "type": type_, "sequence_number": seq},
    event_types,
    st.integers(0, 10**6),
    st.dictionaries(scalar_text, json_values, max_size=4),
)


def _split(raw: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(raw) + 1) for c in cuts})
    return [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]


def _decode_chunks(chunks: list[bytes]) -> list[tuple[str, dict[str, Any]]]:
    decoder = SseDecoder()
    out = [event for chunk in chunks for event in decoder.feed(chunk)]
    assert decoder.at_boundary
    return out


@settings(max_examples=200, deadline=None)
@given(
    batch=st.lists(events, max_size=8),
    cuts=st.lists(st.integers(0, 10**6), max_size=20),
    newline=st.sampled_from(["\n", "\r\n", "\r"]),
    bom=st.booleans(),
)
def test_roundtrip_under_any_chunking_and_line_ending(
    batch: list[dict[str, Any]], cuts: list[int], newline: str, bom: bool
) -> None:
    raw = b"".join(encode_sse(e) for e in batch)
    # encode_sse's JSON never contains a raw CR or LF, so this rewrites only line ends.
    raw = raw.replace(b"\n", newline.encode())
    if bom:
        raw = b"\xef\xbb\xbf" + raw
    decoded = _decode_chunks(_split(raw, cuts))
    assert decoded == [(e["type"], e) for e in batch]


@settings(max_examples=100, deadline=None)
@given(deltas=st.lists(scalar_text, max_size=10), cuts=st.lists(st.integers(0, 10**6)))
def test_machine_stream_survives_transport(deltas: list[str], cuts: list[int]) -> None:
    machine = ResponseMachine("resp_1", ResponseConfig(model="m"), 1)
    sent = machine.feed(Start())
    for delta in deltas:
        sent += machine.feed(TextDelta(delta))
    sent += machine.feed(Finish("stop", Usage(1, 1), 2))
    raw = b"".join(encode_sse(e) for e in sent)
    received = _decode_chunks(_split(raw, cuts))
    assert [data for _, data in received] == sent
    assert assert_stream_invariants(received) == machine.snapshot()


@given(event=events)
def test_encoding_is_one_whole_event_with_one_data_line(event: dict[str, Any]) -> None:
    raw = encode_sse(event)
    assert raw.endswith(b"\n\n")
    lines = raw[:-2].split(b"\n")
    assert len(lines) == 2
    assert b"\r" not in raw
    assert lines[0] == b"event: " + event["type"].encode()
    assert lines[1].startswith(b"data: ")
    assert json.loads(lines[1][len(b"data: ") :]) == event


def test_decoder_follows_the_event_stream_rules() -> None:
    raw = (
        b": keep-alive comment\n"
        b"event:first\n"
        b'data: {"a":\n'
        b"data: 1}\n"
        b"id: 7\n"
        b"retry: 100\n"
        b"\n"
        b"\n"  # an empty event dispatches nothing
        b'data: {"b": 2}\r\n'
        b"\r\n"
    )
    assert parse_sse(raw) == [("first", {"a": 1}), ("message", {"b": 2})]


def test_decoder_holds_back_an_unfinished_event() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b'event: x\ndata: {"a": 1}\n') == []
    assert not decoder.at_boundary
    assert decoder.feed(b"\n") == [("x", {"a": 1})]
    assert decoder.at_boundary
    with pytest.raises(AssertionError):
        parse_sse(b'event: x\ndata: {"a": 1}\n')


def test_decoder_rejects_non_object_data() -> None:
    with pytest.raises(SseError):
        SseDecoder().feed(b"data: [1]\n\n")
    with pytest.raises(SseError):
        SseDecoder().feed(b"data: nope\n\n")


def test_encoder_refuses_what_is_not_json_or_not_one_line() -> None:
    with pytest.raises(ValueError, match="Out of range float"):
        encode_sse({"type": "x", "v": float("nan")})
    with pytest.raises(ValueError, match="one-line"):
        encode_sse({"type": "a\nb"})


def test_non_ascii_text_is_sent_as_utf8() -> None:
    raw = encode_sse({"type": "response.output_text.delta", "delta": "héllo \u2028 😀"})
    assert "héllo \u2028 😀".encode() in raw
    assert parse_sse(raw)[0][1]["delta"] == "héllo \u2028 😀"
