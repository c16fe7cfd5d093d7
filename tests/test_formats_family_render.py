"""Replay through each family's real chat template (``tests/fixtures/families/<family>/
chat_template.jinja``, from llama.cpp's ``models/templates/``: GLM-4.6, moonshotai-Kimi-K2,
MiniMax-M2, google-gemma-4-31B-it, deepseek-ai-DeepSeek-V3.1, Qwen3-Coder, LFM2.5-8B-A1B,
Kimi-K3; Muse Glimmer's from vLLM's ``examples/``; see docs/models.md).

A replayed turn (reasoning, function call, its output) goes through ``model.chat.to_chat`` with
the family format's ``Replay``: it must render, render exactly as the chat messages the family's
own tooling would pass, and the call the template writes must read back through the family's
parser as the same call.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from mlx_responses import formats
from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH
from mlx_responses.formats.base import ToolCallEnd
from mlx_responses.formats.format import ParseOptions
from mlx_responses.protocol.items.read import (
    FunctionCall,
    FunctionCallOutput,
    InputMessage,
    Reasoning,
)
from mlx_responses.text.chat import to_chat

FIXTURES = Path(__file__).parent / "fixtures" / "families"

# fixture directory -> the format detected from its template
FAMILIES = {
    "glm-4.6": "glm47",
    "kimi-k2": "kimi_k2",
    "minimax-m2": "minimax_m2",
    "gemma-4": "gemma4",
    "deepseek-v3.1": "deepseek_v3",
    "qwen3-coder": "qwen3_coder",
    "lfm2.5": "pythonic",
    "kimi-k3": "kimi_k3",
    "muse-glimmer": "muse_spark",
}

KEEPS_REASONING = {"glm-4.6", "minimax-m2", "gemma-4", "lfm2.5", "kimi-k3", "muse-glimmer"}

ARGS = {"city": "Paris", "days": 2}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
ITEMS = [
    InputMessage(role="user", text="What is the weather in Paris?"),
    Reasoning(text="The user wants the weather."),
    FunctionCall(call_id="call_1", name="get_weather", arguments=json.dumps(ARGS)),
    FunctionCallOutput(call_id="call_1", output='{"temperature": 18}'),
]


@cache
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(BUNDLED_MODEL_PATH))


def template(family: str) -> str:
    return (FIXTURES / family / "chat_template.jinja").read_text(encoding="utf-8")


def render(family: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    text = tokenizer().apply_chat_template(
        messages,
        tools=TOOLS,
        chat_template=template(family),
        tokenize=False,
        add_generation_prompt=True,
        **kwargs,
    )
    assert isinstance(text, str)
    return text


def expected_messages(fmt: formats.Format) -> list[dict[str, Any]]:
    """The turn as the family's own tooling passes it to the template."""
    args: Any = json.dumps(ARGS) if fmt.replay.arguments == "string" else ARGS
    rename = fmt.replay.call_id  # Kimi K2's ids are its own functions.NAME:N
    call_id = rename("call_1", "get_weather", 0) if rename else "call_1"
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": args},
    }
    assistant = {
        "role": "assistant",
        "content": "",
        fmt.replay.reasoning_key: "The user wants the weather.",
        "tool_calls": [call],
    }
    return [
        {"role": "user", "content": "What is the weather in Paris?"},
        assistant,
        {"role": "tool", "tool_call_id": call_id, "content": '{"temperature": 18}'},
    ]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_template_is_detected_as_its_format(family: str) -> None:
    vocab = frozenset(tokenizer().get_vocab())
    assert formats.detect(formats.Detection(template(family), vocab)).name == FAMILIES[family]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_replayed_history_renders_as_the_family_passes_it(family: str) -> None:
    fmt = formats.get(FAMILIES[family])
    replayed = render(family, to_chat(None, ITEMS, fmt.replay))
    assert replayed == render(family, expected_messages(fmt))
    assert "Paris" in replayed
    assert '{"temperature": 18}' in replayed
    # Where the template keeps the reasoning of the turn after the last user message, the
    # replayed reasoning is where the model wrote it.
    assert ("The user wants the weather." in replayed) == (family in KEEPS_REASONING)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_call_the_template_writes_reads_back(family: str) -> None:
    fmt = formats.get(FAMILIES[family])
    rendered = render(family, to_chat(None, ITEMS[:3], fmt.replay))
    schemas = {"get_weather": TOOLS[0]["function"]["parameters"]}
    start = rendered.rfind("What is the weather in Paris?")
    parser = fmt.new_parser(ParseOptions(tools_enabled=True, reasoning=False, tool_schemas=schemas))
    events = parser.feed(rendered[start:]) + parser.finish()
    calls = [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCallEnd)]
    assert calls == [("get_weather", ARGS)]


def test_kimi_outputs_answer_its_own_call_ids() -> None:
    rendered = render("kimi-k2", to_chat(None, ITEMS, formats.get("kimi_k2").replay))
    assert "functions.get_weather:0<|tool_call_argument_begin|>" in rendered
    assert "## Return of functions.get_weather:0" in rendered
    assert "call_1" not in rendered


def test_deepseek_needs_arguments_as_a_string() -> None:
    """The regression the string replay shape fixes: an object fails in DeepSeek's template."""
    chat = to_chat(None, ITEMS, formats.Replay())
    with pytest.raises(TypeError, match="concatenate"):
        render("deepseek-v3.1", chat)


@pytest.mark.parametrize(
    ("family", "effort", "marker", "present"),
    [
        ("glm-4.6", "none", "<think></think>", True),
        ("deepseek-v3.1", "high", "<think>", True),
        ("deepseek-v3.1", "none", "</think>", True),
    ],
)
def test_reasoning_effort_reaches_the_template(
    family: str, effort: str, marker: str, present: bool
) -> None:
    fmt = formats.get(FAMILIES[family])
    kwargs = dict(fmt.replay.template_kwargs(effort, {}))
    chat = [{"role": "user", "content": "hi"}]
    assert render(family, chat, **kwargs).endswith(marker) is present


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_tool_without_a_description_renders(family: str) -> None:
    fmt = formats.get(FAMILIES[family])
    bare = [{"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}}]
    text = tokenizer().apply_chat_template(
        to_chat(None, ITEMS, fmt.replay),
        tools=fmt.replay.template_tools(bare),
        chat_template=template(family),
        tokenize=False,
        add_generation_prompt=True,
    )
    # DeepSeek V3.1's template does not list tools at all
    assert ("ping" in text) == ("tools" in template(family))


@pytest.mark.parametrize(("effort", "strength"), [("none", "low"), ("high", "high")])
def test_muse_reads_the_effort_as_its_reasoning_strength(effort: str, strength: str) -> None:
    kwargs = dict(formats.get("muse_spark").replay.template_kwargs(effort, {}))
    text = render("muse-glimmer", [{"role": "user", "content": "hi"}], **kwargs)
    assert f"Reasoning strength: {strength}." in text
