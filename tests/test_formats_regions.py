"""Tool-call formats: Hermes/Qwen JSON, Qwen3-Coder XML, Llama 3 JSON, Mistral.

Each format is checked on examples (parallel calls, text around calls, key order, cut-short and
malformed output) and with Hypothesis: rendered calls cut into arbitrary chunks parse back to
the same calls, and any prefix of a rendering (generation stopped anywhere) parses the same
however it is chunked, with argument fragments that join to the final arguments.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_responses.formats.regions import xml_param_value
from mlx_responses.formats.stream import (
    ParsedEvent,
    ReasoningChunk,
    StreamParser,
    TagFormat,
    TextChunk,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
    coalesce,
)

FORMATS: list[TagFormat] = ["hermes", "qwen3_coder", "llama3_json", "mistral"]


def parse(
    text: str | list[str], fmt: TagFormat, *, reasoning: bool = False, **kw: Any
) -> list[ParsedEvent]:
    parser = StreamParser(tool_format=fmt, tools_enabled=True, reasoning=reasoning, **kw)
    events: list[ParsedEvent] = []
    for piece in [text] if isinstance(text, str) else text:
        events += parser.feed(piece)
    return coalesce(events + parser.finish())


def calls(events: list[ParsedEvent]) -> list[tuple[str, Any]]:
    """(name, parsed arguments) of each call, checking the event grammar on the way."""
    check_call_grammar(events)
    return [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCallEnd)]


def texts(events: list[ParsedEvent]) -> list[str]:
    return [e.text for e in events if isinstance(e, TextChunk)]


def check_call_grammar(events: list[ParsedEvent]) -> None:
    """Indices 0..n-1 in order; per call Start, Args*, End with nothing else in between; the
    Args deltas join to the End's arguments; no empty chunk anywhere."""
    open_call: ToolCallStart | None = None
    sent: list[str] = []
    next_index = 0
    for e in events:
        if isinstance(e, ToolCallStart):
            assert open_call is None
            assert e.index == next_index
            open_call, sent = e, []
            next_index += 1
        elif isinstance(e, ToolCallArgs):
            assert open_call is not None
            assert e.index == open_call.index
            assert e.delta
            sent.append(e.delta)
        elif isinstance(e, ToolCallEnd):
            assert open_call is not None
            assert e.index == open_call.index
            assert e.name == open_call.name
            assert "".join(sent) == e.arguments
            open_call = None
        else:
            assert open_call is None, f"{e} inside a call"
            assert e.text
    assert open_call is None


# --- Hermes / Qwen JSON ----------------------------------------------------------------------

BUNDLED_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_hermes_bundled_model_call() -> None:
    assert parse(BUNDLED_CALL, "hermes") == [
        ToolCallStart(0, "get_weather"),
        ToolCallArgs(0, '{"city": "Paris"}'),
        ToolCallEnd(0, "get_weather", '{"city": "Paris"}'),
    ]


def test_hermes_streams_start_at_the_name_and_arguments_as_generated() -> None:
    parser = StreamParser(tool_format="hermes", tools_enabled=True, reasoning=True)
    assert parser.feed("Checking.\n<tool_call>\n{") == [TextChunk("Checking.")]
    assert parser.feed('"name": "get_weather"') == [ToolCallStart(0, "get_weather")]
    assert parser.feed(', "arguments": {"ci') == [ToolCallArgs(0, '{"ci')]
    assert parser.feed('ty": "Paris"}') == [ToolCallArgs(0, 'ty": "Paris"}')]
    assert parser.feed("}\n</tool_call>") == [ToolCallEnd(0, "get_weather", '{"city": "Paris"}')]
    assert parser.finish() == []


def test_hermes_arguments_before_name() -> None:
    parser = StreamParser(tool_format="hermes", tools_enabled=True, reasoning=False)
    assert parser.feed('<tool_call>\n{"arguments": {"city": "Paris"}, ') == []
    assert parser.feed('"name": "get_weather"}') == [
        ToolCallStart(0, "get_weather"),
        ToolCallArgs(0, '{"city": "Paris"}'),
        ToolCallEnd(0, "get_weather", '{"city": "Paris"}'),
    ]
    assert parser.feed("\n</tool_call>") == []


def test_hermes_parallel_calls_with_text_around() -> None:
    text = (
        "Let me look both up.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>\n'
        "Done."
    )
    events = parse(text, "hermes")
    assert calls(events) == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"tz": "Europe/Paris"}),
    ]
    assert texts(events) == ["Let me look both up.", "Done."]
    assert events[0] == TextChunk("Let me look both up.")
    assert events[-1] == TextChunk("Done.")


def test_hermes_two_objects_in_one_block_and_junk_after_a_call() -> None:
    text = (
        '<tool_call>\n{"name": "a", "arguments": {}}}\n{"name": "b", "arguments": {"x": [1, 2]}}'
        "\n</tool_call>"
    )
    events = parse(text, "hermes")
    assert calls(events) == [("a", {}), ("b", {"x": [1, 2]})]
    assert texts(events) == []


@pytest.mark.parametrize(
    ("body", "arguments"),
    [
        ('{"name": "f"}', "{}"),
        ('{"name": "f", "arguments": null}', "{}"),
        ('{"name": "f", "arguments": "{\\"a\\": 1}"}', '{"a": 1}'),
        ('{"name": "f", "parameters": {"a": 1}}', '{"a": 1}'),
        ('{"id": "x", "name": "f", "arguments": {"s": "}{\\"\\\\"}}', '{"s": "}{\\"\\\\"}'),
        ('{"name": "f", "arguments": {"é": "日本 🙂"}}', '{"é": "日本 🙂"}'),
        ('{"name": "f", "arguments": {"a": 1}', '{"a": 1}'),  # missing close brace
    ],
)
def test_hermes_argument_shapes(body: str, arguments: str) -> None:
    for text in (f"<tool_call>\n{body}\n</tool_call>", f"<tool_call>{body}"):
        assert parse(text, "hermes")[-1] == ToolCallEnd(0, "f", arguments)


def test_hermes_cut_short_call_ends_with_what_was_generated() -> None:
    events = parse('<tool_call>\n{"name": "f", "arguments": {"city": "Par', "hermes")
    assert events == [
        ToolCallStart(0, "f"),
        ToolCallArgs(0, '{"city": "Par'),
        ToolCallEnd(0, "f", '{"city": "Par'),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\nnot json\n</tool_call>",
        '<tool_call>\n{"nam',
        '<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>',
        '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
        "<tool_call></tool_call>",
        "<tool_call>",
    ],
)
def test_hermes_not_a_call_is_text(text: str) -> None:
    assert parse(text, "hermes") == [TextChunk(text)]


def test_hermes_failed_block_is_reread_so_later_markers_count() -> None:
    text = '<tool_call>oops <think>hm</think> <tool_call>{"name": "f", "arguments": {}}'
    events = parse(text, "hermes", reasoning=True)
    assert events == [
        TextChunk("<tool_call>oops "),
        ReasoningChunk("hm"),
        ToolCallStart(0, "f"),
        ToolCallArgs(0, "{}"),
        ToolCallEnd(0, "f", "{}"),
    ]


def test_tools_disabled_markers_are_text() -> None:
    for fmt in FORMATS:
        parser = StreamParser(tool_format=fmt, tools_enabled=False, reasoning=False)
        text = BUNDLED_CALL + '{"name": "f", "parameters": {}}[TOOL_CALLS]f[ARGS]{}<function=g>'
        assert coalesce(parser.feed(text) + parser.finish()) == [TextChunk(text)]


# --- Qwen3-Coder XML -------------------------------------------------------------------------

CODER_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)


def test_qwen3_coder_call_streams_parameters_as_they_complete() -> None:
    parser = StreamParser(tool_format="qwen3_coder", tools_enabled=True, reasoning=False)
    assert parser.feed("<tool_call>\n<function=get_weather>") == [
        ToolCallStart(0, "get_weather"),
        ToolCallArgs(0, "{"),
    ]
    assert parser.feed("\n<parameter=city>\nPar") == []
    assert parser.feed("is\n</parameter>\n") == [ToolCallArgs(0, '"city": "Paris"')]
    assert parser.feed("<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>") == [
        ToolCallArgs(0, ', "days": 3'),
        ToolCallArgs(0, "}"),
        ToolCallEnd(0, "get_weather", '{"city": "Paris", "days": 3}'),
    ]
    assert parser.finish() == []


def test_qwen3_coder_parallel_bare_and_text_around() -> None:
    text = (
        "I will check.\n" + CODER_CALL + "\n<function=get_time>\n</function>\n"
        "<tool_call>\n<function=a>\n</function>\n<function=b>\n<parameter=x>\n[1]\n</parameter>"
        "\n</function>\n</tool_call>\nOK"
    )
    events = parse(text, "qwen3_coder")
    assert calls(events) == [
        ("get_weather", {"city": "Paris", "days": 3}),
        ("get_time", {}),
        ("a", {}),
        ("b", {"x": [1]}),
    ]
    assert texts(events) == ["I will check.", "OK"]


def test_qwen3_coder_missing_parameter_close_and_cut_short_value() -> None:
    text = "<tool_call>\n<function=f>\n<parameter=a>\nx\n<parameter=b>\nmulti\nline"
    events = parse(text, "qwen3_coder")
    assert calls(events) == [("f", {"a": "x", "b": "multi\nline"})]


def test_qwen3_coder_value_typing() -> None:
    assert xml_param_value("Paris") == "Paris"
    assert xml_param_value("42") == 42
    assert xml_param_value("-1.5") == -1.5
    assert xml_param_value("true") is True
    assert xml_param_value("null") is None
    assert xml_param_value('{"a": [1]}') == {"a": [1]}
    assert xml_param_value('"quoted"') == '"quoted"'
    assert xml_param_value("1e999") == "1e999"
    assert xml_param_value("NaN") == "NaN"
    assert xml_param_value("42", {"type": "string"}) == "42"
    assert xml_param_value("True", {"type": "boolean"}) is True
    assert xml_param_value("7", {"type": ["string", "null"]}) == "7"
    assert xml_param_value("null", {"type": ["string", "null"]}) is None


def test_qwen3_coder_schema_types_values() -> None:
    text = "<function=f>\n<parameter=zip>\n01234\n</parameter>\n<parameter=n>\n5\n</parameter>\n</function>"
    schemas = {"f": {"type": "object", "properties": {"zip": {"type": "string"}}}}
    assert calls(parse(text, "qwen3_coder", tool_schemas=schemas)) == [
        ("f", {"zip": "01234", "n": 5})
    ]


@pytest.mark.parametrize(
    "text",
    [
        "<function=get weather>\n</function>",
        "<function=f\n",
        "<tool_call>\n<function=>",
        "<function=",
    ],
)
def test_qwen3_coder_bad_function_tag_is_text(text: str) -> None:
    assert parse(text, "qwen3_coder") == [TextChunk(text)]


def test_json_and_xml_bodies_both_parse_inside_tool_call() -> None:
    assert calls(parse(CODER_CALL, "hermes")) == [("get_weather", {"city": "Paris", "days": 3})]
    assert calls(parse(BUNDLED_CALL, "qwen3_coder")) == [("get_weather", {"city": "Paris"})]
    assert parse("<function=f></function>", "hermes") == [TextChunk("<function=f></function>")]


# --- Llama 3 JSON ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        '\n {"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}',
        '{"parameters": {"city": "Paris"}, "name": "get_weather"}',
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    ],
)
def test_llama3_single_call(text: str) -> None:
    events = parse(text, "llama3_json")
    assert calls(events) == [("get_weather", {"city": "Paris"})]
    assert texts(events) == []


def test_llama3_parallel_calls_then_text() -> None:
    text = '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}\n{"name": "c", "parameters": {}}\nDone.'
    events = parse(text, "llama3_json")
    assert calls(events) == [("a", {}), ("b", {"x": 1}), ("c", {})]
    assert texts(events) == ["Done."]


def test_llama3_streams_once_name_and_parameters_are_seen() -> None:
    parser = StreamParser(tool_format="llama3_json", tools_enabled=True, reasoning=False)
    assert parser.feed('{"name": "f", ') == []
    assert parser.feed('"parameters": {"a"') == [ToolCallStart(0, "f"), ToolCallArgs(0, '{"a"')]
    assert parser.feed(": 1}}") == [ToolCallArgs(0, ": 1}"), ToolCallEnd(0, "f", '{"a": 1}')]


@pytest.mark.parametrize(
    "text",
    [
        '{"answer": 42}',
        '{"name": "Bob", "age": 3}',
        '{"name": "Bob"}',
        '{"name": "f", "parameters": "x"}',
        'Sure: {"name": "f", "parameters": {}}',
        "<|python_tag|>brave_search.call(query='x')",
        "{",
        "   ",
    ],
)
def test_llama3_not_a_call_is_text(text: str) -> None:
    assert parse(text, "llama3_json") == [TextChunk(text)]


def test_llama3_after_a_call_a_plain_object_is_text() -> None:
    events = parse('{"name": "a", "parameters": {}}\n{"answer": 1}', "llama3_json")
    assert calls(events) == [("a", {})]
    assert texts(events) == ['{"answer": 1}']


def test_llama3_call_after_reasoning() -> None:
    text = '<think>\nuse the tool\n</think>\n\n{"name": "f", "parameters": {"a": 1}}'
    events = parse(text, "llama3_json", reasoning=True)
    assert events[0] == ReasoningChunk("use the tool")
    assert calls(events) == [("f", {"a": 1})]


# --- Mistral ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}get_time[ARGS]{}',
        '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS] {}',
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]',
        '[TOOL_CALLS][{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}", "id": "abc123def"},{"name": "get_time"}]',
    ],
)
def test_mistral_two_calls(text: str) -> None:
    events = parse("Sure. " + text + " Anything else?", "mistral")
    assert calls(events) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert texts(events) == ["Sure.", "Anything else?"]


def test_mistral_streams_arguments() -> None:
    parser = StreamParser(tool_format="mistral", tools_enabled=True, reasoning=False)
    assert parser.feed("[TOOL_CALLS]get_weath") == []
    assert parser.feed("er[AR") == []
    assert parser.feed('GS]{"city"') == [
        ToolCallStart(0, "get_weather"),
        ToolCallArgs(0, '{"city"'),
    ]
    assert parser.feed(': "Paris"}') == [
        ToolCallArgs(0, ': "Paris"}'),
        ToolCallEnd(0, "get_weather", '{"city": "Paris"}'),
    ]


@pytest.mark.parametrize(
    "text", ["[TOOL_CALLS]", "[TOOL_CALLS] hello there", "[TOOL_CALLS]f(x)", "[TOOL_CALLS][1, 2]"]
)
def test_mistral_not_a_call_is_text(text: str) -> None:
    assert parse(text, "mistral") == [TextChunk(text)]


def test_mistral_cut_short() -> None:
    events = parse('[TOOL_CALLS]f[ARGS]{"a": [1, ', "mistral")
    assert events[-1] == ToolCallEnd(0, "f", '{"a": [1, ')
    check_call_grammar(events)


# --- Hypothesis: rendered calls, any chunking, any cut ---------------------------------------

NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
WORDS = st.text(alphabet="abcdeé日 XYZ.!?", min_size=1, max_size=12).filter(
    lambda s: s.strip() and s.strip() not in ("true", "false", "null")
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | WORDS | st.just('q"u\\o}{'),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(WORDS, inner, max_size=3),
    max_leaves=6,
)
ARGS = st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), JSON_VALUES, max_size=4)
CALLS = st.lists(st.tuples(NAMES, ARGS), min_size=1, max_size=3)
PLAIN = st.text(alphabet="Hi there, ok. é🙂\n", max_size=20)


def render(fmt: TagFormat, calls_: list[tuple[str, dict[str, Any]]], variant: int) -> str:
    if fmt == "hermes":
        blocks = []
        for name, args in calls_:
            a = json.dumps(args, ensure_ascii=variant % 2 == 0)
            body = (
                f'{{"name": "{name}", "arguments": {a}}}'
                if variant % 3
                else f'{{"arguments": {a}, "name": "{name}"}}'
            )
            blocks.append(f"<tool_call>\n{body}\n</tool_call>")
        return "\n".join(blocks)
    if fmt == "qwen3_coder":
        blocks = []
        for name, args in calls_:
            params = "".join(
                f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
                for k, v in args.items()
            )
            blocks.append(f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
        return "\n".join(blocks)
    if fmt == "llama3_json":
        objs = [json.dumps({"name": n, "parameters": a}) for n, a in calls_]
        return ("<|python_tag|>" if variant % 2 else "") + ("; " if variant % 3 else "\n").join(
            objs
        )
    if variant % 2:
        return "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in calls_])
    sep = "[TOOL_CALLS]" if variant % 3 else ""
    return "[TOOL_CALLS]" + sep.join(f"{n}[ARGS]{json.dumps(a)}" for n, a in calls_)


def xml_expected(args: dict[str, Any]) -> dict[str, Any]:
    return {k: xml_param_value(v if isinstance(v, str) else json.dumps(v)) for k, v in args.items()}


@st.composite
def chunkings(draw: st.DrawFn, text: str) -> list[str]:
    cuts = sorted(set(draw(st.lists(st.integers(0, len(text)), max_size=16))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@settings(max_examples=150, deadline=None)
@given(
    fmt=st.sampled_from(FORMATS),
    calls_=CALLS,
    variant=st.integers(0, 5),
    before=PLAIN,
    after=PLAIN,
    data=st.data(),
)
def test_rendered_calls_parse_back_under_any_chunking(
    fmt: TagFormat,
    calls_: list[tuple[str, dict[str, Any]]],
    variant: int,
    before: str,
    after: str,
    data: st.DataObject,
) -> None:
    if fmt == "llama3_json":
        before = ""  # Llama 3 calls count only at the very start
    text = before + render(fmt, calls_, variant) + after
    events = parse(data.draw(chunkings(text)), fmt)
    assert events == parse(text, fmt) == parse(list(text), fmt)
    expected = [(n, xml_expected(a) if fmt == "qwen3_coder" else a) for n, a in calls_]
    assert calls(events) == expected
    shown = [t for t in (before.rstrip(), after.lstrip()) if t]
    assert texts(events) == shown


@settings(max_examples=150, deadline=None)
@given(
    fmt=st.sampled_from(FORMATS),
    calls_=CALLS,
    variant=st.integers(0, 5),
    after=PLAIN,
    cut=st.floats(0, 1),
    data=st.data(),
)
def test_generation_stopped_anywhere_parses_the_same_however_chunked(
    fmt: TagFormat,
    calls_: list[tuple[str, dict[str, Any]]],
    variant: int,
    after: str,
    cut: float,
    data: st.DataObject,
) -> None:
    full = render(fmt, calls_, variant) + after
    text = full[: int(len(full) * cut)]
    whole = parse(text, fmt)
    assert parse(data.draw(chunkings(text)), fmt) == whole
    check_call_grammar(whole)
    ends = [e for e in whole if isinstance(e, ToolCallEnd)]
    for end, (name, _) in zip(ends, calls_, strict=False):
        assert end.name == name
    if fmt == "qwen3_coder":  # XML arguments are built as JSON: they always parse
        for end in ends:
            json.loads(end.arguments)


EDITS = [
    "<", "{", "}", '"', "\\", ",", ":", " ", "\n", "é", "<tool_call>", "</tool_call>", "[TOOL_CALLS]",
    "[ARGS]", "<function=g>", "<parameter=y>", "</parameter>", "</function>", "<think>", "</think>",
    '"name": "h", ', "null", "]", "[",
]  # fmt: skip


@st.composite
def damaged_renders(draw: st.DrawFn) -> tuple[TagFormat, str]:
    """A rendering with a few insertions and deletions: text near a call, but not quite one."""
    fmt = draw(st.sampled_from(FORMATS))
    text = render(fmt, draw(CALLS), draw(st.integers(0, 5))) + draw(PLAIN)
    if fmt != "llama3_json":
        text = draw(PLAIN) + text
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        if draw(st.booleans()):
            text = text[:i] + draw(st.sampled_from(EDITS)) + text[i:]
        else:
            text = text[:i] + text[draw(st.integers(i, min(len(text), i + 6))) :]
    return fmt, text


@settings(max_examples=200, deadline=None)
@given(damaged=damaged_renders(), reasoning=st.booleans(), data=st.data())
def test_damaged_calls_parse_the_same_however_chunked(
    damaged: tuple[TagFormat, str], reasoning: bool, data: st.DataObject
) -> None:
    fmt, text = damaged
    whole = parse(text, fmt, reasoning=reasoning)
    assert parse(data.draw(chunkings(text)), fmt, reasoning=reasoning) == whole
    assert parse(list(text), fmt, reasoning=reasoning) == whole
    check_call_grammar(whole)
