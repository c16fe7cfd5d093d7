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

from mlx_responses import formats
from mlx_responses.formats import (
    ParsedEvent,
    ReasoningChunk,
    TextChunk,
    coalesce,
    reasoning_opens_in_prompt,
)
from mlx_responses.formats.format import ParseOptions
from tests.test_formats_families import Call, calls, chunkings, parse, texts
from tests.test_formats_families import idents as names
from tests.test_formats_family_grammars import WEATHER, accepts, tools_and_call
from tests.test_formats_family_grammars import parse as parse_forced
from tests.test_formats_family_render import TOOLS, template, tokenizer

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


# -- through Kimi K3's real template (tests/fixtures/families/kimi-k3: llama.cpp's Kimi-K3.jinja)


def render_k3(messages: list[dict[str, Any]], prompt: bool = True, **kwargs: Any) -> str:
    text = tokenizer().apply_chat_template(
        messages,
        tools=TOOLS,
        chat_template=template("kimi-k3"),
        tokenize=False,
        add_generation_prompt=prompt,
        **kwargs,
    )
    assert isinstance(text, str)
    return text


def k3_parse(pieces: list[str], *, starts_in_reasoning: bool) -> list[ParsedEvent]:
    parser = formats.get("kimi_k3").new_parser(
        ParseOptions(
            tools_enabled=True,
            reasoning=True,
            starts_in_reasoning=starts_in_reasoning,
            tool_schemas={"get_weather": TOOLS[0]["function"]["parameters"]},
        )
    )
    events: list[ParsedEvent] = []
    for piece in pieces:
        events += parser.feed(piece)
    return coalesce(events + parser.finish())


def test_the_prompt_opens_the_think_block_unless_effort_is_none() -> None:
    fmt = formats.get("kimi_k3")
    assert fmt.reasons  # its reasoning is its own markup: the model reasons
    chat = [{"role": "user", "content": "hi"}]
    thinking = render_k3(chat, **fmt.replay.template_kwargs("high", {}))
    assert thinking.endswith("<|open|>think<|sep|>")
    assert "`thinking_effort=high`" in thinking
    assert reasoning_opens_in_prompt(thinking)
    plain = render_k3(chat, **fmt.replay.template_kwargs("none", {}))
    assert plain.endswith("<|open|>response<|sep|>")
    assert not reasoning_opens_in_prompt(plain)
    assert "`thinking_effort=max`" in render_k3(chat, **fmt.replay.template_kwargs("xhigh", {}))


def test_a_turn_as_the_template_writes_it_reads_as_reasoning_text_and_a_call() -> None:
    """What the model writes after the prompt's ``<|open|>think<|sep|>``: the rest of the
    assistant message the template renders, its framing never shown."""
    args = {"city": "Paris", "days": 2}
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": args}}
    turn = {
        "role": "assistant",
        "content": "Checking.",
        "reasoning_content": "The user wants the weather.",
        "tool_calls": [call],
    }
    rendered = render_k3([{"role": "user", "content": "Weather?"}, turn], prompt=False)
    assert rendered.endswith("<|close|>message<|sep|><|end_of_msg|>")
    opened = '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>'
    written = rendered[rendered.index(opened) + len(opened) :]
    for pieces in ([written], list(written)):
        events = k3_parse(pieces, starts_in_reasoning=True)
        assert events[0] == ReasoningChunk("The user wants the weather.")
        assert texts(events) == ["Checking."]
        assert calls(events) == [("get_weather", args)]


def test_a_response_without_thinking_shows_no_framing() -> None:
    text = "<|open|>response<|sep|>Hello there.<|close|>response<|sep|><|close|>message<|sep|>"
    for pieces in ([text], list(text)):
        events = k3_parse(pieces, starts_in_reasoning=False)
        assert events == [TextChunk("Hello there.")]


def test_the_template_s_json_block_for_string_arguments_reads_back() -> None:
    """The template writes arguments given as a string as its JSON block."""
    args = {"city": "Paris", "days": 2}
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(args)},
    }
    rendered = render_k3(
        [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ]
    )
    assert OPEN_JSON in rendered
    tools_at = rendered.index("<|open|>tools<|sep|>")
    assert calls(parse(rendered[tools_at:], "kimi_k3")) == [("get_weather", args)]


def test_a_forced_call_may_close_the_think_block_the_prompt_opened() -> None:
    """As the template writes a turn: the think block and an empty response closed, then the
    call; the parser reads it after the prompt's ``<|open|>think<|sep|>`` or its
    ``<|open|>response<|sep|>`` (thinking off)."""
    call = forced("get_weather", {"city": "Paris"})
    closed = "<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>" + call
    for special in (False, True):
        for text in (call, closed, "<|close|>response<|sep|>" + call):
            assert accepts("kimi_k3", special, [WEATHER], "get_weather", text), text
        assert not accepts("kimi_k3", special, [WEATHER], None, "<|close|>think<|sep|>" + call)
    for starts_in_reasoning, text in ((True, closed), (False, "<|close|>response<|sep|>" + call)):
        for pieces in ([text], list(text)):
            events = k3_parse(pieces, starts_in_reasoning=starts_in_reasoning)
            assert calls(events) == [("get_weather", {"city": "Paris"})]
            assert not [e for e in events if isinstance(e, TextChunk | ReasoningChunk)]
