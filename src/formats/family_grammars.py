"""Forced-call grammars (llguidance Lark) in each family's own syntax.

Each builder has the ``Format.call_grammar`` shape: ``(tools, literal) -> Lark text`` for exactly
one call of one of ``tools`` (``grammars.ForcedTool``), then the end. ``literal(marker)`` writes a
marker as its special token where the tokenizer has one.

Invariants:
- What a grammar accepts, the format's parser reads back as the same call: the name, and
  arguments valid against the tool's schema (``tests/test_formats_family_grammars.py``).
- JSON-argument formats (Kimi K2, DeepSeek) use ``grammars.argument_rules`` as Hermes does.
  Key/value formats (GLM, MiniMax, Qwen3-Coder...), Gemma's notation and pythonic calls write
  one parameter at a time from the schema's ``properties``: required ones always, optional
  ones may be left out, no others. A string parameter is raw text that never contains the
  text the parser would end it at (its close marker, and for formats whose parser strips
  values, no whitespace at either end); an ``enum`` of strings is one of its values; any other
  parameter is compact JSON valid against its schema (``%json``).
- A custom tool's call has one parameter, ``input``: its Lark grammar's text raw (``@custom_i``),
  a string matching its regex, or any text.
- A raw string value also matches its schema's ``pattern`` (searched, as JSON Schema does,
  unless anchored), ``minLength`` and ``maxLength`` (``string_constraints``), in llguidance's
  regex syntax intersected (``&``) with the format's own value regex.
- Limits (documented in ``docs/models.md``): a parameter whose schema allows both strings and
  other types is written as JSON, which a key/value parser reads back as the JSON text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .grammars import JSON_FORMAT, ForcedTool, argument_rules, lark_string
from .json_sections import DEEPSEEK_V3, KIMI_K2, SectionSyntax

Literal = Callable[[str], str]

__all__ = [
    "deepseek_grammar",
    "function_gemma_grammar",
    "gemma4_grammar",
    "glm_grammar",
    "kimi_grammar",
    "kimi_k3_grammar",
    "longcat_grammar",
    "minicpm5_grammar",
    "minimax_grammar",
    "muse_spark_grammar",
    "pythonic_grammar",
    "qwen3_coder_grammar",
    "string_constraints",
]


def _alternatives(tools: Sequence[ForcedTool]) -> str:
    return " | ".join(f"call_{i}" for i in range(len(tools)))


_REGEX_META = frozenset("\\.+*?()|[]{}^$#&-~/")


def _regex_text(text: str) -> str:
    """``text`` as a literal inside a Lark ``/.../`` regex (Rust regex syntax)."""
    out = []
    for c in text:
        if c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        else:
            out.append("\\" + c if c in _REGEX_META else c)
    return "".join(out)


def _json_rule(schema: Mapping[str, Any], strict: bool) -> str:
    embedded = {
        **{k: v for k, v in schema.items() if k != "x-guidance"},
        "x-guidance": {**JSON_FORMAT, "lenient": not strict},
    }
    return f"%json {json.dumps(embedded)}"


# -- JSON arguments ----------------------------------------------------------------------------


def _section_grammar(
    syntax: SectionSyntax, header: Callable[[str, int], str]
) -> Callable[[Sequence[ForcedTool], Literal], str]:
    def build(tools: Sequence[ForcedTool], literal: Literal) -> str:
        lines = [
            f"start: {literal(syntax.section_open)} {literal(syntax.call_open)} "
            f"({_alternatives(tools)}) {literal(syntax.call_close)} "
            f"{literal(syntax.section_close)}"
        ]
        for i, tool in enumerate(tools):
            lines.append(
                f"call_{i}: {lark_string(header(tool.name, i))} {literal(syntax.sep)} args_{i}"
            )
        lines.extend(argument_rules(tools))
        return "\n".join(lines) + "\n"

    return build


kimi_grammar = _section_grammar(KIMI_K2, lambda name, i: f"functions.{name}:0")
"""``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>
{...}<|tool_call_end|><|tool_calls_section_end|>``."""

deepseek_grammar = _section_grammar(DEEPSEEK_V3, lambda name, i: name)
"""DeepSeek V3.1's ``<tool calls begin><tool call begin>NAME<tool sep>{...}<tool call end>
<tool calls end>``."""


# -- parameters one at a time ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Params:
    """How one format writes a parameter: ``head(key)`` before the value, ``close`` after it,
    ``stops`` where its parser ends a raw value, ``trim`` when the parser strips values,
    ``quote`` around a string value (Gemma), ``separator`` between parameters, ``after`` each
    parameter."""

    head: Callable[[str, Literal], str]
    close: str
    stops: tuple[str, ...]
    trim: bool
    quote: str = ""
    separator: str = ""
    close_is_marker: bool = True
    json_only: bool = False  # pythonic: every value is JSON (a Python literal)
    after: str = ""  # text after each parameter (the newline GLM's and MiniMax's templates write)


class _Rules:
    """Collects the rules and terminals of one grammar."""

    def __init__(self, literal: Literal) -> None:
        self.literal = literal
        self.lines: list[str] = []

    def raw_text(
        self, name: str, p: _Params, pattern: str | None = None, also: Sequence[str] = ()
    ) -> str:
        """A raw string value and what closes it, as one expression; the value also matches
        each regex of ``also`` (a schema's pattern and length bounds)."""
        body = pattern if pattern is not None else ("(\\S(.*\\S)?)?" if p.trim else ".*")
        end = p.quote or p.close
        closer = self.literal(end) if (p.quote or p.close_is_marker) else lark_string(end)
        stops = "|".join(_regex_text(s) for s in (*p.stops, end))
        terms = [f"/(?s:{body})/", *(f"/{r}/" for r in also), f"~/(?s:.*({stops}).*)/"]
        self.lines.append(f"B_{name}: " + " & ".join(terms))
        if closer.startswith("<["):  # a special token: text can never run into it
            return f"B_{name} {closer}"
        self.lines.append(f"V_{name}: B_{name} {closer}")
        return f"V_{name}"

    def value(self, name: str, schema: Mapping[str, Any], strict: bool, p: _Params) -> str:
        """A parameter's value (with the quote and close around it, where the format has them)."""
        close = "" if p.quote else self._close(p)
        kind = schema.get("type")
        strings = _string_choices(schema)
        if p.json_only:
            self.lines.append(f"j_{name}: {_json_rule(schema, strict)}")
            return f"j_{name}"
        if strings is not None:
            quote = self.literal(p.quote) if p.quote else ""
            alts = " | ".join(lark_string(s) for s in strings)
            return f"{quote} ({alts}) {quote or close}".strip()
        if kind == "string" or (isinstance(kind, list) and "string" in kind and not p.quote):
            opener = self.literal(p.quote) + " " if p.quote else ""
            return opener + self.raw_text(name, p, also=string_constraints(schema))
        if kind == "boolean":
            return f'("true" | "false") {close}'.strip()
        self.lines.append(f"j_{name}: {_json_rule(schema, strict)}")
        return f"j_{name} {close}".strip()

    def custom(self, i: int, tool: ForcedTool, p: _Params) -> str:
        """A custom tool's ``input`` value."""
        if p.json_only:
            if tool.syntax == "lark":
                return f'"\\"" @custom_{i} "\\""'
            string: dict[str, Any] = {"type": "string"}
            if tool.syntax == "regex":
                string["pattern"] = f"^(?:{tool.definition})$"
            self.lines.append(f"j_C{i}: {_json_rule(string, True)}")
            return f"j_C{i}"
        opener = self.literal(p.quote) + " " if p.quote else ""
        if tool.syntax == "lark":
            closer = self.literal(p.quote) if p.quote else self._close(p)
            return f"{opener}@custom_{i} {closer}"
        regex = tool.definition if tool.syntax == "regex" else None
        return opener + self.raw_text(f"C{i}", p, regex)

    def _close(self, p: _Params) -> str:
        return self.literal(p.close) if p.close_is_marker else lark_string(p.close)


def _regex_slashes(regex: str) -> str:
    """``regex`` inside Lark's ``/.../``: a bare ``/`` would end it."""
    out, escaped = [], False
    for c in regex:
        out.append("\\/" if c == "/" and not escaped else c)
        escaped = c == "\\" and not escaped
    return "".join(out)


def string_constraints(schema: Mapping[str, Any]) -> list[str]:
    """Regexes (llguidance syntax) a string value must match for ``schema``'s ``pattern``,
    ``minLength`` and ``maxLength``, as JSON Schema means them: a pattern is searched for
    anywhere in the value unless anchored (``^``/``$``), lengths count characters."""
    out = []
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and pattern:
        inner = pattern
        start = inner.startswith("^")
        if start:
            inner = inner[1:]
        end = inner.endswith("$") and not _escaped_at(inner, len(inner) - 1)
        if end:
            inner = inner[:-1]
        lead = "" if start else "(?s:.*)"
        trail = "" if end else "(?s:.*)"
        out.append(f"{lead}(?:{_regex_slashes(inner)}){trail}")
    low, high = schema.get("minLength"), schema.get("maxLength")
    low = low if isinstance(low, int) and not isinstance(low, bool) and low > 0 else 0
    high = high if isinstance(high, int) and not isinstance(high, bool) and high >= 0 else None
    if low or high is not None:
        out.append(f"(?s:.{{{low},{'' if high is None else high}}})")
    return out


def _escaped_at(text: str, i: int) -> bool:
    """Whether ``text[i]`` follows an odd run of backslashes."""
    n = 0
    while i - n - 1 >= 0 and text[i - n - 1] == "\\":
        n += 1
    return n % 2 == 1


def _string_choices(schema: Mapping[str, Any]) -> list[str] | None:
    if "const" in schema and isinstance(schema["const"], str):
        return [schema["const"]]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return list(enum)
    return None


def _properties(tool: ForcedTool) -> list[tuple[str, Mapping[str, Any], bool]]:
    """(key, schema, required) of each parameter, required ones first (declared order kept)."""
    props = tool.parameters.get("properties")
    if not isinstance(props, Mapping):
        return []
    required = tool.parameters.get("required") or []
    items = [(k, s if isinstance(s, Mapping) else {}, k in required) for k, s in props.items()]
    return [x for x in items if x[2]] + [x for x in items if not x[2]]


def _param_list(rules: _Rules, i: int, tool: ForcedTool, p: _Params) -> str:
    """The parameters of call ``i``: required in order, then any optional ones in order."""
    if tool.syntax != "function":
        after = f" {lark_string(p.after)}" if p.after else ""
        return f"{p.head('input', rules.literal)} {rules.custom(i, tool, p)}{after}"
    items = []
    for j, (key, schema, required) in enumerate(_properties(tool)):
        after = f" {lark_string(p.after)}" if p.after else ""
        rules.lines.append(
            f"p_{i}_{j}: {p.head(key, rules.literal)} "
            f"{rules.value(f'{i}_{j}', schema, tool.strict, p)}{after}"
        )
        items.append((f"p_{i}_{j}", required))
    if not p.separator:
        return " ".join(name if req else f"{name}?" for name, req in items)
    sep = lark_string(p.separator)
    needed = [name for name, req in items if req]
    optional = [name for name, req in items if not req]
    if needed:
        head = f" {sep} ".join(needed)
        return head + "".join(f" ({sep} {o})?" for o in optional)
    if not optional:
        return ""
    starts = [
        " ".join([optional[k], *(f"({sep} {o})?" for o in optional[k + 1 :])])
        for k in range(len(optional))
    ]
    return "(" + " | ".join(starts) + ")?"


_XTML_MARKER = re.compile(r"(<\|[^|<>]+\|>)")


def _markup(literal: Literal) -> Literal:
    """``literal`` for text that may hold several ``<|...|>`` markers (Kimi K3's
    ``<|close|>argument<|sep|>``): each marker as its token where it is one, the rest quoted."""

    def write(text: str) -> str:
        return " ".join(literal(piece) for piece in _XTML_MARKER.split(text) if piece)

    return write


def _per_param_grammar(
    p: _Params,
    head: Callable[[str, Literal], str],
    tail: Callable[[Literal], str],
    json_block: tuple[str, str] | None = None,
) -> Callable[[Sequence[ForcedTool], Literal], str]:
    """``json_block``: (open, close) around one JSON object of all arguments, which a function
    call may write instead of its parameters one at a time (Kimi K3's ``<|open|>json``)."""

    def build(tools: Sequence[ForcedTool], token_literal: Literal) -> str:
        literal = _markup(token_literal)
        rules = _Rules(literal)
        lines = [f"start: {_alternatives(tools)}"]
        for i, tool in enumerate(tools):
            params = _param_list(rules, i, tool, p)
            if json_block is not None and tool.syntax == "function":
                rules.lines.append(f"o_{i}: {_json_rule(tool.parameters, tool.strict)}")
                whole = f"{literal(json_block[0])} o_{i} {literal(json_block[1])}"
                params = f"(({params}) | {whole})" if params else f"({whole})?"
            lines.append(f"call_{i}: {head(tool.name, literal)} {params} {tail(literal)}")
        return "\n".join(lines + rules.lines) + "\n"

    return build


def _s(text: str) -> str:
    return lark_string(text)


# GLM-4.6's template: ``<tool_call>NAME\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n
# </tool_call>`` (4.7 drops the newlines; the parser reads both).
def _glm_like(prefix: str) -> Callable[[Sequence[ForcedTool], Literal], str]:
    tag = f"{prefix}tool_call"
    params = _Params(
        head=lambda k, lit: (
            f"{lit(f'<{prefix}arg_key>')} {_s(k)} {lit(f'</{prefix}arg_key>')} {_s(chr(10))} "
            f"{lit(f'<{prefix}arg_value>')}"
        ),
        close=f"</{prefix}arg_value>",
        stops=(f"</{tag}>",),
        trim=True,
        after="\n",
    )
    return _per_param_grammar(
        params,
        lambda name, lit: f"{lit(f'<{tag}>')} {_s(name + chr(10))}",
        lambda lit: lit(f"</{tag}>"),
    )


glm_grammar = _glm_like("")
longcat_grammar = _glm_like("longcat_")


def _invoke_like(
    prefix: str, block_open: str, block_close: str, opened: str = "", addressed: bool = False
) -> Callable[[Sequence[ForcedTool], Literal], str]:
    """``opened``: the reasoning close written first, for a template whose generation prompt
    always opens reasoning (MiniMax M2's ends in ``<think>``): the call then follows an empty
    reasoning block instead of landing inside it. ``addressed``: the block is the body of a
    message addressed to the function, `` to=NAME<|message|>`` (Muse, as its template writes a
    call after the prompt's ``<|start|>assistant``)."""
    params = _Params(
        head=lambda k, lit: _s(f'<{prefix}parameter name="{k}">'),
        close=f"</{prefix}parameter>",
        stops=(f"</{prefix}invoke>",),
        trim=True,
        close_is_marker=False,
        after="\n",
    )

    def head(name: str, lit: Literal) -> str:
        lead = f"{lit(opened)} {_s(chr(10) * 2)} " if opened else ""
        if addressed:
            lead += f"{_s(' to=' + name)} {lit('<|message|>')} "
        invoke = f"\n<{prefix}invoke name={json.dumps(name)}>\n"
        return f"{lead}{lit(block_open)} {_s(invoke)}"

    return _per_param_grammar(
        params,
        head,
        lambda lit: f"{_s(f'</{prefix}invoke>' + chr(10))} {lit(block_close)}",
    )


minimax_grammar = _invoke_like("", "<minimax:tool_call>", "</minimax:tool_call>", opened="</think>")
muse_spark_grammar = _invoke_like(
    "atem:", "<atem:function_calls>", "</atem:function_calls>", addressed=True
)

minicpm5_grammar = _per_param_grammar(
    _Params(
        head=lambda k, lit: _s(f'<param name="{k}">'),
        close="</param>",
        stops=("</function>",),
        trim=True,
        close_is_marker=False,
    ),
    lambda name, lit: _s(f"<function name={json.dumps(name)}>"),
    lambda lit: _s("</function>"),
)

# Qwen3-Coder: ``<tool_call>\n<function=NAME>\n<parameter=k>\nv\n</parameter>\n</function>\n
# </tool_call>``; its parser drops one newline on each side of a value and ends a value at any
# of the tags below.
qwen3_coder_grammar = _per_param_grammar(
    _Params(
        head=lambda k, lit: _s(f"<parameter={k}>\n"),
        close="\n</parameter>\n",
        stops=("</parameter>", "<parameter=", "</function>", "</tool_call>"),
        trim=False,
        close_is_marker=False,
    ),
    lambda name, lit: f"{lit('<tool_call>')} {_s(chr(10) + '<function=' + name + '>' + chr(10))}",
    lambda lit: f"{_s('</function>' + chr(10))} {lit('</tool_call>')}",
)


def _gemma_like(
    open_: str, close: str, quote: str
) -> Callable[[Sequence[ForcedTool], Literal], str]:
    return _per_param_grammar(
        _Params(
            head=lambda k, lit: _s(f"{k}:"),
            close="",
            stops=(),
            trim=False,
            quote=quote,
            separator=",",
        ),
        lambda name, lit: f"{lit(open_)} {_s(f'call:{name}{{')}",
        lambda lit: f"{_s('}')} {lit(close)}",
    )


gemma4_grammar = _gemma_like("<|tool_call>", "<tool_call|>", '<|"|>')
function_gemma_grammar = _gemma_like("<start_function_call>", "<end_function_call>", "<escape>")

pythonic_grammar = _per_param_grammar(
    _Params(
        head=lambda k, lit: _s(f"{k}="),
        close="",
        stops=(),
        trim=False,
        separator=", ",
        json_only=True,
    ),
    lambda name, lit: f"{lit('<|tool_call_start|>')} {_s(f'[{name}(')}",
    lambda lit: f"{_s(')]')} {lit('<|tool_call_end|>')}",
)

# Kimi K3's XTML: ``<|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|>`` then
# ``<|open|>argument key="k"<|sep|>v<|close|>argument<|sep|>`` per parameter (values are not
# stripped; the schema types them), or all arguments as one ``<|open|>json type="object"<|sep|>
# {...}<|close|>json<|sep|>`` block (compact JSON), ``<|close|>call<|sep|><|close|>tools<|sep|>``.
kimi_k3_grammar = _per_param_grammar(
    _Params(
        head=lambda k, lit: lit(f'<|open|>argument key="{k}"<|sep|>'),
        close="<|close|>argument<|sep|>",
        stops=("<|close|>call<|sep|>",),
        trim=False,
    ),
    lambda name, lit: (
        # Its prompt opens the think block (or, thinking off, the response): a call may close
        # them first, as the template writes a turn; the parser reads either way.
        f"(({lit('<|close|>think<|sep|><|open|>response<|sep|>')})? "
        f"{lit('<|close|>response<|sep|>')})? "
        + lit(f'<|open|>tools<|sep|><|open|>call tool="{name}" index="1"<|sep|>')
    ),
    lambda lit: lit("<|close|>call<|sep|><|close|>tools<|sep|>"),
    json_block=('<|open|>json type="object"<|sep|>', "<|close|>json<|sep|>"),
)
