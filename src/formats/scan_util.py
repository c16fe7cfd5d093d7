"""Small scanning helpers the family formats share (pure; no MLX, no Trio).

Invariant: ``take_until`` never consumes text that could still be the start of one of its stops,
so a scanner built on it decides each character from the text before it only and any chunking
of the same text gives the same result.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .base import CallStream, ParsedEvent, find_first, partial_suffix


def take_until(
    buf: str, pos: int, stops: Sequence[str], final: bool
) -> tuple[str, int, str | None]:
    """Text from ``pos`` up to the earliest stop: ``(text, new_pos, stop)``.

    When a stop is found, ``new_pos`` is just past it. When none is, all of the rest is taken
    except a tail that could still grow into a stop (unless ``final``), and ``stop`` is None.
    """
    i, stop = find_first(buf, pos, stops)
    if i >= 0:
        return buf[pos:i], i + len(stop), stop
    end = len(buf) if final else len(buf) - partial_suffix(buf, pos, stops)
    return buf[pos:end], end, None


def unquote(text: str) -> str:
    """A name written bare, or in single or double quotes (``name="f"``)."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


def xml_param_value(text: str, schema: Mapping[str, Any] | None = None) -> object:
    """The JSON value of one XML parameter.

    A value stays a string unless it parses as JSON that is not a string (a number, a bool,
    ``null``, an object or an array). Where the tool's schema says the parameter is a string,
    it always stays a string.
    """
    kind = schema.get("type") if schema else None
    stripped = text.strip()
    if kind == "string" or (isinstance(kind, list) and "string" in kind and stripped != "null"):
        return text
    if kind == "boolean" and stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    try:
        value = json.loads(stripped)
        json.dumps(value, allow_nan=False)  # 1e999 parses as inf, which is not JSON
    except ValueError:
        return text
    return text if isinstance(value, str) else value


def typed_param(
    schemas: Mapping[str, Mapping[str, Any]] | None,
    function: str,
    key: str,
    value: str,
    declared: str | None = None,
) -> object:
    """A parameter's value typed by the tool's schema for ``key``, else by the type the model
    ``declared`` for it (Kimi K3's ``type="..."``), else as ``xml_param_value`` reads it."""
    params = (schemas or {}).get(function, {}).get("properties", {})
    schema = params.get(key) if isinstance(params, Mapping) else None
    if declared is not None and not isinstance(schema, Mapping):
        schema = {"type": declared}
    return xml_param_value(value, schema if isinstance(schema, Mapping) else None)


def send_member(
    call: CallStream, first: bool, key: str, value: object, out: list[ParsedEvent]
) -> None:
    """One ``"key": value`` member of arguments written as a JSON object member by member
    (``{`` went out with the start, ``}`` goes out at the close, so the text always parses)."""
    pair = json.dumps(key, ensure_ascii=False) + ": " + json.dumps(value, ensure_ascii=False)
    call.send(pair if first else ", " + pair, out)


def close_object(call: CallStream, out: list[ParsedEvent]) -> None:
    """Close arguments written member by member; the final text is exactly what was sent."""
    call.send("}", out)
    call.end("", out)
