"""One field of a JSON item, checked strictly: the 400 names its JSON path (pure; re-exported by
``read.py``, shared with ``hosted_read.py``).

Invariants:
- Every refusal is an ``ApiError`` (``invalid_request``) whose ``param`` is the full JSON path of
  the field at fault (``input[2].action.query``), and whose message names it the way OpenAI's
  do ("Missing required parameter", "Invalid type for", "Unknown parameter").
- A check never guesses a value of another type: a number is no string, a boolean no number.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import invalid_request


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


def only_keys(item: Mapping[str, Any], keys: Iterable[str], path: str) -> None:
    """A 400 naming the first key of ``item`` (sorted) that is not one of ``keys``."""
    extra = set(item) - set(keys)
    if extra:
        key = sorted(extra)[0]
        raise invalid_request(f"Unknown parameter: '{path}.{key}'.", f"{path}.{key}")


def wrong_type(path: str, expected: str, value: object) -> Exception:
    """The 400 for ``value`` at ``path``, which should have been ``expected``."""
    return invalid_request(
        f"Invalid type for '{path}': expected {expected}, but got {json_type(value)}.", path
    )
