"""Kimi K3's second argument form: all of a call's arguments as one JSON object block,
``<|open|>json type="object"<|sep|>{...}<|close|>json<|sep|>`` (mlx-lm 0.32.2's ``kimi_k3``
parser reads it besides the typed ``<|open|>argument`` form).

The parser reads it in any chunking, and any prefix of it (generation stopped anywhere) gives
the same events however chunked; the forced-call grammar lets a call write it, valid against the
tool's schema, and the parser reads back what the grammar wrote.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_formats_families import Call, calls, chunkings, parse, texts
from tests.test_formats_families import idents as names
from tests.test_formats_family_grammars import WEATHER, accepts, tools_and_call
from tests.test_formats_family_grammars import parse as parse_forced

OPEN_JSON = '<|open|>json type="object"<|sep|>'
CLOSE_JSON = "<|close|>json<|sep|>"


def call_block(name: str, body: str, index: int = 1) -> str:
    return f'<|open|>call tool="{name}" index="{index}"<|sep|>{body}<|close|>call<|sep|>'


def render(cs: list[Call]) -> str:
    body = "".join(
        call_block(name, OPEN_JSON + json.dumps(args, ensure_ascii=False) + CLOSE_JSON, i + 1)
        for i, (name, args) in enumerate(cs)
    )
    return f"<|open|>tools<|sep|>{body}<|close|>tools<|sep|>"


def test_a_json_block_is_the_call_s_arguments_in_every_chunking() -> None:
    args = {"city": "Paris", "days": 3, "opts": {"unit": "C", "alerts": [1, None]}}
    text = "Checking. " + render([("get_weather", args)]) + " Done."
    whole = parse(text, "kimi_k3")
    assert calls(whole) == [("get_weather", args)]
    assert texts(whole) == ["Checking.", "Done."]
    for size in (1, 2, 5):
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        assert parse(pieces, "kimi_k3") == whole


def test_json_and_typed_calls_mix_in_one_section() -> None:
    typed = (
        '<|open|>argument key="q" type="string"<|sep|>x y<|close|>argument<|sep|>'
        '<|open|>argument key="n" type="integer"<|sep|>7<|close|>argument<|sep|>'
    )
    text = (
        "<|open|>tools<|sep|>"
        + call_block("a", OPEN_JSON + '{"path": "/tmp"}' + CLOSE_JSON)
        + call_block("b", typed, 2)
        + "<|close|>tools<|sep|>"
    )
    assert calls(parse(text, "kimi_k3")) == [("a", {"path": "/tmp"}), ("b", {"q": "x y", "n": 7})]


def test_a_block_that_is_no_json_object_adds_no_arguments() -> None:
    for body in ("[1, 2]", "{not json", '"s"'):
        text = "<|open|>tools<|sep|>" + call_block("f", OPEN_JSON + body + CLOSE_JSON)
        assert calls(parse(text + "<|close|>tools<|sep|>", "kimi_k3")) == [("f", {})]


def test_cut_short_inside_the_block_ends_the_call() -> None:
    text = "<|open|>tools<|sep|>" + call_block("f", "")[: -len("<|close|>call<|sep|>")]
    assert calls(parse(text + OPEN_JSON + '{"a": 1', "kimi_k3")) == [("f", {})]
    assert calls(parse(text + OPEN_JSON + '{"a": 1}', "kimi_k3")) == [("f", {"a": 1})]


# -- Hypothesis --------------------------------------------------------------------------------

scalars = st.one_of(
    st.text(max_size=8), st.integers(-1000, 1000), st.booleans(), st.none(), st.floats(-1, 1)
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
call_lists = st.lists(
    st.tuples(names, st.dictionaries(st.text(min_size=1, max_size=6), values, max_size=3)),
    min_size=1,
    max_size=3,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(data=st.data(), cs=call_lists, before=st.sampled_from(["", "Sure. "]))
def test_any_chunking_reads_the_json_blocks(
    data: st.DataObject, cs: list[Call], before: str
) -> None:
    text = before + render(cs)
    whole = parse(text, "kimi_k3")
    assert calls(whole) == cs
    assert parse(data.draw(chunkings(text)), "kimi_k3") == whole


@settings(max_examples=200, deadline=None, derandomize=True)
@given(data=st.data(), cs=call_lists)
def test_any_prefix_of_json_blocks_parses_the_same_however_chunked(
    data: st.DataObject, cs: list[Call]
) -> None:
    text = render(cs)
    prefix = text[: data.draw(st.integers(0, len(text)))]
    whole = parse(prefix, "kimi_k3")
    calls(whole)  # well-formed call events
    assert parse(data.draw(chunkings(prefix)), "kimi_k3") == whole


# -- the forced call ---------------------------------------------------------------------------


def forced(name: str, args: dict[str, Any]) -> str:
    body = OPEN_JSON + json.dumps(args, ensure_ascii=False) + CLOSE_JSON
    return f"<|open|>tools<|sep|>{call_block(name, body)}<|close|>tools<|sep|>"


def test_a_forced_call_may_write_its_arguments_as_one_json_block() -> None:
    for special in (False, True):
        good = forced("get_weather", {"city": "Paris", "days": 2})
        assert accepts("kimi_k3", special, [WEATHER], "get_weather", good)
        assert parse_forced("kimi_k3", good, [WEATHER]) == [
            ("get_weather", {"city": "Paris", "days": 2})
        ]
        # the schema holds inside the block: the required city, an integer day count
        assert not accepts("kimi_k3", special, [WEATHER], None, forced("get_weather", {"days": 2}))
        bad = forced("get_weather", {"city": "Paris", "days": "two"})
        assert not accepts("kimi_k3", special, [WEATHER], None, bad)


@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(special=st.booleans(), case=tools_and_call())
def test_what_the_grammar_writes_as_a_json_block_reads_back(
    special: bool, case: tuple[dict[str, Any], list[tuple[str, Any]]]
) -> None:
    tool, params = case
    declared = list(tool["parameters"]["properties"])  # %json writes keys in declared order
    args = dict(sorted(params, key=lambda kv: declared.index(kv[0])))
    text = forced(tool["name"], args)
    assert accepts("kimi_k3", special, [tool], tool["name"], text), text
    assert parse_forced("kimi_k3", text, [tool]) == [(tool["name"], args)]
