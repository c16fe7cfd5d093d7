"""The family formats, registered: GLM-4.x, LongCat, MiniMax M2, Muse Spark, MiniCPM 5, Kimi K2,
Kimi K3, DeepSeek V3.x, Gemma 4, FunctionGemma, pythonic (LFM2).

Detection follows mlx-lm 0.32.2's ``_infer_tool_parser`` (template substrings first, in its
order, then the vocabulary); ``priority`` puts these checks around the tag formats' (Qwen3-Coder
40, Mistral 50, Hermes 60, Llama 3 70) in mlx-lm's order. DeepSeek, which mlx-lm does not know,
is recognised by its tool-call marker in the template.

Replay, from each family's template: GLM, MiniMax, Kimi K2 read ``reasoning_content``, LFM2.5
``thinking``; Kimi K2
writes a call's id as its header, so replayed ids become ``functions.NAME:N``; DeepSeek
V3.x joins ``arguments`` into the prompt as a string (a dict fails to render); ``reasoning.effort``
becomes ``enable_thinking`` (DeepSeek: ``thinking``, off without an effort, as its template
defaults): ``none``/``minimal`` off, any other on. Kimi K3's template reads ``thinking`` and
``thinking_effort``, Muse's ``reasoning_effort``; both formats carry their reasoning in their own
markup (``reasons``): Kimi K3's think block, Muse's ``to=self`` messages (``muse``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from . import family_grammars as g
from . import muse
from .family_regions import REGIONS
from .format import Detection, Format, ParseOptions, Parser, Replay, register
from .json_sections import DEEPSEEK_V3
from .stream import THINK_CLOSE, THINK_OPEN, stream_parser

__all__ = ["FAMILY_FORMATS", "GEMMA4_THINK", "KIMI_K3", "KIMI_K3_FRAMING"]

GEMMA4_THINK = ("<|channel>thought", "<channel|>")


def _thinking_kwarg(
    key: str, default: bool | None = None
) -> Callable[[str | None], Mapping[str, Any]]:
    """``reasoning.effort`` -> ``{key: on}``: ``none``/``minimal`` off, any other on; without an
    effort, ``default`` (None: nothing, so mlx-lm's own ``enable_thinking`` applies)."""

    def kwargs(effort: str | None) -> Mapping[str, Any]:
        if effort is None:
            return {} if default is None else {key: default}
        return {key: effort not in ("none", "minimal")}

    return kwargs


def _effort_as(key: str) -> Callable[[str | None], Mapping[str, Any]]:
    """``reasoning.effort`` passed on as ``{key: effort}``."""

    def kwargs(effort: str | None) -> Mapping[str, Any]:
        return {} if effort is None else {key: effort}

    return kwargs


_ENABLE_THINKING = Replay(effort_kwargs=_thinking_kwarg("enable_thinking"))


def _parser(
    family: str, think: tuple[str, str] = (THINK_OPEN, THINK_CLOSE), hidden: tuple[str, ...] = ()
) -> Callable[[ParseOptions], Parser]:
    return partial(stream_parser, regions=REGIONS[family], think=think, hidden=hidden)


def _template_has(*needles: str) -> Callable[[Detection], bool]:
    def matches(d: Detection) -> bool:
        return all(n in d.template for n in needles)

    return matches


def _is_pythonic(d: Detection) -> bool:
    if "<|tool_list_start|>" in d.template or "<|tool_call_start|>" in d.template:
        return True
    # mlx-lm falls back to the vocabulary when no template check matched (LFM2.5 conversions
    # carry the tokens without naming them in the template).
    tagged = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "<function=")
    vocab = d.vocab
    return (
        "<|tool_call_start|>" in vocab
        and "<|tool_call_end|>" in vocab
        and not any(t in d.template for t in tagged)
    )


_XTML = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")


def _is_kimi_k3(d: Detection) -> bool:
    # mlx-lm reads the vocabulary only; the template (llama.cpp's Kimi-K3.jinja) names them too
    return all(t in d.vocab for t in _XTML) or all(t in d.template for t in _XTML)


def _kimi_k3_effort(effort: str | None) -> Mapping[str, Any]:
    """Its template's ``thinking`` (on by default) and ``thinking_effort`` (low, medium, high,
    max): ``none``/``minimal`` turn thinking off, ``xhigh`` is ``max``."""
    if effort is None:
        return {}
    if effort in ("none", "minimal"):
        return {"thinking": False}
    return {"thinking": True, "thinking_effort": "max" if effort == "xhigh" else effort}


FAMILY_FORMATS: tuple[Format, ...] = (
    Format(
        "minimax_m2",
        _template_has("<minimax:tool_call>"),
        _parser("minimax_m2"),
        call_grammar=g.minimax_grammar,
        replay=_ENABLE_THINKING,
        priority=10,
    ),
    Format(
        "gemma4",
        _template_has("<|tool_call>", "<tool_call|>"),
        _parser("gemma4", think=GEMMA4_THINK),
        call_grammar=g.gemma4_grammar,
        replay=_ENABLE_THINKING,
        priority=11,
    ),
    Format(
        "function_gemma",
        _template_has("<start_function_call>"),
        _parser("function_gemma"),
        call_grammar=g.function_gemma_grammar,
        priority=12,
    ),
    Format(
        "longcat",
        _template_has("<longcat_tool_call>"),
        _parser("longcat", think=("<longcat_think>", "</longcat_think>")),
        call_grammar=g.longcat_grammar,
        replay=_ENABLE_THINKING,
        priority=13,
    ),
    Format(
        "glm47",
        _template_has("<arg_key>"),
        _parser("glm47"),
        call_grammar=g.glm_grammar,
        replay=_ENABLE_THINKING,
        aliases=("glm", "glm4", "glm45", "glm46", "laguna"),
        priority=14,
    ),
    Format(
        "pythonic",
        _is_pythonic,
        _parser("pythonic"),
        call_grammar=g.pythonic_grammar,
        replay=Replay(reasoning_key="thinking"),  # LFM2.5's template reads ``thinking``
        aliases=("lfm2",),
        priority=15,
    ),
    Format(
        "deepseek_v3",
        _template_has(DEEPSEEK_V3.section_open),
        _parser("deepseek_v3"),
        call_grammar=g.deepseek_grammar,
        # Without an effort, DeepSeek's own default (its template's ``thinking = false``): mlx-lm
        # would pass ``enable_thinking=True``, and the prompt would open reasoning.
        replay=Replay(arguments="string", effort_kwargs=_thinking_kwarg("thinking", False)),
        aliases=("deepseek", "deepseek_v31"),
        priority=16,
    ),
    Format(
        "kimi_k2",
        _template_has("<|tool_calls_section_begin|>"),
        _parser("kimi_k2"),
        call_grammar=g.kimi_grammar,
        # Its template writes a call's id as the call's header: the id must be Kimi's own.
        replay=replace(_ENABLE_THINKING, call_id=lambda _id, name, n: f"functions.{name}:{n}"),
        aliases=("kimi",),
        priority=45,
    ),
    Format(
        "minicpm5",
        _template_has('<function name="', '<param name="'),
        _parser("minicpm5"),
        call_grammar=g.minicpm5_grammar,
        priority=46,
    ),
    Format(
        "muse_spark",
        _template_has("<atem:function_calls>"),
        # Addressed messages (``muse``): ``to=self`` reasoning, ``to=user`` text, ``to=NAME``
        # an ATEM call.
        _parser("muse_spark", think=muse.THINK, hidden=muse.FRAMING),
        call_grammar=g.muse_spark_grammar,
        # Muse's template (vLLM's tool_chat_template_muse_glimmer.jinja) reads
        # ``tool.description`` unguarded and ``reasoning_effort`` as the request names it.
        replay=Replay(default_description="", effort_kwargs=_effort_as("reasoning_effort")),
        priority=55,
        reasons=True,  # its ``to=self`` messages, whatever the vocabulary
    ),
)

KIMI_K3_FRAMING = (
    "<|open|>response<|sep|>",
    "<|close|>response<|sep|>",
    "<|close|>message<|sep|>",
    "<|end_of_msg|>",
)

KIMI_K3 = Format(
    "kimi_k3",
    _is_kimi_k3,
    _parser(
        "kimi_k3", think=("<|open|>think<|sep|>", "<|close|>think<|sep|>"), hidden=KIMI_K3_FRAMING
    ),
    call_grammar=g.kimi_k3_grammar,
    replay=Replay(effort_kwargs=_kimi_k3_effort),
    priority=80,
    reasons=True,  # its think block is part of the markup; mlx-lm finds no thinking tokens
)
"""Kimi K3's ``<|open|>...<|sep|>`` markup (XTML), recognised from the vocabulary as mlx-lm
does (or its template): an assistant message is ``<|open|>think<|sep|>`` reasoning (the
generation prompt opens it), ``<|open|>response<|sep|>`` text (the framing is never shown),
then calls; typed arguments and the single JSON object block are read, and a forced call may
write either."""

for _fmt in (*FAMILY_FORMATS, KIMI_K3):
    register(_fmt)
