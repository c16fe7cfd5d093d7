"""``text.format``: plain text, a JSON object, or JSON matching a schema (pure parsing).

Invariants:
- ``json_schema`` needs a ``name`` (1-64 of ``[A-Za-z0-9_-]``, as OpenAI) and a ``schema``
  object; whether the schema compiles is checked when the grammar is built, before generation,
  so an invalid schema is a 400 and nothing is created.
- ``to_json`` is what the Response object echoes under ``text.format``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import invalid_request
from .items.read import json_type

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _empty() -> Mapping[str, Any]:
    return {}


@dataclass(frozen=True, slots=True)
class TextFormat:
    kind: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema: Mapping[str, Any] = field(default_factory=_empty)
    strict: bool = False
    description: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.kind != "json_schema":
            return {"type": self.kind}
        out: dict[str, Any] = {
            "type": "json_schema",
            "name": self.name,
            "schema": dict(self.schema),
            "strict": self.strict,
        }
        if self.description is not None:
            out["description"] = self.description
        return out


TEXT = TextFormat()


def parse_text_format(text: object) -> tuple[TextFormat, str]:
    """``text`` -> (format, verbosity)."""
    if text is None:
        return TEXT, "medium"
    if not isinstance(text, dict):
        raise invalid_request(
            f"Invalid type for 'text': expected an object, but got {json_type(text)}.", "text"
        )
    unknown = set(text) - {"format", "verbosity"}
    if unknown:
        key = sorted(unknown)[0]
        raise invalid_request(f"Unknown parameter: 'text.{key}'.", f"text.{key}")
    verbosity = text.get("verbosity", "medium")
    if verbosity not in ("low", "medium", "high"):
        raise invalid_request(
            f"Invalid value for 'text.verbosity': {verbosity!r}; expected 'low', 'medium' or "
            "'high'.",
            "text.verbosity",
        )
    return _parse_format(text.get("format")), verbosity


def _parse_format(fmt: object) -> TextFormat:
    """``text.format``: absent is plain text."""
    if fmt is None:
        return TEXT
    if not isinstance(fmt, dict):
        raise invalid_request(
            f"Invalid type for 'text.format': expected an object, but got {json_type(fmt)}.",
            "text.format",
        )
    kind = fmt.get("type")
    if kind in ("text", "json_object"):
        return TextFormat(kind)
    if kind != "json_schema":
        raise invalid_request(
            f"Invalid value for 'text.format.type': {kind!r}; expected 'text', 'json_object' "
            "or 'json_schema'.",
            "text.format.type",
        )
    return _parse_json_schema(fmt)


def _parse_json_schema(fmt: dict[str, Any]) -> TextFormat:
    """A ``json_schema`` format's fields, each checked as OpenAI types it."""
    name = fmt.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise invalid_request(
            f"Invalid value for 'text.format.name': {name!r}; expected 1-64 letters, digits, "
            "'_' or '-'.",
            "text.format.name",
        )
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise invalid_request(
            f"Invalid type for 'text.format.schema': expected a JSON schema object, but got "
            f"{json_type(schema)}.",
            "text.format.schema",
        )
    strict = fmt.get("strict", False)
    if not isinstance(strict, bool):
        raise invalid_request(
            f"Invalid type for 'text.format.strict': expected a boolean, but got "
            f"{json_type(strict)}.",
            "text.format.strict",
        )
    description = fmt.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid_request(
            "Invalid type for 'text.format.description': expected a string.",
            "text.format.description",
        )
    return TextFormat("json_schema", name, schema, strict, description)
