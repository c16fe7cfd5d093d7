"""The bundled tiny model, straight through mlx-lm: every documented prompt gives its answer.

Greedy decoding of each prompt in ``prompts.json`` must reproduce ``expected`` exactly and stop
at ``<|im_end|>``; mlx-lm must detect tool calling and thinking from the files alone.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from mlx.utils import tree_flatten
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

from mlx_responses.engine.bundled_model import (
    BUNDLED_MODEL_PATH,
    BundledPrompt,
    load_bundled_prompts,
)

PROMPTS = load_bundled_prompts()
MARKUP_TOKENS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]


@pytest.fixture(scope="module")
def bundled() -> tuple[Any, Any]:
    model, tokenizer = load(str(BUNDLED_MODEL_PATH))[:2]
    return model, tokenizer


def greedy(bundled: tuple[Any, Any], prompt: BundledPrompt) -> tuple[str, str | None]:
    model, tokenizer = bundled
    ids = tokenizer.apply_chat_template(
        prompt.messages, tools=prompt.tools, add_generation_prompt=True
    )
    text, finish = "", None
    for response in stream_generate(
        model,
        tokenizer,
        ids,
        max_tokens=prompt.expected_tokens + 20,
        sampler=make_sampler(temp=0.0),
    ):
        text += response.text
        finish = response.finish_reason
    return text, finish


@pytest.mark.parametrize("prompt", PROMPTS, ids=[p.name for p in PROMPTS])
def test_documented_prompt_reproduces_exactly(
    bundled: tuple[Any, Any], prompt: BundledPrompt
) -> None:
    text, finish = greedy(bundled, prompt)
    assert text == prompt.expected
    assert finish == "stop"


@pytest.mark.parametrize("prompt", PROMPTS, ids=[p.name for p in PROMPTS])
def test_expected_tokens_counts_the_answer(bundled: tuple[Any, Any], prompt: BundledPrompt) -> None:
    _, tokenizer = bundled
    ids = tokenizer.encode(prompt.expected, add_special_tokens=False)
    assert len(ids) == prompt.expected_tokens
    assert tokenizer.decode(ids) == prompt.expected


def test_model_has_about_a_million_parameters(bundled: tuple[Any, Any]) -> None:
    model, _ = bundled
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    assert 300_000 <= n_params <= 3_000_000


def test_the_documented_set_has_a_long_answer_and_distinct_short_ones() -> None:
    names = [p.name for p in PROMPTS]
    assert len(names) == len(set(names))
    assert max(p.expected_tokens for p in PROMPTS) > 300
    single_user = [p for p in PROMPTS if len(p.messages) == 1 and not p.tools]
    # Concurrency tests send 8 different prompts and tell the answers apart.
    assert len({p.expected for p in single_user}) >= 8


def test_mlx_lm_detects_tool_calling_and_thinking(bundled: tuple[Any, Any]) -> None:
    _, tokenizer = bundled
    assert tokenizer.has_tool_calling
    assert (tokenizer.tool_call_start, tokenizer.tool_call_end) == ("<tool_call>", "</tool_call>")
    assert tokenizer.has_thinking
    assert (tokenizer.think_start, tokenizer.think_end) == ("<think>", "</think>")
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in tokenizer.eos_token_ids


def test_markup_tokens_are_single_and_survive_decoding(bundled: tuple[Any, Any]) -> None:
    _, tokenizer = bundled
    for token in MARKUP_TOKENS:
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1
        assert tokenizer.decode(ids, skip_special_tokens=True) == token
    im_end = tokenizer.encode("<|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(im_end, skip_special_tokens=True) == ""


def test_tool_call_answer_parses_with_mlx_lm_parser(bundled: tuple[Any, Any]) -> None:
    _, tokenizer = bundled
    (prompt,) = [p for p in PROMPTS if p.name == "tool_call"]
    body = prompt.expected.removeprefix(tokenizer.tool_call_start)
    body = body.removesuffix(tokenizer.tool_call_end)
    assert tokenizer.tool_parser(body, prompt.tools) == {
        "name": "get_weather",
        "arguments": {"city": "Paris"},
    }


def test_template_renders_the_qwen3_shapes(bundled: tuple[Any, Any]) -> None:
    _, tokenizer = bundled
    (prompt,) = [p for p in PROMPTS if p.name == "tool_result"]
    rendered = tokenizer.apply_chat_template(
        [
            {"role": "developer", "content": "Be brief."},
            *prompt.messages,
            {"role": "assistant", "content": "Sunny.", "reasoning_content": "It said sunny."},
            {"role": "user", "content": [{"type": "text", "text": "Thanks."}]},
        ],
        tools=prompt.tools,
        add_generation_prompt=True,
        tokenize=False,
    )
    tool_json = json.dumps(prompt.tools[0] if prompt.tools else None, ensure_ascii=False)
    assert rendered == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to "
        "assist with the user query.\n\nYou are provided with function signatures within "
        f"<tools></tools> XML tags:\n<tools>\n{tool_json}\n</tools>\n\nFor each function call, "
        "return a json object with function name and arguments within <tool_call></tool_call> "
        'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n{"city": "Paris", "temperature": 18, '
        '"condition": "sunny"}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n<think>\nIt said sunny.\n</think>\n\nSunny.<|im_end|>\n"
        "<|im_start|>user\nThanks.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_tools_render_the_same_nested_or_flat(bundled: tuple[Any, Any]) -> None:
    """Flat (Responses) or nested tools, extra keys, any key order: the same prompt."""
    _, tokenizer = bundled
    (prompt,) = [p for p in PROMPTS if p.name == "tool_call"]
    assert prompt.tools is not None
    function = prompt.tools[0]["function"]
    variants = [
        [{"type": "function", **function}],
        [{"type": "function", **function, "strict": True}],
        [{"type": "function", "function": {**function, "strict": False}}],
        [{"type": "function", "function": dict(reversed(function.items()))}],
    ]

    def render(tools: list[dict[str, Any]]) -> str:
        text: str = tokenizer.apply_chat_template(
            prompt.messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        return text

    for tools in variants:
        assert render(tools) == render(prompt.tools)
