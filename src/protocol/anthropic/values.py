"""Reading a decoded Anthropic request body (``anthropic.py``): each value checked at its
dotted path, a refusal an ``ApiError`` 400 whose message starts with that path
(``messages.1.content.0.type: ...``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from ..errors import ApiError, invalid_request
from ..items.read import json_type

JsonObject = dict[str, Any]


def keyset(names: str) -> frozenset[str]:
    return frozenset(names.split())


def bad(path: str, message: str) -> ApiError:
    return invalid_request(f"{path}: {message}", path)


_T = TypeVar("_T")


def typed(value: object, path: str, kind: type[_T] | tuple[type, ...], expected: str) -> _T:
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
        raise bad(path, f"expected {expected}, but got {json_type(value)}.")
    return value  # type: ignore[return-value]


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def obj(value: object, path: str) -> JsonObject:
    return typed(value, path, dict, "an object")


def string(value: object, path: str) -> str:
    return typed(value, path, str, "a string")


def only_keys(obj: Mapping[str, Any], allowed: frozenset[str], path: str) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        where = f"{path}.{extra[0]}" if path else extra[0]
        raise bad(where, "Extra inputs are not permitted.")


def required(obj: Mapping[str, Any], key: str, path: str) -> Any:
    if obj.get(key) is None:
        raise bad(f"{path}.{key}" if path else key, "Field required.")
    return obj[key]


def number_between(value: object, path: str, low: float, high: float) -> float:
    number: float = typed(value, path, (int, float), "a number")
    if not low <= number <= high:
        raise bad(path, f"expected a number between {low:g} and {high:g}, but got {number!r}.")
    return float(number)


def one_of(value: object, path: str, allowed: tuple[str | None, ...]) -> Any:
    if value not in allowed:
        names = ", ".join(repr(a) for a in allowed if a is not None)
        raise bad(path, f"{value!r} is not one of {names}.")
    return value
