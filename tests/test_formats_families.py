"""The family tool-call formats (GLM-4.x, LongCat, MiniMax M2, Muse Spark, MiniCPM 5, Kimi K2,
DeepSeek V3.x, Gemma 4, FunctionGemma, pythonic/LFM2): examples as each family's template writes
them, and Hypothesis: rendered calls cut into any chunks parse back to the same calls, and any
prefix of a rendering (generation stopped anywhere) gives the same events however it is chunked,
with argument deltas that join to the final arguments.
"""

from __future__ import annotations

import json
import keyword
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_responses import formats
from mlx_responses.formats.family_regions import REGIONS
from mlx_responses.formats.format import ParseOptions
from mlx_responses.formats.json_sections import DEEPSEEK_V3
from mlx_responses.formats.stream import (
    ParsedEvent,
    ReasoningChunk,
    StreamParser,
    TextChunk,
    ToolCallEnd,
    coalesce,
)
from tests.test_formats_regions import check_call_grammar

Call = tuple[str, dict[str, Any]]


def parse(
    text: str | list[str],
    family: str,
    *,
    reasoning: bool = False,
    schemas: dict[str, Any] | None = None,
) -> list[ParsedEvent]:
    parser = StreamParser(
        regions=REGIONS[family], tools_enabled=True, reasoning=reasoning, tool_schemas=schemas
    )
    events: list[ParsedEvent] = []
    for piece in [text] if isinstance(text, str) else text:
        events += parser.feed(piece)
    return coalesce(events + parser.finish())


def calls(events: list[ParsedEvent]) -> list[Call]:
    check_call_grammar(events)
    return [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCallEnd)]


def texts(events: list[ParsedEvent]) -> list[str]:
    return [e.text for e in events if isinstance(e, TextChunk)]


# -- each family's rendering of calls, as its chat template writes them ------------------------


def _kv_value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def render_glm(cs: list[Call]) -> str:
    return "".join(
        f"<tool_call>{name}\n"
        + "".join(
            f"<arg_key>{k}</arg_key>\n<arg_value>{_kv_value(v)}</arg_value>\n"
            for k, v in args.items()
        )
        + "</tool_call>"
        for name, args in cs
    )


def render_longcat(cs: list[Call]) -> str:
    return "".join(
        f"<longcat_tool_call>{name}\n"
        + "".join(
            f"<longcat_arg_key>{k}</longcat_arg_key>\n"
            f"<longcat_arg_value>{_kv_value(v)}</longcat_arg_value>\n"
            for k, v in args.items()
        )
        + "</longcat_tool_call>"
        for name, args in cs
    )


def _invokes(cs: list[Call], prefix: str) -> str:
    return "".join(
        f'<{prefix}invoke name="{name}">\n'
        + "".join(
            f'<{prefix}parameter name="{k}">{_kv_value(v)}</{prefix}parameter>\n'
            for k, v in args.items()
        )
        + f"</{prefix}invoke>\n"
        for name, args in cs
    )


def render_minimax(cs: list[Call]) -> str:
    return "<minimax:tool_call>\n" + _invokes(cs, "") + "</minimax:tool_call>"


def render_muse(cs: list[Call]) -> str:
    return "<atem:function_calls>\n" + _invokes(cs, "atem:") + "</atem:function_calls>"


def render_minicpm(cs: list[Call]) -> str:
    return "".join(
        f'<function name="{name}">'
        + "".join(f'<param name="{k}">{_kv_value(v)}</param>' for k, v in args.items())
        + "</function>"
        for name, args in cs
    )


def render_kimi(cs: list[Call]) -> str:
    body = "".join(
        f"<|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>"
        f"{json.dumps(args, ensure_ascii=False)}<|tool_call_end|>"
        for i, (name, args) in enumerate(cs)
    )
    return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"


def render_deepseek(cs: list[Call]) -> str:
    s = DEEPSEEK_V3
    body = "".join(
        f"{s.call_open}{name}{s.sep}{json.dumps(args, ensure_ascii=False)}{s.call_close}"
        for name, args in cs
    )
    return f"{s.section_open}{body}{s.section_close}"


def _gemma_value(v: Any, quote: str) -> str:
    if isinstance(v, str):
        return quote + v + quote
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_gemma_value(x, quote)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_gemma_value(x, quote) for x in v) + "]"
    return json.dumps(v)


GEMMA_QUOTE = '<|"|>'


def render_gemma4(cs: list[Call]) -> str:
    return "".join(
        f"<|tool_call>call:{name}{_gemma_value(args, GEMMA_QUOTE)}<tool_call|>" for name, args in cs
    )


def render_function_gemma(cs: list[Call]) -> str:
    return "".join(
        f"<start_function_call>call:{name}{_gemma_value(args, '<escape>')}<end_function_call>"
        for name, args in cs
    )


def render_pythonic(cs: list[Call]) -> str:
    def call(name: str, args: dict[str, Any]) -> str:
        return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"

    return "<|tool_call_start|>[" + ", ".join(call(n, a) for n, a in cs) + "]<|tool_call_end|>"


def render_kimi_k3(cs: list[Call]) -> str:
    body = "".join(
        f'<|open|>call tool="{name}" index="{i + 1}"<|sep|>'
        + "".join(
            f'<|open|>argument key="{k}" type="{"string" if isinstance(v, str) else "json"}"'
            f"<|sep|>{_kv_value(v)}<|close|>argument<|sep|>"
            for k, v in args.items()
        )
        + "<|close|>call<|sep|>"
        for i, (name, args) in enumerate(cs)
    )
    return f"<|open|>tools<|sep|>{body}<|close|>tools<|sep|>"


RENDER: dict[str, Callable[[list[Call]], str]] = {
    "glm47": render_glm,
    "longcat": render_longcat,
    "minimax_m2": render_minimax,
    "muse_spark": render_muse,
    "minicpm5": render_minicpm,
    "kimi_k2": render_kimi,
    "deepseek_v3": render_deepseek,
    "gemma4": render_gemma4,
    "function_gemma": render_function_gemma,
    "pythonic": render_pythonic,
    "kimi_k3": render_kimi_k3,
}
KV_FAMILIES = {"glm47", "longcat", "minimax_m2", "muse_spark", "minicpm5", "kimi_k3"}
FAMILIES = sorted(RENDER)

WEATHER: list[Call] = [("get_weather", {"city": "Paris", "days": 3})]
SCHEMAS = {"get_weather": {"properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_call_between_text_parses_in_every_chunking(family: str) -> None:
    text = "Let me check. " + RENDER[family](WEATHER) + " Done."
    whole = parse(text, family, schemas=SCHEMAS)
    assert calls(whole) == WEATHER
    assert texts(whole) == ["Let me check.", "Done."]
    for size in (1, 2, 3, 7):
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        assert parse(pieces, family, schemas=SCHEMAS) == whole


@pytest.mark.parametrize("family", FAMILIES)
def test_parallel_calls_keep_their_order(family: str) -> None:
    two: list[Call] = [("get_weather", {"city": "Paris"}), ("ns.lookup", {"q": "x y"})]
    events = parse(RENDER[family](two) + "\n", family)
    assert calls(events) == two
    assert texts(events) == []


@pytest.mark.parametrize("family", FAMILIES)
def test_reasoning_then_call(family: str) -> None:
    events = parse(
        "<think>\nweather?\n</think>\n\n" + RENDER[family](WEATHER),
        family,
        reasoning=True,
        schemas=SCHEMAS,
    )
    assert isinstance(events[0], ReasoningChunk)
    assert events[0].text == "weather?"
    assert calls(events) == WEATHER


@pytest.mark.parametrize("family", FAMILIES)
def test_a_marker_that_starts_no_call_is_text(family: str) -> None:
    marker = next(iter(REGIONS[family]))
    text = f"The marker {marker} is just text here? no."
    events = parse(text, family)
    assert calls(events) == []
    assert "".join(texts(events)) == text


@pytest.mark.parametrize("family", FAMILIES)
def test_without_tools_every_marker_is_text(family: str) -> None:
    text = RENDER[family](WEATHER)
    parser = StreamParser(regions=REGIONS[family], tools_enabled=False, reasoning=False)
    events = coalesce(parser.feed(text) + parser.finish())
    assert events == [TextChunk(text)]


def test_kimi_names_drop_the_functions_prefix_and_index() -> None:
    text = (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.mcp__fs__read:7"
        '<|tool_call_argument_begin|>{"path": "/a"}<|tool_call_end|><|tool_calls_section_end|>'
    )
    assert calls(parse(text, "kimi_k2")) == [("mcp__fs__read", {"path": "/a"})]


def test_deepseek_v3_fenced_calls_are_read() -> None:
    s = DEEPSEEK_V3
    text = (
        f"{s.section_open}{s.call_open}function{s.sep}get_weather\n```json\n"
        f'{{"city": "Paris"}}\n```{s.call_close}{s.section_close}'
    )
    assert calls(parse(text, "deepseek_v3")) == [("get_weather", {"city": "Paris"})]


def test_glm_values_follow_the_schema() -> None:
    text = (
        "<tool_call>f<arg_key>zip</arg_key><arg_value>01234</arg_value>"
        "<arg_key>n</arg_key><arg_value>01234</arg_value>"
        "<arg_key>tags</arg_key><arg_value>[1, 2]</arg_value></tool_call>"
    )
    schemas = {"f": {"properties": {"zip": {"type": "string"}}}}
    assert calls(parse(text, "glm47", schemas=schemas)) == [
        ("f", {"zip": "01234", "n": "01234", "tags": [1, 2]})
    ]


def test_minicpm_cdata_values_keep_markup() -> None:
    text = '<function name="w"><param name="s"><![CDATA[a < b & c]]></param></function>'
    assert calls(parse(text, "minicpm5")) == [("w", {"s": "a < b & c"})]


def test_gemma_bare_words_and_nesting_become_json() -> None:
    text = '<|tool_call>call:f{a:<|"|>x, "y" {z}<|"|>,b:[1,true,null],c:{d:bare word}}<tool_call|>'
    assert calls(parse(text, "gemma4")) == [
        ("f", {"a": 'x, "y" {z}', "b": [1, True, None], "c": {"d": "bare word"}})
    ]


def test_pythonic_json_literals_and_an_unparsable_block() -> None:
    good = "<|tool_call_start|>[f(a=true, b=null, c=[1, 'x'])]<|tool_call_end|>"
    assert calls(parse(good, "pythonic")) == [("f", {"a": True, "b": None, "c": [1, "x"]})]
    bad = "<|tool_call_start|>[f(a=]<|tool_call_end|> ok"
    assert texts(parse(bad, "pythonic")) == [bad]


def test_cut_short_call_ends_with_what_was_written() -> None:
    events = parse("<tool_call>f<arg_key>city</arg_key><arg_value>Par", "glm47")
    assert calls(events) == [("f", {"city": "Par"})]
    events = parse('<minimax:tool_call><invoke name="f"><parameter name="a">1', "minimax_m2")
    assert calls(events) == [("f", {"a": 1})]


# -- Hypothesis --------------------------------------------------------------------------------

idents = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
names = st.one_of(idents, st.builds(lambda a, b: f"{a}.{b}", idents, idents))
# Strings as models write them: no surrounding whitespace (these formats strip values), no
# markup, no text that reads as a JSON non-string.
words = (
    st.text("abcdefghij XYZ,.:!?'-", min_size=1, max_size=12)
    .map(str.strip)
    .filter(lambda s: bool(s) and s not in ("true", "false", "null"))
)
scalars = st.one_of(words, st.integers(-1000, 1000), st.booleans())


# Pythonic calls are Python: a keyword cannot name a function or an argument there (LFM2
# could not write `if()` as a call, and mlx-lm's parser does not read it either).
py_idents = idents.filter(lambda s: not keyword.iskeyword(s))
py_names = st.one_of(py_idents, st.builds(lambda a, b: f"{a}.{b}", py_idents, py_idents))


def call_lists(family: str) -> st.SearchStrategy[list[Call]]:
    values: st.SearchStrategy[Any] = scalars
    if family not in KV_FAMILIES:
        values = st.one_of(scalars, st.lists(scalars, max_size=3), st.none())
    pythonic = family == "pythonic"
    args = st.dictionaries(py_idents if pythonic else idents, values, max_size=3)
    return st.lists(st.tuples(py_names if pythonic else names, args), min_size=1, max_size=3)


def schemas_for(cs: list[Call]) -> dict[str, Any]:
    """String-typed parameters stay strings (a KV value is otherwise read as JSON if it can)."""
    out: dict[str, Any] = {}
    for name, args in cs:
        props = out.setdefault(name, {"properties": {}})["properties"]
        for k, v in args.items():
            if isinstance(v, str):
                props[k] = {"type": "string"}
    return out


def chunkings(text: str) -> st.SearchStrategy[list[str]]:
    cuts = st.lists(st.integers(0, len(text)), max_size=12).map(sorted)
    return cuts.map(lambda c: [text[a:b] for a, b in zip([0, *c], [*c, len(text)], strict=True)])


@st.composite
def generations(draw: st.DrawFn) -> tuple[str, str, list[Call]]:
    family = draw(st.sampled_from(FAMILIES))
    cs = draw(call_lists(family))
    # Same-name calls with different string/non-string typing would clash in one schema.
    if len({n for n, _ in cs}) != len(cs):
        cs = [cs[0]]
    before = draw(st.sampled_from(["", "Sure. ", "Checking:\n"]))
    return family, before + RENDER[family](cs), cs


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.data(), gen=generations())
def test_any_chunking_parses_back_the_rendered_calls(
    data: st.DataObject, gen: tuple[str, str, list[Call]]
) -> None:
    family, text, cs = gen
    schemas = schemas_for(cs)
    whole = parse(text, family, schemas=schemas)
    assert calls(whole) == cs
    pieces = data.draw(chunkings(text))
    assert parse(pieces, family, schemas=schemas) == whole


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.data(), gen=generations())
def test_any_prefix_parses_the_same_however_chunked(
    data: st.DataObject, gen: tuple[str, str, list[Call]]
) -> None:
    family, text, cs = gen
    prefix = text[: data.draw(st.integers(0, len(text)))]
    schemas = schemas_for(cs)
    whole = parse(prefix, family, schemas=schemas)
    check_call_grammar(whole)
    assert parse(data.draw(chunkings(prefix)), family, schemas=schemas) == whole


def test_gemma_reads_json_written_inside_its_notation() -> None:
    """What a forced call's ``%json`` writes for a nested value: quoted keys and strings."""
    text = '<|tool_call>call:f{o:{"a b": [1, "x"], "c": {"d": null}},s:<|"|>t<|"|>}<tool_call|>'
    for pieces in ([text], list(text)):
        assert calls(parse(pieces, "gemma4")) == [
            ("f", {"o": {"a b": [1, "x"], "c": {"d": None}}, "s": "t"})
        ]


def test_kimi_k3_types_values_by_their_type_attribute() -> None:
    text = (
        '<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|>'
        '<|open|>argument key="zip" type="string"<|sep|>01234<|close|>argument<|sep|>'
        '<|open|>argument key="n" type="integer"<|sep|>7<|close|>argument<|sep|>'
        "<|close|>call<|sep|><|close|>tools<|sep|>"
    )
    assert calls(parse(text, "kimi_k3")) == [("f", {"zip": "01234", "n": 7})]


def test_kimi_k3_reasoning_is_its_think_block() -> None:
    fmt = formats.get("kimi_k3")
    parser = fmt.new_parser(ParseOptions(tools_enabled=True, reasoning=True))
    text = "<|open|>think<|sep|>hmm<|close|>think<|sep|>" + render_kimi_k3(WEATHER)
    events = coalesce(parser.feed(text) + parser.finish())
    assert events[0] == ReasoningChunk("hmm")
    assert calls(events) == [("get_weather", {"city": "Paris", "days": 3})]


def test_gemma4_reasoning_is_its_thought_channel() -> None:
    fmt = formats.get("gemma4")
    text = "<|channel>thought\nThe user wants weather.<channel|>" + render_gemma4(WEATHER)
    for pieces in ([text], list(text)):
        parser = fmt.new_parser(ParseOptions(tools_enabled=True, reasoning=True))
        events = []
        for piece in pieces:
            events += parser.feed(piece)
        events = coalesce(events + parser.finish())
        assert events[0] == ReasoningChunk("The user wants weather.")
        assert calls(events) == [("get_weather", {"city": "Paris", "days": 3})]


# -- detection ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "name"),
    [
        ("<minimax:tool_call><invoke name=", "minimax_m2"),
        ("{{ '<|tool_call>call:' }}<tool_call|>", "gemma4"),
        ("<start_function_call>call:", "function_gemma"),
        ("<longcat_tool_call><longcat_arg_key>", "longcat"),
        ("<tool_call>{{ tc.name }}<arg_key>", "glm47"),
        ("<|tool_list_start|>[]<|tool_list_end|>", "pythonic"),
        ("<|tool_call_start|>", "pythonic"),
        (DEEPSEEK_V3.section_open + DEEPSEEK_V3.call_open, "deepseek_v3"),
        ("<|tool_calls_section_begin|>", "kimi_k2"),
        ('<function name="f"><param name="p">', "minicpm5"),
        ("<atem:function_calls>", "muse_spark"),
        # mlx-lm's order: a Qwen3-Coder template also holds <tool_call>, GLM's too
        ("<tool_call>\n<function=f>\n<parameter=p>", "qwen3_coder"),
        ("<tool_call>{{ tool_call.name }}</tool_call>", "hermes"),
    ],
)
def test_templates_detect_as_mlx_lm_does(template: str, name: str) -> None:
    assert formats.detect(formats.Detection(template)).name == name


def test_the_vocabulary_is_the_fallback() -> None:
    lfm = frozenset({"<|tool_call_start|>", "<|tool_call_end|>"})
    assert formats.detect(formats.Detection("plain", lfm)).name == "pythonic"
    # a template that names another format wins over the vocabulary
    hermes = "<tool_call>{{ tool_call.name }}</tool_call>"
    assert formats.detect(formats.Detection(hermes, lfm)).name == "hermes"
    xtml = frozenset({"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"})
    assert formats.detect(formats.Detection("plain", xtml)).name == "kimi_k3"


@pytest.mark.parametrize(
    ("named", "name"),
    [
        ("glm47", "glm47"),
        ("laguna", "glm47"),
        ("kimi_k2", "kimi_k2"),
        ("deepseek", "deepseek_v3"),
        *((n, n) for n in ("function_gemma", "longcat", "minicpm5", "muse_spark", "kimi_k3")),
    ],
)
def test_tool_parser_type_names_the_format(named: str, name: str) -> None:
    assert formats.detect(formats.Detection("<tool_call>", tool_parser_type=named)).name == name


@pytest.mark.parametrize("family", FAMILIES)
def test_a_call_where_the_prompt_opened_reasoning_is_a_call(family: str) -> None:
    """A forced call's grammar writes the call first, also after a prompt that opened
    reasoning (DeepSeek thinking, MiniMax): it is read as a call, in any chunking; reasoning
    text before a marker stays reasoning."""
    text = "\n" + RENDER[family](WEATHER)
    for pieces in ([text], list(text)):
        parser = StreamParser(
            regions=REGIONS[family],
            tools_enabled=True,
            reasoning=True,
            starts_in_reasoning=True,
            tool_schemas=SCHEMAS,
        )
        events: list[ParsedEvent] = []
        for piece in pieces:
            events += parser.feed(piece)
        events = coalesce(events + parser.finish())
        assert calls(events) == WEATHER
        assert not [e for e in events if isinstance(e, ReasoningChunk)]
    parser = StreamParser(
        regions=REGIONS[family], tools_enabled=True, reasoning=True, starts_in_reasoning=True
    )
    events = coalesce(parser.feed("Hmm. " + RENDER[family](WEATHER)) + parser.finish())
    assert calls(events) == []
    assert isinstance(events[0], ReasoningChunk)


@pytest.mark.parametrize("family", ["hermes", "qwen3_coder", "mistral", "glm47", "kimi_k2"])
def test_a_marker_that_starts_no_call_stays_reasoning(family: str) -> None:
    """The other side of reading a call at the start of prompt-opened reasoning: when what
    follows the marker is no call, all of it was reasoning, in any chunking."""
    marker = {"hermes": "<tool_call>", "qwen3_coder": "<function=", "mistral": "[TOOL_CALLS]"}.get(
        family, next(iter(REGIONS.get(family, {"": None})))
    )
    text = f"{marker} is how I would call it?</think>Answer."
    for pieces in ([text], list(text)):
        parser = formats.get(family).new_parser(
            ParseOptions(tools_enabled=True, reasoning=True, starts_in_reasoning=True)
        )
        events: list[ParsedEvent] = []
        for piece in pieces:
            events += parser.feed(piece)
        events = coalesce(events + parser.finish())
        assert events == [ReasoningChunk(f"{marker} is how I would call it?"), TextChunk("Answer.")]


def test_a_forced_hermes_call_after_a_prompt_that_opened_reasoning() -> None:
    text = '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    for pieces in ([text], list(text)):
        parser = formats.get("hermes").new_parser(
            ParseOptions(tools_enabled=True, reasoning=True, starts_in_reasoning=True)
        )
        events: list[ParsedEvent] = []
        for piece in pieces:
            events += parser.feed(piece)
        events = coalesce(events + parser.finish())
        assert calls(events) == [("get_weather", {"city": "Paris"})]
        assert not [e for e in events if isinstance(e, ReasoningChunk)]
