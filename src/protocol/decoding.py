"""What a response's decoding must follow (pure): one call of the offered tools, JSON that
matches a schema, or any JSON object; the model side compiles it (``model/constrain.py``).

Invariants:
- ``tool_choice`` ``required`` (or a named function) with tools wins over ``text.format``;
  otherwise a ``json_schema`` or ``json_object`` format; else nothing is constrained (None).
- A custom tool goes as sent (its format constrains its input), under its offered name.
- ``param`` and ``schema_param`` are the request parameters a refusal names: a schema that does
  not compile (``schema_param``), a rule this model cannot follow (``param``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .text_format import TextFormat
from .tools.spec import FunctionTool, ToolChoice


def _empty() -> Mapping[str, Any]:
    return {}


@dataclass(frozen=True, slots=True)
class Decoding:
    kind: Literal["tool_call", "json_schema", "json_object"]
    tools: tuple[Mapping[str, Any], ...] = ()  # a tool call's offered tools, as JSON
    name: str | None = None  # a tool call of this function only
    schema: Mapping[str, Any] = field(default_factory=_empty)
    strict: bool = False

    @property
    def param(self) -> str:
        return "tool_choice" if self.kind == "tool_call" else "text.format"

    @property
    def schema_param(self) -> str:
        return "tools" if self.kind == "tool_call" else "text.format.schema"


def decoding_for(
    choice: ToolChoice, text_format: TextFormat, tools: tuple[FunctionTool, ...]
) -> Decoding | None:
    """The rule a request's ``tool_choice``, ``text.format`` and offered ``tools`` set."""
    if choice.mode == "required" and tools:
        offered = tuple(
            {"type": "custom", "name": t.name, "format": dict(t.custom_format)}
            if t.custom_format is not None
            else t.to_json()
            for t in tools
        )
        return Decoding("tool_call", offered, name=choice.name)
    if text_format.kind == "json_schema":
        return Decoding("json_schema", schema=dict(text_format.schema), strict=text_format.strict)
    if text_format.kind == "json_object":
        return Decoding("json_object")
    return None
