"""The formats ``stream.StreamParser`` reads: Hermes/Qwen ``<tool_call>``, Qwen3-Coder XML,
Llama 3 JSON and Mistral ``[TOOL_CALLS]``, each with ``<think>`` reasoning where the model
has it.

Detection follows what the server did before formats were a package (mlx-lm's
``_infer_tool_parser`` template checks, narrowed to these four): Qwen3-Coder when the template
has ``<function=`` and ``<parameter=``; Mistral on ``[TOOL_CALLS]``; Hermes on ``<tool_call>``
(not GLM's ``<arg_key>`` templates); Llama 3 on ``<|python_tag|>`` or an ``ipython`` header.
Hermes and Qwen3-Coder have forced-call grammars: ``<tool_call>\\n{"name": ..., "arguments":
...}\\n</tool_call>`` and ``family_grammars.qwen3_coder_grammar``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import partial

from .family_grammars import qwen3_coder_grammar
from .format import Detection, Format, ParseOptions, Parser, register
from .grammars import ForcedTool, argument_rules, lark_string
from .stream import TagFormat, stream_parser

__all__ = ["HERMES", "LLAMA3", "MISTRAL", "QWEN3_CODER", "hermes_grammar"]


def _parser(tag_format: TagFormat) -> Callable[[ParseOptions], Parser]:
    return partial(stream_parser, tool_format=tag_format)


def hermes_grammar(tools: Sequence[ForcedTool], literal: Callable[[str], str]) -> str:
    """``<tool_call>\\n{"name": "<name>", "arguments": <object>}\\n</tool_call>``."""
    alternatives = " | ".join(f"call_{i}" for i in range(len(tools)))
    newline = lark_string("\n")
    lines = [
        f"start: {literal('<tool_call>')} {newline} ({alternatives}) {newline} "
        f"{literal('</tool_call>')}"
    ]
    for i, tool in enumerate(tools):
        head = '{"name": ' + json.dumps(tool.name) + ', "arguments": '
        lines.append(f"call_{i}: {lark_string(head)} args_{i} {lark_string('}')}")
    lines.extend(argument_rules(tools))
    return "\n".join(lines) + "\n"


def _is_qwen3_coder(d: Detection) -> bool:
    return "<function=" in d.template and "<parameter=" in d.template


def _is_mistral(d: Detection) -> bool:
    return "[TOOL_CALLS]" in d.template


def _is_hermes(d: Detection) -> bool:
    return "<tool_call>" in d.template and "<arg_key>" not in d.template


def _is_llama3(d: Detection) -> bool:
    t = d.template
    return "<|python_tag|>" in t or ("<|start_header_id|>" in t and "ipython" in t)


QWEN3_CODER = register(
    Format(
        "qwen3_coder",
        _is_qwen3_coder,
        _parser("qwen3_coder"),
        call_grammar=qwen3_coder_grammar,
        priority=40,
    )
)
MISTRAL = register(Format("mistral", _is_mistral, _parser("mistral"), priority=50))
# mlx-lm calls this parser ``json_tools``; ``qwen`` names are what callers used before.
HERMES = register(
    Format(
        "hermes",
        _is_hermes,
        _parser("hermes"),
        call_grammar=hermes_grammar,
        aliases=("json_tools", "qwen", "qwen2", "qwen3"),
        priority=60,
    )
)
LLAMA3 = register(
    Format("llama3_json", _is_llama3, _parser("llama3_json"), aliases=("llama3",), priority=70)
)
