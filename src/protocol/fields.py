"""Reading one field of a JSON request strictly (pure): the 400 names the field's path.

Invariants:
- A check raises ``invalid_request`` naming ``path.key`` and changes nothing; it never guesses
  a value of another type.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import invalid_request


def json_type(value: object) -> str:
    """The JSON name of a value's type, for error messages."""
    match value:
        case None:
            return "null"
        case bool():
            return "a boolean"
        case int() | float():
            return "a number"
        case str():
            return "a string"
        case list() | tuple():
            return "an array"
        case dict():
            return "an object"
    return type(value).__name__


def require_str(item: Mapping[str, Any], key: str, path: str) -> str:
    """``item[key]``, a required string; else a 400 naming ``path.key``."""
    value = item.get(key)
    if value is None:
        raise invalid_request(f"Missing required parameter: '{path}.{key}'.", f"{path}.{key}")
    if not isinstance(value, str):
        raise invalid_request(
            f"Invalid type for '{path}.{key}': expected a string, but got {json_type(value)}.",
            f"{path}.{key}",
        )
    return value


def optional_str(item: Mapping[str, Any], key: str, path: str) -> str | None:
    """``item[key]`` when a string or absent/null; else a 400 naming ``path.key``."""
    value = item.get(key)
    if value is not None and not isinstance(value, str):
        raise invalid_request(
            f"Invalid type for '{path}.{key}': expected a string, but got {json_type(value)}.",
            f"{path}.{key}",
        )
    return value
