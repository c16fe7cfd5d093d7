"""Grammar text for constrained decoding: JSON schemas and tool calls as llguidance grammars.

Invariants:
- Pure functions of their inputs and the llguidance tokenizer: no MLX, no shared mutable state.
- Every grammar writes JSON compactly (``", "``, ``": "``, no other whitespace; ``JSON_FORMAT``),
  the way ``json.dumps`` and the Hermes tool-call format do. A schema's own ``x-guidance`` options
  are dropped so a request cannot turn free whitespace back on.
- ``strict`` maps to llguidance's ``lenient = not strict``: with ``strict`` a keyword llguidance
  does not implement is an ``InvalidSchema``; without it the keyword is ignored (a warning).
- A literal that the tokenizer holds as one added token (``<tool_call>``) is written with
  llguidance's token syntax ``<[id]>``: llguidance treats every added token as special, and a
  quoted literal would never accept it (its mask even allows the token, but consuming it fails).
- Messages of ``InvalidSchema`` name what is wrong (they become a 400 for the client).
- A forced call's arguments are one JSON object. A custom tool's is ``{"input": <string>}``:
  any string (``text``), one matching its regex, or, for a Lark tool, exactly the text its
  grammar generates written raw between the quotes (a nested llguidance grammar; JSON escapes
  cannot be applied to a grammar's output, so a Lark grammar whose text holds ``"`` or ``\\``
  reads back through ``custom_input``'s raw fallback).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from llguidance import LLMatcher, LLTokenizer

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

__all__ = [
    "JSON_FORMAT",
    "ForcedTool",
    "InvalidSchema",
    "ToolGrammarBuilder",
    "argument_rules",
    "forced_tools",
    "json_schema_grammar",
    "lark_string",
    "validate_grammar",
]

JSON_FORMAT: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}

# Parameters of a function tool that declares none: the call's arguments are ``{}``.
_NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


class InvalidSchema(ValueError):
    """A schema or tool list that cannot be compiled; the message names what is wrong."""


def _options(strict: bool) -> JsonCompileOptions:
    return {
        "whitespace_flexible": False,
        "item_separator": ", ",
        "key_separator": ": ",
        "lenient": not strict,
    }


def _without_extension(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k != "x-guidance"}


def json_schema_grammar(schema: Mapping[str, Any], *, strict: bool = True) -> str:
    """The llguidance grammar of one JSON value valid against ``schema``."""
    try:
        return LLMatcher.grammar_from_json_schema(
            _without_extension(schema), overrides=_options(strict)
        )
    except ValueError as exc:
        raise InvalidSchema(f"invalid JSON schema: {exc}") from None


def validate_grammar(
    source: str, tokenizer: LLTokenizer, *, what: str = "JSON schema"
) -> tuple[str, ...]:
    """llguidance's warnings for ``source``; raises ``InvalidSchema`` naming ``what`` on error."""
    is_error, messages = LLMatcher.validate_grammar_with_warnings(source, tokenizer)
    if is_error:
        raise InvalidSchema(f"invalid {what}: {_one_line(messages[0] if messages else '?')}")
    return tuple(messages)


def _one_line(message: str) -> str:
    return re.sub(r"\s+", " ", message).strip()


def lark_string(text: str) -> str:
    """``text`` as a quoted Lark literal."""
    return json.dumps(text)


CustomSyntax = Literal["function", "text", "regex", "lark"]
CUSTOM_INPUT = "input"
CUSTOM_HEAD = '{"' + CUSTOM_INPUT + '": "'  # a forced Lark custom call's arguments, around
CUSTOM_TAIL = '"}'  # the raw text its grammar generates


@dataclass(frozen=True, slots=True)
class ForcedTool:
    """One tool a forced call may name: a function (its parameters schema) or a custom tool
    (``syntax`` ``text``/``regex``/``lark`` and its ``definition``)."""

    name: str
    parameters: Mapping[str, Any]
    strict: bool = False
    syntax: CustomSyntax = "function"
    definition: str = ""


def _custom_schema(pattern: str | None) -> dict[str, Any]:
    string: dict[str, Any] = {"type": "string"}
    if pattern is not None:  # JSON Schema patterns are unanchored: anchor it
        string["pattern"] = f"^(?:{pattern})$"
    return {
        "type": "object",
        "properties": {CUSTOM_INPUT: string},
        "required": [CUSTOM_INPUT],
        "additionalProperties": False,
    }


def argument_rules(tools: Sequence[ForcedTool]) -> list[str]:
    """Lark rules ``args_0``, ``args_1``... : the arguments object of each tool, compact JSON
    (a Lark custom tool's refers to its own grammar, ``@custom_i``)."""
    lines = []
    for i, tool in enumerate(tools):
        if tool.syntax == "lark":
            lines.append(
                f"args_{i}: {lark_string(CUSTOM_HEAD)} @custom_{i} {lark_string(CUSTOM_TAIL)}"
            )
            continue
        if tool.syntax == "function":
            schema, strict = dict(tool.parameters), tool.strict
        else:
            schema = _custom_schema(tool.definition if tool.syntax == "regex" else None)
            strict = True
        embedded = {**_without_extension(schema), "x-guidance": _options(strict)}
        lines.append(f"args_{i}: %json {json.dumps(embedded)}")
    return lines


def forced_tools(tools: Sequence[Mapping[str, Any]], name: str | None) -> list[ForcedTool]:
    """The tools a forced call may name: all of ``tools``, or the one called ``name``."""
    candidates = _parse_tools(tools)
    if name is not None:
        chosen = [t for t in candidates if t.name == name]
        if not chosen:
            known = ", ".join(repr(t.name) for t in candidates) or "none"
            raise InvalidSchema(
                f"tool_choice names function {name!r}, which is not among the tools "
                f"(function tools: {known})"
            )
        candidates = chosen
    if not candidates:
        raise InvalidSchema("a required tool call needs at least one function tool")
    return candidates


class ToolGrammarBuilder:
    """Builds the grammar of one forced tool call in a model's format, for one tokenizer."""

    def __init__(self, tokenizer: LLTokenizer, token_id: Callable[[str], int | None]) -> None:
        self._tokenizer = tokenizer
        self._token_id = token_id

    def build(
        self,
        tools: Sequence[Mapping[str, Any]],
        name: str | None,
        format_name: str,
        call_grammar: Callable[[Sequence[ForcedTool], Callable[[str], str]], str] | None,
    ) -> str:
        """The top-level llguidance grammar; ``NotImplementedError`` when the format has no
        ``call_grammar``, ``InvalidSchema`` for bad tools or an unknown ``name``."""
        if call_grammar is None:
            raise NotImplementedError(
                f"the {format_name!r} tool format cannot constrain a call "
                "(--tool-format NAME chooses another)"
            )
        chosen = forced_tools(tools, name)
        grammars: list[dict[str, str]] = []
        for i, tool in enumerate(chosen):
            if tool.syntax == "function":
                validate_grammar(
                    json_schema_grammar(tool.parameters, strict=tool.strict),
                    self._tokenizer,
                    what=f"parameters schema of function {tool.name!r}",
                )
            elif tool.syntax == "lark":
                validate_grammar(
                    json.dumps({"grammars": [{"lark_grammar": tool.definition}]}),
                    self._tokenizer,
                    what=f"Lark grammar of custom tool {tool.name!r}",
                )
                grammars.append({"name": f"custom_{i}", "lark_grammar": tool.definition})
        main = call_grammar(chosen, self._literal)
        source = json.dumps({"grammars": [{"name": "call", "lark_grammar": main}, *grammars]})
        return source

    def _literal(self, text: str) -> str:
        token = self._token_id(text)
        if token is not None and self._tokenizer.is_special_token(token):
            return f"<[{token}]>"
        return lark_string(text)


def _parse_tools(tools: Sequence[Mapping[str, Any]]) -> list[ForcedTool]:
    """Each tool, flat (Responses) or nested (Chat Completions) function form, or a custom
    tool (``{"type": "custom", "name": ..., "format": ...}``). ``strict`` only when said."""
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise InvalidSchema("tools must be a list")
    out: list[ForcedTool] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise InvalidSchema(f"tools[{i}] must be an object")
        kind = tool.get("type", "function")
        if kind not in ("function", "custom"):
            raise InvalidSchema(
                f"tools[{i}].type {kind!r} cannot be called by constrained decoding"
            )
        nested = tool.get("function")
        fn: Mapping[str, Any] = nested if isinstance(nested, Mapping) else tool
        fname = fn.get("name")
        if not isinstance(fname, str) or not fname:
            raise InvalidSchema(f"tools[{i}].name must be a non-empty string")
        if fname in seen:
            raise InvalidSchema(f"tools[{i}].name {fname!r} is used by more than one tool")
        seen.add(fname)
        if kind == "custom":
            out.append(_custom_tool(fname, tool.get("format"), i))
            continue
        parameters = fn.get("parameters")
        if parameters is None:
            parameters = _NO_PARAMETERS
        if not isinstance(parameters, Mapping):
            raise InvalidSchema(f"tools[{i}].parameters must be a JSON schema object")
        declared = parameters.get("type")
        if declared is not None and declared != "object":
            raise InvalidSchema(
                f"tools[{i}].parameters must describe an object (its type is {declared!r})"
            )
        strict = fn.get("strict", tool.get("strict")) is True
        out.append(ForcedTool(fname, dict(parameters), strict))
    return out


def _custom_tool(name: str, fmt: object, i: int) -> ForcedTool:
    if fmt is None or (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        return ForcedTool(name, _custom_schema(None), True, "text")
    if isinstance(fmt, Mapping) and fmt.get("type") == "grammar":
        syntax, definition = fmt.get("syntax"), fmt.get("definition")
        if syntax in ("regex", "lark") and isinstance(definition, str) and definition:
            return ForcedTool(
                name,
                _custom_schema(definition if syntax == "regex" else None),
                True,
                "regex" if syntax == "regex" else "lark",
                definition,
            )
    raise InvalidSchema(f"tools[{i}].format is not a text, regex or lark format")
