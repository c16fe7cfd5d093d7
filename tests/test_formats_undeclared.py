"""Calls to names no offered tool declares are output text, never calls, in every format
(docs/api.md, "Calls to undeclared tools"); the shaper decides it after any format's parser."""

from __future__ import annotations

import json

import pytest

from mlx_responses import formats
from mlx_responses.actors.output import OutputShaper
from mlx_responses.protocol.events import machine as m

GENERATIONS = {
    "hermes": '<tool_call>\n{"name": "%s", "arguments": {"city": "Paris"}}\n</tool_call>',
    "mistral": '[TOOL_CALLS]%s[ARGS]{"city": "Paris"}',
    "qwen3_coder": "<tool_call>\n<function=%s>\n<parameter=city>\nParis\n</parameter>\n"
    "</function>\n</tool_call>",
    "llama3_json": '{"name": "%s", "parameters": {"city": "Paris"}}',
    "harmony": ' to=functions.%s<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
}


def shape(fmt: str, text: str, declared: frozenset[str], **kw: int) -> list[m.MachineInput]:
    parser = formats.get(fmt).new_parser(formats.ParseOptions(tools_enabled=True, reasoning=False))
    shaper = OutputShaper(parser, max_calls=kw.get("max_calls"), declared=declared)
    inputs: list[m.MachineInput] = []
    for ch in text:  # one character at a time: the decision does not depend on chunking
        inputs += shaper.feed(ch)
    return inputs + shaper.finish()


def text_of(inputs: list[m.MachineInput]) -> str:
    return "".join(i.text for i in inputs if isinstance(i, m.TextDelta))


@pytest.mark.parametrize("fmt", sorted(GENERATIONS))
def test_a_declared_call_is_a_call(fmt: str) -> None:
    inputs = shape(fmt, GENERATIONS[fmt] % "get_weather", frozenset({"get_weather"}))
    assert [i for i in inputs if isinstance(i, m.ToolCallBegin)] == [m.ToolCallBegin("get_weather")]
    (end,) = [i for i in inputs if isinstance(i, m.ToolCallEnd)]
    assert json.loads(end.arguments) == {"city": "Paris"}
    assert text_of(inputs) == ""


@pytest.mark.parametrize("fmt", sorted(GENERATIONS))
def test_an_undeclared_call_is_text(fmt: str) -> None:
    inputs = shape(fmt, GENERATIONS[fmt] % "get_weather", frozenset({"get_time"}))
    assert not [i for i in inputs if isinstance(i, m.ToolCallBegin | m.ToolCallArgs)]
    assert not [i for i in inputs if isinstance(i, m.ToolCallEnd)]
    assert json.loads(text_of(inputs)) == {"name": "get_weather", "arguments": {"city": "Paris"}}


def test_undeclared_calls_count_toward_no_limit() -> None:
    text = (GENERATIONS["hermes"] % "nope") + (GENERATIONS["hermes"] % "get_weather")
    inputs = shape("hermes", text, frozenset({"get_weather"}), max_calls=1)
    assert [i for i in inputs if isinstance(i, m.ToolCallBegin)] == [m.ToolCallBegin("get_weather")]
    assert '"nope"' in text_of(inputs)
