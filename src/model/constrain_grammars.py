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
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llguidance import LLMatcher, LLTokenizer

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

__all__ = [
    "HERMES_FORMATS",
    "JSON_FORMAT",
    "InvalidSchema",
    "ToolGrammarBuilder",
    "json_schema_grammar",
    "validate_grammar",
]

JSON_FORMAT: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}

# Names under which callers may ask for the Hermes/Qwen format (mlx-lm calls its parser
# ``json_tools``).
HERMES_FORMATS = frozenset({"hermes", "json_tools", "qwen", "qwen2", "qwen3"})

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


class ToolGrammarBuilder:
    """Builds the grammar of one tool call in a model's format, for one llguidance tokenizer."""

    def __init__(self, tokenizer: LLTokenizer, token_id: Callable[[str], int | None]) -> None:
        self._tokenizer = tokenizer
        self._token_id = token_id

    def build(self, tools: Sequence[Mapping[str, Any]], name: str | None, tool_format: str) -> str:
        if tool_format not in HERMES_FORMATS:
            raise NotImplementedError(
                f"constrained tool calls support the Hermes format "
                f"({', '.join(sorted(HERMES_FORMATS))}), not {tool_format!r}"
            )
        functions = function_tools(tools)
        if name is not None:
            chosen = [f for f in functions if f[0] == name]
            if not chosen:
                known = ", ".join(repr(f[0]) for f in functions) or "none"
                raise InvalidSchema(
                    f"tool_choice names function {name!r}, which is not among the tools "
                    f"(function tools: {known})"
                )
            functions = chosen
        if not functions:
            raise InvalidSchema("a required tool call needs at least one function tool")
        for fname, parameters, strict in functions:
            validate_grammar(
                json_schema_grammar(parameters, strict=strict),
                self._tokenizer,
                what=f"parameters schema of function {fname!r}",
            )
        return self._hermes(functions)

    def _hermes(self, functions: list[tuple[str, dict[str, Any], bool]]) -> str:
        # <tool_call>\n{"name": "<name>", "arguments": <object>}\n</tool_call>
        alternatives = " | ".join(f"call_{i}" for i in range(len(functions)))
        lines = [
            f"start: {self._literal('<tool_call>')} {_lark_string(chr(10))} ({alternatives}) "
            f"{_lark_string(chr(10))} {self._literal('</tool_call>')}"
        ]
        for i, (fname, parameters, strict) in enumerate(functions):
            head = '{"name": ' + json.dumps(fname) + ', "arguments": '
            embedded = {**_without_extension(parameters), "x-guidance": _options(strict)}
            lines.append(f"call_{i}: {_lark_string(head)} args_{i} {_lark_string('}')}")
            lines.append(f"args_{i}: %json {json.dumps(embedded)}")
        return LLMatcher.grammar_from_lark("\n".join(lines) + "\n")

    def _literal(self, text: str) -> str:
        token = self._token_id(text)
        if token is not None and self._tokenizer.is_special_token(token):
            return f"<[{token}]>"
        return _lark_string(text)


def _lark_string(text: str) -> str:
    return json.dumps(text)


def function_tools(tools: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, Any], bool]]:
    """``(name, parameters, strict)`` of each function tool, flat (Responses) or nested (Chat
    Completions) form. ``strict`` is true only when the tool says so."""
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise InvalidSchema("tools must be a list")
    out: list[tuple[str, dict[str, Any], bool]] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise InvalidSchema(f"tools[{i}] must be an object")
        kind = tool.get("type", "function")
        if kind != "function":
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
        out.append((fname, dict(parameters), strict))
    return out
