"""Muse's addressed messages (``formats.muse``) through its real template
(``tests/fixtures/families/muse-glimmer``: vLLM's ``tool_chat_template_muse_glimmer.jinja``):
after the prompt's ``<|start|>assistant``, `` to=self`` messages are reasoning, `` to=user`` the
answer, `` to=NAME`` an ATEM call; the framing is never shown, in any chunking; a forced call is
written as the template writes one and reads back.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_responses import formats
from mlx_responses.formats import ParsedEvent, ReasoningChunk, TextChunk, coalesce
from mlx_responses.formats.format import ParseOptions
from tests.test_formats_families import Call, calls, chunkings, render_muse
from tests.test_formats_family_grammars import WEATHER, accepts
from tests.test_formats_family_grammars import parse as parse_forced
from tests.test_formats_family_render import TOOLS, template, tokenizer

SCHEMAS = {"get_weather": TOOLS[0]["function"]["parameters"]}


def parse(pieces: list[str], *, tools: bool = True) -> list[ParsedEvent]:
    fmt = formats.get("muse_spark")
    parser = fmt.new_parser(
        ParseOptions(tools_enabled=tools, reasoning=fmt.reasons, tool_schemas=SCHEMAS)
    )
    events: list[ParsedEvent] = []
    for piece in pieces:
        events += parser.feed(piece)
    return coalesce(events + parser.finish())


def generated(messages: list[dict[str, Any]]) -> str:
    """What the model wrote for the last turn: the template's text after the user's message,
    less the ``<|start|>assistant`` its generation prompt ends with."""
    text = tokenizer().apply_chat_template(
        messages, tools=TOOLS, chat_template=template("muse-glimmer"), tokenize=False
    )
    assert isinstance(text, str)
    turn = text[text.rindex("<|start|>user") :]
    return turn[turn.index("<|eot|>") + len("<|eot|>") + len("<|start|>assistant") :]


USER = {"role": "user", "content": "What is the weather in Paris?"}


def test_reasoning_then_a_call_as_the_template_writes_them() -> None:
    args = {"city": "Paris", "days": 2}
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": args}}
    turn = {"role": "assistant", "reasoning_content": "Weather, then.", "tool_calls": [call]}
    text = generated([USER, turn])
    assert text.startswith(" to=self<|message|>Weather, then.<|eom|>")
    for pieces in ([text], list(text)):
        events = parse(pieces)
        assert events[0] == ReasoningChunk("Weather, then.")
        assert calls(events) == [("get_weather", args)]
        assert not [e for e in events if isinstance(e, TextChunk)]


def test_the_answer_shows_without_its_framing() -> None:
    text = generated([USER, {"role": "assistant", "content": "Sunny, 18 degrees."}])
    assert text == " to=user<|message|>Sunny, 18 degrees.<|eot|>"
    for pieces in ([text], list(text)):
        assert parse(pieces) == [TextChunk("Sunny, 18 degrees.")]


def test_a_header_that_starts_no_call_is_text() -> None:
    text = " to=get_weather<|message|>no block here<|eot|>"
    for pieces in ([text], list(text)):
        assert parse(pieces) == [TextChunk(" to=get_weather<|message|>no block here")]
    # without tools, a call's message is text too
    call = ' to=f<|message|><atem:function_calls>\n<atem:invoke name="f">\n</atem:invoke>\n'
    assert calls(parse([call], tools=False)) == []


words = st.text("abc XYZ.,", min_size=1, max_size=12).map(str.strip).filter(bool)


@st.composite
def turns(draw: st.DrawFn) -> tuple[str, list[Any]]:
    """Messages as the template writes them: reasoning, calls (one per message), an answer."""
    parts: list[str] = []
    expected: list[Any] = []
    if draw(st.booleans()):
        thought = draw(words)
        parts.append(f" to=self<|message|>{thought}<|eom|>")
        expected.append(("reasoning", thought))
    for name, args in draw(
        st.lists(
            st.tuples(
                st.sampled_from(["get_weather", "ns.find"]),
                st.dictionaries(st.sampled_from(["q", "n"]), st.integers(0, 99), max_size=2),
            ),
            max_size=2,
        )
    ):
        call: Call = (name, args)
        parts.append(f" to={name}<|message|>{render_muse([call])}<|eom|>")
        expected.append(("call", call))
    if draw(st.booleans()) or not expected:
        answer = draw(words)
        parts.append(f" to=user<|message|>{answer}<|eot|>")
        expected.append(("text", answer))
    return "<|start|>assistant".join(parts), expected


@settings(max_examples=200, deadline=None, derandomize=True)
@given(data=st.data(), turn=turns())
def test_any_turn_reads_the_same_in_any_chunking(
    data: st.DataObject, turn: tuple[str, list[Any]]
) -> None:
    text, expected = turn
    whole = parse([text])
    read: list[Any] = []
    for e in whole:
        if isinstance(e, ReasoningChunk):
            read.append(("reasoning", e.text))
        elif isinstance(e, TextChunk):
            read.append(("text", e.text))
    read += [("call", c) for c in calls(whole)]
    kinds = sorted(expected, key=lambda x: ["reasoning", "text", "call"].index(x[0]))
    assert sorted(read, key=lambda x: ["reasoning", "text", "call"].index(x[0])) == kinds
    assert parse(data.draw(chunkings(text))) == whole


def test_a_forced_call_is_written_as_the_template_writes_one() -> None:
    args = {"city": "Paris", "days": 2}
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": args}}
    text = generated([USER, {"role": "assistant", "tool_calls": [call]}])
    text = text.removesuffix("<|eot|>")
    for special in (False, True):
        assert accepts("muse_spark", special, [WEATHER], "get_weather", text), text
    assert parse_forced("muse_spark", text, [WEATHER]) == [("get_weather", args)]
