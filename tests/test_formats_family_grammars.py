"""Forced-call grammars of the family formats (and Qwen3-Coder's XML), checked with llguidance's
matcher on text: a call written the way the grammar writes it is accepted and its parser reads
back the same call; and whatever near miss the grammar accepts (Hypothesis mutates valid calls:
a missing or extra parameter, a wrong type, an unknown name, padded or out-of-enum strings), the
parser reads back as one call of a declared tool with arguments valid against its schema.

The tokenizer is the bundled model's (byte-level BPE, small), with each family's markers either
plain text or added as special tokens as the family's real tokenizer has them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from mlx_responses import formats
from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH
from mlx_responses.engine.constrain import Constraints
from mlx_responses.formats.base import ToolCallEnd
from mlx_responses.formats.format import ParseOptions
from mlx_responses.formats.json_sections import DEEPSEEK_V3

Call = tuple[str, dict[str, Any]]
Params = list[tuple[str, Any]]  # (key, value) in the order the grammar writes them

SPECIAL: dict[str, list[str]] = {
    "glm47": [
        "<tool_call>",
        "</tool_call>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
    ],
    "longcat": ["<longcat_tool_call>", "</longcat_tool_call>"],
    "minimax_m2": ["<minimax:tool_call>", "</minimax:tool_call>"],
    "muse_spark": ["<atem:function_calls>", "</atem:function_calls>", "<|message|>"],
    "minicpm5": [],
    "kimi_k2": [
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
    ],
    "deepseek_v3": [
        DEEPSEEK_V3.section_open,
        DEEPSEEK_V3.section_close,
        DEEPSEEK_V3.call_open,
        DEEPSEEK_V3.sep,
        DEEPSEEK_V3.call_close,
    ],
    "gemma4": ["<|tool_call>", "<tool_call|>", '<|"|>'],
    "function_gemma": ["<start_function_call>", "<end_function_call>", "<escape>"],
    "pythonic": ["<|tool_call_start|>", "<|tool_call_end|>"],
    "qwen3_coder": ["<tool_call>", "</tool_call>"],
    "kimi_k3": ["<|open|>", "<|close|>", "<|sep|>"],
}
FAMILIES = sorted(SPECIAL)


@cache
def constraints(family: str, special: bool) -> tuple[Constraints, Any]:
    tok = AutoTokenizer.from_pretrained(str(BUNDLED_MODEL_PATH))
    if special and SPECIAL[family]:
        tok.add_special_tokens({"additional_special_tokens": SPECIAL[family]})
    return Constraints(_Wrapped(tok)), tok


class _Wrapped:
    """What ``Constraints`` reads of mlx-lm's tokenizer wrapper."""

    def __init__(self, tok: Any) -> None:
        self._tokenizer = tok
        self.eos_token_ids = [tok.eos_token_id]


def accepts(
    family: str, special: bool, tools: list[dict[str, Any]], name: str | None, text: str
) -> bool:
    cons, tok = constraints(family, special)
    matcher = cons.tool_call(tools, name=name, tool_format=family).new_matcher()
    for token in tok.encode(text, add_special_tokens=False):
        if not matcher.consume_token(token):
            return False
    return matcher.is_accepting()


def parse(family: str, text: str, tools: list[dict[str, Any]]) -> list[Call]:
    schemas = {t["name"]: t.get("parameters") or {} for t in tools if t.get("type") == "function"}
    for t in tools:
        if t.get("type") == "custom":
            schemas[t["name"]] = {"properties": {"input": {"type": "string"}}}
    parser = formats.get(family).new_parser(
        ParseOptions(tools_enabled=True, reasoning=False, tool_schemas=schemas)
    )
    events = parser.feed(text) + parser.finish()
    return [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCallEnd)]


# -- the text each grammar writes --------------------------------------------------------------


def _j(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False)


def _kv(v: Any) -> str:
    return v if isinstance(v, str) else _j(v)


def write_call(family: str, name: str, params: Params) -> str:
    if family in ("glm47", "longcat"):
        p = "longcat_" if family == "longcat" else ""
        body = "".join(
            f"<{p}arg_key>{k}</{p}arg_key>\n<{p}arg_value>{_kv(v)}</{p}arg_value>\n"
            for k, v in params
        )
        return f"<{p}tool_call>{name}\n{body}</{p}tool_call>"
    if family in ("minimax_m2", "muse_spark"):
        p, block = (
            ("", "minimax:tool_call")
            if family == "minimax_m2"
            else ("atem:", "atem:function_calls")
        )
        body = "".join(f'<{p}parameter name="{k}">{_kv(v)}</{p}parameter>\n' for k, v in params)
        # MiniMax's prompt opens reasoning: its forced call closes it first; Muse's call is a
        # message addressed to the function
        lead = "</think>\n\n" if family == "minimax_m2" else f" to={name}<|message|>"
        return f'{lead}<{block}>\n<{p}invoke name="{name}">\n{body}</{p}invoke>\n</{block}>'
    if family == "minicpm5":
        body = "".join(f'<param name="{k}">{_kv(v)}</param>' for k, v in params)
        return f'<function name="{name}">{body}</function>'
    if family == "kimi_k3":
        body = "".join(
            f'<|open|>argument key="{k}"<|sep|>{_kv(v)}<|close|>argument<|sep|>' for k, v in params
        )
        return (
            f'<|open|>tools<|sep|><|open|>call tool="{name}" index="1"<|sep|>{body}'
            "<|close|>call<|sep|><|close|>tools<|sep|>"
        )
    if family == "qwen3_coder":
        body = "".join(f"<parameter={k}>\n{_kv(v)}\n</parameter>\n" for k, v in params)
        return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"
    args = _j(dict(params))
    if family == "kimi_k2":
        return (
            f"<|tool_calls_section_begin|><|tool_call_begin|>functions.{name}:0"
            f"<|tool_call_argument_begin|>{args}<|tool_call_end|><|tool_calls_section_end|>"
        )
    if family == "deepseek_v3":
        s = DEEPSEEK_V3
        return f"{s.section_open}{s.call_open}{name}{s.sep}{args}{s.call_close}{s.section_close}"
    if family in ("gemma4", "function_gemma"):
        q, o, c = (
            ('<|"|>', "<|tool_call>", "<tool_call|>")
            if family == "gemma4"
            else ("<escape>", "<start_function_call>", "<end_function_call>")
        )
        body = ",".join(f"{k}:{q + v + q if isinstance(v, str) else _j(v)}" for k, v in params)
        return f"{o}call:{name}{{{body}}}{c}"
    assert family == "pythonic"
    body = ", ".join(f"{k}={_j(v)}" for k, v in params)
    return f"<|tool_call_start|>[{name}({body})]<|tool_call_end|>"


# -- schemas, values, validity -----------------------------------------------------------------

idents = st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=6)
words = (
    st.text("abcdefgh XYZ.,", min_size=1, max_size=10)
    .map(str.strip)
    .filter(lambda s: bool(s) and s not in ("true", "false", "null"))
)
KINDS: dict[str, tuple[dict[str, Any], st.SearchStrategy[Any]]] = {
    "string": ({"type": "string"}, words),
    "enum": (
        {"type": "string", "enum": ["red", "green blue"]},
        st.sampled_from(["red", "green blue"]),
    ),
    "integer": ({"type": "integer"}, st.integers(-999, 999)),
    "boolean": ({"type": "boolean"}, st.booleans()),
    "object": (
        {
            "type": "object",
            "properties": {"n": {"type": "integer"}, "s": {"type": "string"}},
            "required": ["n", "s"],
            "additionalProperties": False,
        },
        st.builds(lambda n, w: {"n": n, "s": w}, st.integers(0, 9), words),
    ),
    "array": (
        {"type": "array", "items": {"type": "integer"}},
        st.lists(st.integers(0, 9), max_size=3),
    ),
}


@st.composite
def tools_and_call(draw: st.DrawFn) -> tuple[dict[str, Any], Params]:
    keys = draw(st.lists(idents, min_size=0, max_size=4, unique=True))
    kinds = [draw(st.sampled_from(sorted(KINDS))) for _ in keys]
    required = [k for k in keys if draw(st.booleans())]
    props = {k: KINDS[kind][0] for k, kind in zip(keys, kinds, strict=True)}
    tool = {
        "type": "function",
        "name": draw(st.sampled_from(["get_weather", "lookup", "ns.find"])),
        "parameters": {"type": "object", "properties": props, "required": required},
    }
    if draw(st.booleans()):
        tool["parameters"]["additionalProperties"] = False
    present = [k for k in keys if k in required or draw(st.booleans())]
    ordered = [k for k in keys if k in required] + [k for k in keys if k not in required]
    values = {k: draw(KINDS[kind][1]) for k, kind in zip(keys, kinds, strict=True)}
    return tool, [(k, values[k]) for k in ordered if k in present]


UNSTRIPPED = {
    "qwen3_coder",
    "kimi_k3",
    "kimi_k2",
    "deepseek_v3",
    "gemma4",
    "function_gemma",
    "pythonic",
}  # formats whose parser keeps a string value's surrounding spaces


def valid(call: Call, tools: list[dict[str, Any]], family: str) -> bool:
    name, args = call
    tool = next((t for t in tools if t["name"] == name), None)
    if tool is None or not isinstance(args, dict):
        return False
    schema = tool["parameters"]
    props = schema["properties"]
    if any(k not in args for k in schema["required"]):
        return False
    if schema.get("additionalProperties") is False and any(k not in props for k in args):
        return False
    for k, v in args.items():
        if k not in props:
            continue
        s = props[k]
        kind = s["type"]
        ok = {
            "string": isinstance(v, str)
            and (family in UNSTRIPPED or v == v.strip())
            and v in s.get("enum", [v]),
            "integer": isinstance(v, int) and not isinstance(v, bool),
            "boolean": isinstance(v, bool),
            "array": isinstance(v, list) and all(isinstance(x, int) for x in v),
            "object": isinstance(v, dict)
            and set(v) == {"n", "s"}
            and isinstance(v["n"], int)
            and isinstance(v["s"], str),
        }[kind]
        if not ok:
            return False
    return True


# -- examples ----------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}
APPLY = {
    "type": "custom",
    "name": "apply",
    "format": {
        "type": "grammar",
        "syntax": "lark",
        "definition": 'start: "BEGIN " WORD " END"\nWORD: /[a-z]+/',
    },
}


@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_forced_call_is_accepted_and_reads_back(family: str, special: bool) -> None:
    params: Params = [("city", "Paris, FR"), ("days", 3)]
    text = write_call(family, "get_weather", params)
    assert accepts(family, special, [WEATHER], "get_weather", text)
    assert parse(family, text, [WEATHER]) == [("get_weather", dict(params))]
    # the optional parameter may be left out; the required one may not
    assert accepts(family, special, [WEATHER], None, write_call(family, "get_weather", params[:1]))
    assert not accepts(
        family, special, [WEATHER], None, write_call(family, "get_weather", params[1:])
    )
    assert not accepts(family, special, [WEATHER], None, write_call(family, "get_time", params))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_lark_custom_tool_is_forced_in_the_family_syntax(family: str) -> None:
    tools = [WEATHER, APPLY]
    good = write_call(family, "apply", [("input", "BEGIN abc END")])
    assert accepts(family, True, tools, "apply", good)
    assert parse(family, good, tools) == [("apply", {"input": "BEGIN abc END"})]
    bad = write_call(family, "apply", [("input", "BEGIN abc 1 END")])
    assert not accepts(family, True, tools, "apply", bad)


@pytest.mark.parametrize("family", FAMILIES)
def test_formats_name_their_grammar(family: str) -> None:
    assert formats.get(family).call_grammar is not None


# -- Hypothesis --------------------------------------------------------------------------------

HYPOTHESIS = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


@HYPOTHESIS
@given(family=st.sampled_from(FAMILIES), special=st.booleans(), case=tools_and_call())
def test_what_the_grammar_writes_reads_back(
    family: str, special: bool, case: tuple[dict[str, Any], Params]
) -> None:
    tool, params = case
    if family in ("kimi_k2", "deepseek_v3"):  # llguidance's %json keeps the declared key order
        declared = list(tool["parameters"]["properties"])
        params = sorted(params, key=lambda kv: declared.index(kv[0]))
    text = write_call(family, tool["name"], params)
    assert accepts(family, special, [tool], tool["name"], text), text
    assert parse(family, text, [tool]) == [(tool["name"], dict(params))]


MUTATIONS: dict[str, Callable[[Params, Any], tuple[str | None, Params]]] = {
    "drop": lambda p, d: (None, p[1:]),
    "extra": lambda p, d: (None, [*p, ("zzextra", "x")]),
    "wrong_type": lambda p, d: (None, [(k, "word" if not isinstance(v, str) else 5) for k, v in p]),
    "padded": lambda p, d: (None, [(k, f" {v} " if isinstance(v, str) else v) for k, v in p]),
    "unknown_name": lambda p, d: ("other", p),
    "swap": lambda p, d: (None, p[::-1]),
}


@HYPOTHESIS
@given(
    family=st.sampled_from(FAMILIES),
    special=st.booleans(),
    case=tools_and_call(),
    mutation=st.sampled_from(sorted(MUTATIONS)),
)
def test_the_grammar_accepts_only_calls_the_parser_reads_back_valid(
    family: str, special: bool, case: tuple[dict[str, Any], Params], mutation: str
) -> None:
    tool, params = case
    name, mutated = MUTATIONS[mutation](params, None)
    text = write_call(family, name or tool["name"], mutated)
    if accepts(family, special, [tool], None, text):
        read = parse(family, text, [tool])
        assert len(read) == 1
        assert valid(read[0], [tool], family), (text, read)
