"""The composite stream parser: reasoning, hold-back, format detection, chunking invariance.

The central property: for any text (built from markers, partial markers, JSON pieces and
unicode) and any split of it into chunks, the events after merging adjacent chunks of one kind
equal those for the whole text; and reasoning never shows up as visible text.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_responses import formats
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
    reasoning_opens_in_prompt,
)

FORMATS: list[TagFormat] = ["hermes", "qwen3_coder", "llama3_json", "mistral", "none"]


def parse(text: str | list[str], **kw: Any) -> list[ParsedEvent]:
    defaults: dict[str, Any] = {"tool_format": "hermes", "tools_enabled": True, "reasoning": True}
    kw = defaults | kw
    parser = StreamParser(**kw)
    events: list[ParsedEvent] = []
    for piece in [text] if isinstance(text, str) else text:
        events += parser.feed(piece)
    return coalesce(events + parser.finish())


@st.composite
def chunkings(draw: st.DrawFn, text: str) -> list[str]:
    cuts = sorted(set(draw(st.lists(st.integers(0, len(text)), max_size=20))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def check_grammar(events: list[ParsedEvent]) -> None:
    open_index, sent, count = -1, "", 0
    for e in events:
        if isinstance(e, ToolCallStart):
            assert open_index == -1
            assert e.index == count
            open_index, sent, count = e.index, "", count + 1
        elif isinstance(e, ToolCallArgs):
            assert e.index == open_index
            assert e.delta
            sent += e.delta
        elif isinstance(e, ToolCallEnd):
            assert e.index == open_index
            assert e.arguments == sent
            open_index = -1
        else:
            assert open_index == -1
            assert e.text


# --- Reasoning -------------------------------------------------------------------------------

BUNDLED_THINK = "<think>\n2 plus 2 makes 4.\n</think>\n\nThe answer is 4."


def test_bundled_model_reasoning() -> None:
    assert parse(BUNDLED_THINK) == [
        ReasoningChunk("2 plus 2 makes 4."),
        TextChunk("The answer is 4."),
    ]


def test_reasoning_off_leaves_tags_as_text() -> None:
    assert parse(BUNDLED_THINK, reasoning=False) == [TextChunk(BUNDLED_THINK)]


def test_starts_in_reasoning() -> None:
    text = "The user wants 4.\n</think>\n\nThe answer is 4."
    assert parse(text, starts_in_reasoning=True) == [
        ReasoningChunk("The user wants 4."),
        TextChunk("The answer is 4."),
    ]
    # Not told, the reasoning shows as text; only the stray tag and the blank lines go.
    assert parse(text, starts_in_reasoning=False) == [
        TextChunk("The user wants 4.\nThe answer is 4.")
    ]


def test_starts_in_reasoning_streams_from_the_first_token() -> None:
    parser = StreamParser(
        tool_format="hermes", tools_enabled=True, reasoning=True, starts_in_reasoning=True
    )
    assert parser.feed("Hmm") == [ReasoningChunk("Hmm")]
    assert parser.feed(", so 4.\n</thi") == [ReasoningChunk(", so 4.")]
    assert parser.feed("nk>\n\nFour") == [TextChunk("Four")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>\n\n</think>\n\nHi", [TextChunk("Hi")]),
        ("<think>still thinking when cut", [ReasoningChunk("still thinking when cut")]),
        ("<think>cut at </thi", [ReasoningChunk("cut at </thi")]),
        ("Hi</think>\n there", [TextChunk("Hithere")]),
        ("A <think>b</think> c <think>d</think>", [
            TextChunk("A "), ReasoningChunk("b"), TextChunk("c "), ReasoningChunk("d"),
        ]),
        ("<think>a <think> b</think>c", [ReasoningChunk("a <think> b"), TextChunk("c")]),
    ],
)  # fmt: skip
def test_reasoning_edges(text: str, expected: list[ParsedEvent]) -> None:
    assert parse(text, tools_enabled=False) == expected


def test_reasoning_holds_only_a_possible_close_tag() -> None:
    parser = StreamParser(tool_format="none", tools_enabled=False, reasoning=True)
    assert parser.feed("<think>abc <") == [ReasoningChunk("abc")]
    assert parser.feed("b> d</think>x") == [ReasoningChunk(" <b> d"), TextChunk("x")]


@pytest.mark.parametrize(
    ("prompt", "opens"),
    [
        ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n", True),
        ("<\uff5cAssistant\uff5c><think>", True),
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),
        ("<|im_start|>assistant\n", False),
        ("<think>\nold\n</think>\n\nanswer<|im_end|>\n<|im_start|>assistant\n", False),
    ],
)
def test_reasoning_opens_in_prompt(prompt: str, opens: bool) -> None:
    assert reasoning_opens_in_prompt(prompt) is opens


# --- Visible text: hold-back and whitespace --------------------------------------------------


def test_text_is_only_held_while_it_could_be_a_marker() -> None:
    parser = StreamParser(tool_format="none", tools_enabled=False, reasoning=True)
    assert parser.feed("Hello wor") == [TextChunk("Hello wor")]
    assert parser.feed("ld <th") == [TextChunk("ld ")]
    assert parser.feed("e end") == [TextChunk("<the end")]
    assert parser.feed("<tool_call>[TOOL") == [TextChunk("<tool_call>[TOOL")]


def test_with_tools_whitespace_waits_for_what_follows() -> None:
    parser = StreamParser(tool_format="hermes", tools_enabled=True, reasoning=False)
    assert parser.feed("Let me check.\n") == [TextChunk("Let me check.")]
    assert parser.feed("\nOK <tool") == [TextChunk("\n\nOK")]
    assert parser.feed('_call>{"name": "f"') == [ToolCallStart(0, "f")]
    assert parser.finish() == [ToolCallArgs(0, "{}"), ToolCallEnd(0, "f", "{}")]


def test_no_whitespace_only_message_between_or_after_calls() -> None:
    call = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    events = parse(f"  {call}\n\n{call}\n\n")
    assert [type(e) for e in events] == [ToolCallStart, ToolCallArgs, ToolCallEnd] * 2


def test_finish_then_feed() -> None:
    parser = StreamParser(tool_format="hermes", tools_enabled=True, reasoning=True)
    assert parser.feed("<tool") == []
    assert parser.finish() == [TextChunk("<tool")]
    assert parser.finish() == []
    with pytest.raises(RuntimeError):
        parser.feed("x")


def test_tool_call_count() -> None:
    parser = StreamParser(tool_format="mistral", tools_enabled=True, reasoning=False)
    parser.feed("[TOOL_CALLS]a[ARGS]{}b[ARGS]{}")
    parser.finish()
    assert parser.tool_calls == 2


# --- Format detection ------------------------------------------------------------------------

QWEN3_TEMPLATE = """{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}...
{{- '</tools>\\n\\nFor each function call, return a json object with function name and arguments
within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments":
<args-json-object>}\\n</tool_call><|im_end|>\\n' }}{%- endif %}
{%- for tool_call in message.tool_calls %}{{- '<tool_call>\\n{"name": "' }}{{- tool_call.name }}
{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

QWEN3_CODER_TEMPLATE = """{%- if tools %}<tools>{% for tool in tools %}<function>...{% endfor %}
If you choose to call a function ONLY reply in the following format with NO suffix:
<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1
\\n</parameter>\\n</function>\\n</tool_call>{%- endif %}
{%- for tool_call in message.tool_calls %}{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
{%- for args_name, args_value in tool_call.arguments|items %}{{- '<parameter=' + args_name + '>\\n' }}"""

LLAMA31_TEMPLATE = """{%- if builtin_tools is defined or tools is not none %}
{{- "Environment: ipython\\n" }}{%- endif %}
{{- '{"name": "' + tool_call.name + '", ' }}{{- '"parameters": ' }}{{- tool_call.arguments | tojson }}
{%- if builtin_tools is defined %}{{- "<|python_tag|>" + tool_call.name + ".call(" }}{%- endif %}
{%- elif message.role == "tool" or message.role == "ipython" %}
{{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}"""

LLAMA32_TEMPLATE = """{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Environment: ipython\\n" }}{{- 'Respond in the format {"name": function name, "parameters":
dictionary of argument name and its value}.' }}{%- if message.role == "ipython" %}
{{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}{%- endif %}"""

MISTRAL_TEMPLATE = """{%- if tools is not none and (message == user_messages[-1]) %}
{{- "[AVAILABLE_TOOLS]" }}{{- tools|tojson }}{{- "[/AVAILABLE_TOOLS]" }}{%- endif %}
{%- elif message.tool_calls is defined and message.tool_calls is not none %}
{{- "[TOOL_CALLS]" }}{%- for tool in message.tool_calls %}{{- tool.function.name + "[ARGS]" }}
{{- tool.function.arguments }}{%- endfor %}{{- eos_token }}"""

PLAIN_TEMPLATE = """{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' +
message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}
{{ '<|im_start|>assistant\\n' }}{% endif %}"""

GLM_TEMPLATE = """<tool_call>{{ tc.name }}\\n{% for k, v in tc.arguments.items() %}<arg_key>{{ k }}
</arg_key>\\n<arg_value>{{ v }}</arg_value>{% endfor %}</tool_call>"""


def detect_tool_format(template: str) -> str:
    return formats.detect(formats.Detection(template)).name


@pytest.mark.parametrize(
    ("template", "fmt"),
    [
        (QWEN3_TEMPLATE, "hermes"),
        (QWEN3_CODER_TEMPLATE, "qwen3_coder"),
        (LLAMA31_TEMPLATE, "llama3_json"),
        (LLAMA32_TEMPLATE, "llama3_json"),
        (MISTRAL_TEMPLATE, "mistral"),
        (PLAIN_TEMPLATE, "none"),
        (GLM_TEMPLATE, "glm47"),
        ("", "none"),
    ],
)
def test_detect_tool_format(template: str, fmt: TagFormat) -> None:
    assert detect_tool_format(template) == fmt


def test_detect_bundled_template() -> None:
    from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH

    template = (BUNDLED_MODEL_PATH / "chat_template.jinja").read_text()
    assert detect_tool_format(template) == "hermes"


# --- Hypothesis: any text, any chunking ------------------------------------------------------

FRAGMENTS = [
    "Hello", " ", "\n", "\n\n", "é", "日本", "🙂", "<", ">", "/", "{", "}", "[", "]", '"', "\\",
    ",", ":", ";", "a", "42", "true", "<thin", "<think>", "</think>", "</thi", "nk>", "<tool_ca",
    "<tool_call>", "</tool_call>", "ll>", "[TOOL", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "f",
    "<function=", "<function=f>", "<parameter=", "<parameter=x>", "</parameter>", "</function>",
    "<|python_tag|>", "<|py", '"name"', '"arguments"', '"parameters"', '"f"', ': ', '{"name": "f", ',
    '"arguments": {"a": ', '"parameters": {', '[{"name": "g", "arguments": {}}]', "null", "id",
]  # fmt: skip
SOUP = st.lists(st.sampled_from(FRAGMENTS), max_size=30).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    text=SOUP,
    fmt=st.sampled_from(FORMATS),
    tools=st.booleans(),
    reasoning=st.booleans(),
    starts=st.booleans(),
    data=st.data(),
)
def test_any_chunking_gives_the_whole_text_parse(
    text: str, fmt: TagFormat, tools: bool, reasoning: bool, starts: bool, data: st.DataObject
) -> None:
    kw: dict[str, Any] = {
        "tool_format": fmt,
        "tools_enabled": tools,
        "reasoning": reasoning,
        "starts_in_reasoning": starts,
    }
    whole = parse(text, **kw)
    assert parse(data.draw(chunkings(text)), **kw) == whole
    assert parse(list(text), **kw) == whole
    check_grammar(whole)
    if not tools:
        assert not any(isinstance(e, ToolCallStart) for e in whole)
    if not tools and not (reasoning and starts):
        shown = "".join(e.text for e in whole if isinstance(e, TextChunk | ReasoningChunk))
        if not reasoning:
            assert shown == text


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=40), fmt=st.sampled_from(FORMATS), data=st.data())
def test_any_unicode_text_any_chunking(text: str, fmt: TagFormat, data: st.DataObject) -> None:
    whole = parse(text, tool_format=fmt)
    assert parse(data.draw(chunkings(text)), tool_format=fmt) == whole
    check_grammar(whole)


VISIBLE = st.lists(
    st.sampled_from(
        ["Hi", " ", "\n", "<thin", "</thi", "<", "{", "<tool_call>", "[TOOL_CALLS]", "é"]
    ),
    max_size=8,
).map("".join)
REASONING = st.lists(
    st.sampled_from(["ж", "ж ж", "\n", " ", "</thi", "</", "<think>", "<tool_call>", "{", "λ"]),
    max_size=8,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    before=VISIBLE,
    thought=REASONING,
    after=VISIBLE,
    starts=st.booleans(),
    fmt=st.sampled_from(FORMATS),
    data=st.data(),
)
def test_reasoning_never_leaks_into_text(
    before: str, thought: str, after: str, starts: bool, fmt: TagFormat, data: st.DataObject
) -> None:
    text = (
        thought + "</think>" + after
        if starts
        else before + "<think>" + thought + "</think>" + after
    )
    events = parse(data.draw(chunkings(text)), tool_format=fmt, starts_in_reasoning=starts)
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningChunk))
    leaked = "".join(e.text for e in events if isinstance(e, TextChunk))
    leaked += "".join(e.delta for e in events if isinstance(e, ToolCallArgs))
    assert "ж" not in leaked
    assert reasoning.count("ж") == thought.count("ж")
    assert "<think>" not in leaked
    assert "</think>" not in leaked
