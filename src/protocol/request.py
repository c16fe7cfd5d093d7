"""The internal create-request and the pure parsing of ``input`` into messages.

Invariants:
- ``CreateRequest`` is what the HTTP edge hands to the response actor: fully validated, frozen.
- ``parse_input`` accepts a string or an array of message items and refuses everything else
  with an ``ApiError`` whose ``param`` is the JSON path of the offending value
  (``input[2].content[0].type``), so a client can find its mistake.
- An item without ``type`` that carries a ``role`` is a message (spec 000).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from .errors import invalid_request
from .objects import ResponseConfig

Role = Literal["system", "developer", "user", "assistant"]

ROLES: Final = ("system", "developer", "user", "assistant")
_USER_PART_TYPES: Final = frozenset({"input_text"})
_ASSISTANT_PART_TYPES: Final = frozenset({"output_text", "input_text", "refusal"})


@dataclass(frozen=True, slots=True)
class InputMessage:
    role: Role
    text: str


@dataclass(frozen=True, slots=True)
class CreateRequest:
    config: ResponseConfig
    input: tuple[InputMessage, ...]
    stream: bool


def parse_input(raw: object) -> tuple[InputMessage, ...]:
    """``input`` as a string or an item array -> messages, or a 400 naming the bad path."""
    if isinstance(raw, str):
        if not raw:
            raise invalid_request("Invalid 'input': the string must not be empty.", "input")
        return (InputMessage("user", raw),)
    if not isinstance(raw, list):
        raise invalid_request(
            f"Invalid type for 'input': expected a string or an array of input items, "
            f"but got {json_type(raw)}.",
            "input",
        )
    if not raw:
        raise invalid_request("Invalid 'input': the array must not be empty.", "input")
    return tuple(_parse_item(item, f"input[{i}]") for i, item in enumerate(raw))


def _parse_item(item: object, path: str) -> InputMessage:
    if not isinstance(item, dict):
        raise invalid_request(
            f"Invalid type for '{path}': expected an object, but got {json_type(item)}.", path
        )
    kind = item.get("type", "message" if "role" in item else None)
    if kind is None:
        raise invalid_request(f"Missing required parameter: '{path}.type'.", f"{path}.type")
    if kind != "message":
        raise invalid_request(
            f"Invalid value for '{path}.type': {kind!r} is not supported by this server yet; "
            "supported: 'message'.",
            f"{path}.type",
        )
    role = item.get("role")
    if role is None:
        raise invalid_request(f"Missing required parameter: '{path}.role'.", f"{path}.role")
    if role not in ROLES:
        raise invalid_request(
            f"Invalid value for '{path}.role': {role!r}; supported values are "
            f"{', '.join(repr(r) for r in ROLES)}.",
            f"{path}.role",
        )
    extra = set(item) - {"type", "role", "content", "id", "status"}
    if extra:
        key = sorted(extra)[0]
        raise invalid_request(f"Unknown parameter: '{path}.{key}'.", f"{path}.{key}")
    if "content" not in item:
        raise invalid_request(f"Missing required parameter: '{path}.content'.", f"{path}.content")
    text = _parse_content(item["content"], role, f"{path}.content")
    return InputMessage(role, text)


def _parse_content(content: object, role: str, path: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid_request(
            f"Invalid type for '{path}': expected a string or an array of content parts, "
            f"but got {json_type(content)}.",
            path,
        )
    allowed = _ASSISTANT_PART_TYPES if role == "assistant" else _USER_PART_TYPES
    texts: list[str] = []
    for i, part in enumerate(content):
        part_path = f"{path}[{i}]"
        if not isinstance(part, dict):
            raise invalid_request(
                f"Invalid type for '{part_path}': expected an object, but got {json_type(part)}.",
                part_path,
            )
        kind = part.get("type")
        if kind not in allowed:
            raise invalid_request(
                f"Invalid value for '{part_path}.type': {kind!r} is not supported in a "
                f"{role} message; supported: {', '.join(repr(k) for k in sorted(allowed))}.",
                f"{part_path}.type",
            )
        field = "refusal" if kind == "refusal" else "text"
        value = part.get(field)
        if not isinstance(value, str):
            raise invalid_request(
                f"Invalid type for '{part_path}.{field}': expected a string, but got "
                f"{json_type(value)}.",
                f"{part_path}.{field}",
            )
        texts.append(value)
    return "".join(texts)


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
