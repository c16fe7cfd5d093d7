"""A continuation tokenized incrementally has exactly the ids of a full render (issue 14):
the bundled tokenizer and chat template, histories that grow, change their instructions and
tools, or that a template rewrites (earlier reasoning dropped)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlx_lm import load

from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH
from mlx_responses.text.incremental_render import (
    IncrementalTokenizer,
    common_prefix_length,
    render_text,
)
from mlx_responses.text.prompt_bounds import measure_tokenizer

Chat = list[dict[str, Any]]

# Like Qwen3's own template: the reasoning of assistant turns before the last user message is
# dropped, so a new user message rewrites earlier turns.
REWRITING_TEMPLATE = (
    "{%- set ns = namespace(last=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'assistant' and m.reasoning_content and loop.index0 > ns.last -%}"
    "<think>\n{{ m.reasoning_content }}\n</think>\n\n{%- endif -%}"
    "{{ m.content }}<|im_end|>\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load(str(BUNDLED_MODEL_PATH))[1]


class Counting:
    """The tokenizer's ``encode``, counting the characters it was given."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.characters = 0

    def __call__(self, text: str) -> Sequence[int]:
        self.characters += len(text)
        return self.tokenizer.encode(text, add_special_tokens=False)  # type: ignore[no-any-return]


def incremental(tokenizer: Any) -> tuple[IncrementalTokenizer, Counting]:
    bound = measure_tokenizer(tokenizer)
    assert bound is not None
    assert bound.added is not None
    counting = Counting(tokenizer)
    return IncrementalTokenizer(counting, bound.added), counting


def full(tokenizer: Any, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=False))


TEXT = st.lists(
    st.sampled_from(
        [
            *"abc xyz",
            "\n",
            "  ",
            "é",
            "日本",
            "1",
            "2",
            "<|im_end|>",
            "<|im_start|>",
            "<think>",
            "</think>",
            "<tool_call>",
            "</tool_response>",
            "Tool result",
            "<|im_",
            "end|>",
        ]
    ),
    max_size=12,
).map("".join)


@st.composite
def turns(draw: st.DrawFn) -> list[Chat]:
    """A conversation as its turns: each the new items a client sends, then the reply."""
    count = draw(st.integers(1, 5))
    result: list[Chat] = []
    for _ in range(count):
        new: Chat = []
        for _ in range(draw(st.integers(1, 2))):
            if draw(st.booleans()):
                new.append({"role": "user", "content": draw(TEXT)})
            else:
                new.append({"role": "tool", "content": draw(TEXT), "tool_call_id": "call_1"})
        reply: dict[str, Any] = {"role": "assistant", "content": draw(TEXT)}
        if draw(st.booleans()):
            reply["reasoning_content"] = draw(TEXT)
        if draw(st.booleans()):
            arguments = '{"city": "' + draw(TEXT).replace('"', "") + '"}'
            reply["tool_calls"] = [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "f", "arguments": arguments},
                }
            ]
        result.append([*new, reply])
    return result


TOOLS = [
    {
        "type": "function",
        "function": {"name": "f", "description": "F.", "parameters": {"type": "object"}},
    }
]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    conversation=turns(),
    system=TEXT,
    changed_system=st.booleans(),
    tools=st.booleans(),
    rewriting=st.booleans(),
)
def test_every_turn_has_the_ids_of_a_full_render(
    tokenizer: Any,
    conversation: list[Chat],
    system: str,
    changed_system: bool,
    tools: bool,
    rewriting: bool,
) -> None:
    inc, _ = incremental(tokenizer)
    kwargs = {"chat_template": REWRITING_TEMPLATE} if rewriting else {}
    chat: Chat = [{"role": "system", "content": system}]
    known = None
    for index, turn in enumerate(conversation):
        *new, reply = turn
        chat = chat + new
        if changed_system and index == len(conversation) - 1:
            chat = [{"role": "system", "content": system + " changed"}, *chat[1:]]
        text = render_text(tokenizer, chat, TOOLS if tools else None, kwargs)
        rendered = inc.tokenize(text, known)
        assert rendered is not None
        assert rendered.ids == full(tokenizer, text)
        known = rendered
        chat = [*chat, reply]


def test_an_appended_turn_tokenizes_only_the_new_text(tokenizer: Any) -> None:
    inc, counting = incremental(tokenizer)
    instructions = " ".join(f"Rule {i}: keep the answer short." for i in range(40))
    chat: Chat = [{"role": "system", "content": instructions}]
    chat.append({"role": "user", "content": "Tool result 0: a b c"})
    first = render_text(tokenizer, chat)
    known = inc.tokenize(first, None)  # the first text (and the one-time whole check)
    assert known is not None
    chat += [
        {"role": "assistant", "content": "done 0"},
        {"role": "user", "content": "Tool result 1: d e f"},
    ]
    second = render_text(tokenizer, chat)
    counting.characters = 0
    rendered = inc.tokenize(second, known)
    assert rendered is not None
    assert rendered.ids == full(tokenizer, second)
    # Only what follows the previous prompt's last added token was tokenized.
    assert counting.characters <= len(second) - len(first) + len("assistant\n")
    assert rendered.ids[: len(known.ids) - 2] == known.ids[: len(known.ids) - 2]


def test_an_unrelated_render_is_tokenized_whole(tokenizer: Any) -> None:
    inc, _ = incremental(tokenizer)
    known = inc.tokenize(render_text(tokenizer, [{"role": "user", "content": "one"}]), None)
    text = render_text(
        tokenizer, [{"role": "system", "content": "x"}, {"role": "user", "content": "one"}]
    )
    rendered = inc.tokenize(text, known)
    assert rendered is not None
    assert rendered.ids == full(tokenizer, text)


def test_a_tokenizer_that_splits_differently_turns_the_path_off(tokenizer: Any) -> None:
    """The one-time check: pieces that do not add up to the whole switch the path off."""

    def merging(text: str) -> Sequence[int]:  # a tokenizer whose pieces interact
        ids = tokenizer.encode(text, add_special_tokens=False)
        return ids[:-1] if len(ids) > 3 else ids

    bound = measure_tokenizer(tokenizer)
    assert bound is not None
    inc = IncrementalTokenizer(merging, bound.added)
    text = render_text(tokenizer, [{"role": "user", "content": "a b c d e f g"}])
    assert inc.tokenize(text, None) is None
    assert not inc.enabled


@given(st.text(max_size=30), st.text(max_size=30))
def test_common_prefix_length(a: str, b: str) -> None:
    n = common_prefix_length(a, b)
    assert a[:n] == b[:n]
    assert n == min(len(a), len(b)) or a[n] != b[n]
