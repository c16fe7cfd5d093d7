"""gpt-oss's harmony format: parsing any chunking of any generation, the forced-call grammar
(it only accepts what the parser reads back), and replay through the real gpt-oss template
(``tests/fixtures/families/gpt-oss/chat_template.jinja``: llama.cpp's
``models/templates/openai-gpt-oss-120b.jinja``)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import llguidance.hf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llguidance import LLMatcher
from transformers import AutoTokenizer

from mlx_responses import formats
from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH
from mlx_responses.formats import (
    ParsedEvent,
    ReasoningChunk,
    TextChunk,
    ToolCallEnd,
    ToolCallStart,
    coalesce,
)
from mlx_responses.formats.grammars import ToolGrammarBuilder
from mlx_responses.formats.harmony import ANALYSIS_MAX_TOKENS, HARMONY
from mlx_responses.protocol.items.read import (
    FunctionCall,
    FunctionCallOutput,
    InputMessage,
    Reasoning,
)
from mlx_responses.text.chat import to_chat

from .test_formats_regions import check_call_grammar

TEMPLATE = Path(__file__).parent / "fixtures" / "families" / "gpt-oss" / "chat_template.jinja"
SPECIAL = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>"]
SPECIAL += ["<|constrain|>"]


def parse(pieces: list[str], *, tools: bool = True) -> list[ParsedEvent]:
    parser = HARMONY.new_parser(formats.ParseOptions(tools_enabled=tools, reasoning=False))
    events: list[ParsedEvent] = []
    for piece in pieces:
        events += parser.feed(piece)
    return coalesce(events + parser.finish())


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


# --- parsing ----------------------------------------------------------------------------------


def test_reasoning_then_a_call_in_the_template_form() -> None:
    text = (
        "<|channel|>analysis<|message|>Need the weather.<|end|>"
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": '
        '"Paris"}<|call|>'
    )
    assert parse([text]) == [
        ReasoningChunk("Need the weather."),
        ToolCallStart(0, "get_weather"),
        formats.ToolCallArgs(0, '{"city": "Paris"}'),
        ToolCallEnd(0, "get_weather", '{"city": "Paris"}'),
    ]


def test_constrain_form_namespaced_name_and_nothing_after_the_call() -> None:
    text = (
        "<|channel|>commentary to=functions.mcp__weather__get_weather <|constrain|>json"
        '<|message|>{"city": "Oslo"}<|call|><|start|>assistant<|channel|>final<|message|>no'
    )
    events = parse([text])
    assert [e for e in events if isinstance(e, ToolCallEnd)] == [
        ToolCallEnd(0, "mcp__weather__get_weather", '{"city": "Oslo"}')
    ]
    assert not [e for e in events if isinstance(e, TextChunk)]


def test_final_message_is_text_and_markers_never_show() -> None:
    text = (
        "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final"
        "<|message|>Paris is the capital.<|return|>"
    )
    assert parse([text]) == [ReasoningChunk("Easy."), TextChunk("Paris is the capital.")]


def test_no_header_is_final_text_and_a_cut_call_ends() -> None:
    assert parse(["Hello there"]) == [TextChunk("Hello there")]
    events = parse([' to=functions.f<|channel|>commentary json<|message|>{"a": '])
    assert events[-1] == ToolCallEnd(0, "f", '{"a": ')
    assert parse([" to=functions.f<|channel|>commentary json<|message|>"])[-1] == ToolCallEnd(
        0, "f", "{}"
    )


def test_a_bare_channel_starts_a_new_message() -> None:
    text = "<|channel|>analysis<|message|>Hmm.<|channel|>final<|message|>Done."
    assert parse([text]) == [ReasoningChunk("Hmm."), TextChunk("Done.")]


def test_without_tools_a_call_body_is_text() -> None:
    text = ' to=functions.f<|channel|>commentary json<|message|>{"a": 1}<|call|>'
    assert parse([text], tools=False) == [TextChunk('{"a": 1}')]


_WORDS = st.text(
    st.characters(codec="utf-8", exclude_characters="<|"), min_size=0, max_size=12
) | st.sampled_from(["<", "|", "<|", "end", "<|en", "to=x", "{", '"'])


@st.composite
def generations(draw: st.DrawFn) -> tuple[str, list[ParsedEvent]]:
    """A harmony generation and the events it must give (after coalescing)."""
    parts: list[str] = []
    expected: list[ParsedEvent] = []
    calls = 0
    for k in range(draw(st.integers(1, 4))):
        prefix = "" if k == 0 else "<|start|>assistant"
        kind = draw(st.sampled_from(["analysis", "final", "preamble", "call", "call2"]))
        body = "".join(draw(st.lists(_WORDS, max_size=4)))
        if kind == "analysis":
            parts.append(f"{prefix}<|channel|>analysis<|message|>{body}<|end|>")
            expected.append(ReasoningChunk(body))
        elif kind in ("final", "preamble"):
            channel = "final" if kind == "final" else "commentary"
            parts.append(f"{prefix}<|channel|>{channel}<|message|>{body}<|end|>")
            expected.append(TextChunk(body))
        else:
            name = draw(st.sampled_from(["f", "get_weather", "ns__tool"]))
            args = json.dumps({"q": body})
            header = (
                f" to=functions.{name}<|channel|>commentary json"
                if kind == "call"
                else f"<|channel|>commentary to=functions.{name} <|constrain|>json"
            )
            parts.append(f"{prefix}{header}<|message|>{args}<|end|>")
            expected += [
                ToolCallStart(calls, name),
                formats.ToolCallArgs(calls, args),
                ToolCallEnd(calls, name, args),
            ]
            calls += 1
    ending = draw(st.sampled_from(["", "<|return|>", "<|call|>trailing"]))
    if draw(st.booleans()):  # whitespace before the first header is not text
        parts.insert(0, draw(st.sampled_from([" ", "\n", "\n\n "])))
    return "".join(parts) + ending, coalesce([e for e in expected if _nonempty(e)])


def _nonempty(event: ParsedEvent) -> bool:
    return not isinstance(event, TextChunk | ReasoningChunk) or bool(event.text)


@settings(max_examples=300, deadline=None)
@given(generations(), st.lists(st.integers(0, 10_000), max_size=30))
def test_any_chunking_gives_the_same_events(
    generation: tuple[str, list[ParsedEvent]], cuts: list[int]
) -> None:
    text, expected = generation
    events = parse(chunked(text, cuts))
    check_call_grammar(events)
    assert events == expected
    assert parse([text]) == expected


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80), st.lists(st.integers(0, 10_000), max_size=20))
def test_any_text_any_chunking(text: str, cuts: list[int]) -> None:
    events = parse(chunked(text, cuts))
    check_call_grammar(events)
    assert events == parse([text])


# --- the forced-call grammar -------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The bundled tokenizer with harmony's marker tokens added and the real gpt-oss template."""
    tok = AutoTokenizer.from_pretrained(str(BUNDLED_MODEL_PATH))
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    tok.chat_template = TEMPLATE.read_text()
    return tok


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Oslo"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
NOARGS = {"type": "function", "name": "ping"}
SHOUT = {
    "type": "custom",
    "name": "shout",
    "format": {
        "type": "grammar",
        "syntax": "lark",
        "definition": 'start: "BEGIN " WORD " END"\nWORD: /[a-z]{2,6}/\n',
    },
}
CODE = {
    "type": "custom",
    "name": "code",
    "format": {"type": "grammar", "syntax": "regex", "definition": "[a-z]{3}-[0-9]{2}"},
}
TOOLSETS = [[WEATHER], [WEATHER, NOARGS], [SHOUT], [CODE, WEATHER], [SHOUT, NOARGS, CODE]]


def walk(tokenizer: Any, grammar: str, rng: random.Random) -> str | None:
    """A random text the grammar generates: each step picks uniformly among allowed tokens."""
    ll = llguidance.hf.from_tokenizer(tokenizer)
    matcher = LLMatcher(ll, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    ids: list[int] = []
    special = set(tokenizer.all_special_ids)
    for _ in range(120):
        if matcher.is_stopped() or (matcher.is_accepting() and rng.random() < 0.02):
            break
        mask = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        bits = np.unpackbits(mask, bitorder="little")[: ll.vocab_size]
        allowed = [int(t) for t in np.flatnonzero(bits) if int(t) != ll.eos_token]
        if not allowed:
            break
        # Markers now and then, so that free text (the analysis message) also ends.
        markers = [t for t in allowed if t in special]
        token = rng.choice(markers if markers and rng.random() < 0.2 else allowed)
        assert matcher.consume_token(token)
        ids.append(token)
    if not matcher.is_accepting():
        return None
    return str(tokenizer.decode(ids, skip_special_tokens=False))


def builder(tokenizer: Any) -> ToolGrammarBuilder:
    vocab = tokenizer.get_vocab()
    return ToolGrammarBuilder(llguidance.hf.from_tokenizer(tokenizer), vocab.get)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.sampled_from(TOOLSETS), st.booleans(), st.randoms(use_true_random=False))
def test_the_forced_grammar_only_generates_calls_the_parser_reads_back(
    tokenizer: Any, tools: list[dict[str, Any]], named: bool, rng: random.Random
) -> None:
    name = tools[0]["name"] if named else None
    grammar = builder(tokenizer).build(tools, name, "harmony", HARMONY.call_grammar)
    text = walk(tokenizer, grammar, rng)
    if text is None:
        return  # the walk ran out of steps inside a string: nothing to check
    events = parse([text])
    check_call_grammar(events)
    (end,) = [e for e in events if isinstance(e, ToolCallEnd)]
    assert [e for e in events if isinstance(e, TextChunk)] == []
    # the analysis message, if any, comes first
    assert all(isinstance(e, ReasoningChunk) for e in events[: events.index(end)][:-2])
    names = [t["name"] for t in tools]
    assert end.name == (name or end.name)
    assert end.name in names
    tool = tools[names.index(end.name)]
    arguments = json.loads(end.arguments, strict=False)
    if tool is WEATHER:
        assert arguments["city"] in ("Paris", "Oslo")
        assert set(arguments) <= {"city", "days"}
        assert 1 <= arguments.get("days", 1) <= 7
    elif tool is SHOUT:
        assert re.fullmatch("BEGIN [a-z]{2,6} END", arguments["input"])
    elif tool is CODE:
        assert re.fullmatch("[a-z]{3}-[0-9]{2}", arguments["input"])
    else:
        assert arguments == {}


def test_the_forced_grammar_refuses_other_calls(tokenizer: Any) -> None:
    ll = llguidance.hf.from_tokenizer(tokenizer)
    grammar = builder(tokenizer).build(
        [WEATHER, SHOUT], "get_weather", "harmony", HARMONY.call_grammar
    )

    def accepts(text: str) -> bool:
        matcher = LLMatcher(ll, grammar, log_level=0)
        ids = tokenizer.encode(text, add_special_tokens=False)
        return all(matcher.consume_token(t) for t in ids) and matcher.is_accepting()

    good = ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>'
    assert accepts(good)
    assert not accepts(good.replace("get_weather", "shout"))
    assert not accepts(good.replace("Oslo", "Rome"))
    assert not accepts(good.replace("<|call|>", ""))
    # one analysis message may come first; no other message, and only one
    analysis = "<|channel|>analysis<|message|>Oslo, then.<|end|><|start|>assistant"
    assert accepts(analysis + good)
    assert not accepts(analysis + analysis + good)
    assert not accepts(analysis.replace("analysis", "final") + good)
    assert not accepts(analysis.replace("<|end|>", "<|return|>") + good)


def test_an_analysis_message_before_the_forced_call_is_a_reasoning_item() -> None:
    text = (
        "<|channel|>analysis<|message|>The user wants Oslo's weather.<|end|><|start|>assistant"
        ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>'
    )
    for pieces in ([text], list(text)):
        events = parse(pieces)
        assert events[0] == ReasoningChunk("The user wants Oslo's weather.")
        (end,) = [e for e in events if isinstance(e, ToolCallEnd)]
        assert (end.name, json.loads(end.arguments)) == ("get_weather", {"city": "Oslo"})
        assert not [e for e in events if isinstance(e, TextChunk)]


def test_the_analysis_before_a_forced_call_is_bounded(tokenizer: Any) -> None:
    """Past ``ANALYSIS_MAX_TOKENS`` of reasoning only ``<|end|>`` may follow: the call comes."""
    ll = llguidance.hf.from_tokenizer(tokenizer)
    grammar = builder(tokenizer).build([WEATHER], "get_weather", "harmony", HARMONY.call_grammar)
    matcher = LLMatcher(ll, grammar, log_level=0)
    head = tokenizer.encode("<|channel|>analysis<|message|>", add_special_tokens=False)
    word = tokenizer.encode(" the", add_special_tokens=False)[:1]
    for token in head + word * ANALYSIS_MAX_TOKENS:
        assert matcher.consume_token(token)
    assert not matcher.consume_token(word[0])
    matcher = LLMatcher(ll, grammar, log_level=0)
    for token in head + word * ANALYSIS_MAX_TOKENS:
        assert matcher.consume_token(token)
    for token in tokenizer.encode("<|end|><|start|>assistant", add_special_tokens=False):
        assert matcher.consume_token(token)


# --- replay through the gpt-oss template ------------------------------------------------------

NO_DESCRIPTION = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": WEATHER["parameters"]},
}


def test_replay_renders_as_the_template_does_for_the_same_chat(tokenizer: Any) -> None:
    items = [
        InputMessage("user", "Weather in Paris?"),
        Reasoning("Need the weather."),
        FunctionCall("c1", "get_weather", '{"city": "Paris"}'),
        FunctionCallOutput("c1", '{"temp": 18}'),
    ]
    replay = HARMONY.replay
    chat = to_chat("Be brief.", items, replay)
    tools = replay.template_tools([NO_DESCRIPTION])
    kwargs = replay.template_kwargs("high", {})
    ids = tokenizer.apply_chat_template(
        chat, tools=tools, add_generation_prompt=True, tokenize=True, **kwargs
    )
    equivalent = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "thinking": "Need the weather.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 18}'},
    ]
    tools_described = [{**NO_DESCRIPTION, "function": {**NO_DESCRIPTION["function"]}}]
    tools_described[0]["function"]["description"] = ""
    assert ids == tokenizer.apply_chat_template(
        equivalent,
        tools=tools_described,
        add_generation_prompt=True,
        tokenize=True,
        reasoning_effort="high",
    )
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert "Reasoning: high" in text
    # The reasoning before the call is kept, the call renders as the parser reads it back.
    turn = (
        "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>"
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city":'
        ' "Paris"}<|call|>'
    )
    assert turn in text
    generated = turn.removeprefix("<|start|>assistant")
    assert [e for e in parse([generated]) if isinstance(e, ToolCallEnd)] == [
        ToolCallEnd(0, "get_weather", '{"city": "Paris"}')
    ]


def test_detected_from_the_template_or_the_vocabulary(tokenizer: Any) -> None:
    assert formats.detect(formats.Detection(TEMPLATE.read_text())) is HARMONY
    vocab = frozenset(tokenizer.get_vocab())
    assert formats.detect(formats.Detection("", vocab)) is HARMONY
    assert formats.detect(formats.Detection("<tool_call>", tool_parser_type="harmony")) is HARMONY
    # A named type wins over the template.
    assert formats.detect(formats.Detection(TEMPLATE.read_text(), vocab, "hermes")).name == (
        "hermes"
    )
