"""Conversation bodies and items: validation of what clients send, and the JSON we answer.

Invariants:
- Pure: no I/O, no clock; the only outside input is the id minter (``new_id`` by default), so
  tests can pass a deterministic one.
- Every refusal is an ``ApiError`` 400 whose ``param`` is the JSON path of the offending value
  (``items[2].content[0].type``); a refusal builds nothing, so the caller changes no state.
- Unknown keys are refused, never dropped: a dropped key would be a silent misreading of what
  the client meant. Optional keys may be ``null``.
- A stored item has the shape of the pinned SDK's ``ConversationItem`` (strict, no extra keys):
  a fresh id (``msg_`` for messages, ``fc_`` for function calls and their outputs, as OpenAI
  mints them), ``status: "completed"``, and message content as a list of parts. A string content becomes
  one ``input_text`` part (user, system, developer) or one ``output_text`` part (assistant).
- Ids a client sends with an item are accepted and replaced: one conversation never holds two
  items with the same id, whatever clients replay into it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..errors import ApiError, invalid_request
from ..ids import new_id
from ..objects import output_text_part
from ..records import ConversationRecord, JsonObject
from ..request import json_type
from .images import ImageRef, image_part

__all__ = [
    "MAX_ITEMS_PER_REQUEST",
    "MAX_METADATA_KEY_CHARS",
    "MAX_METADATA_PAIRS",
    "MAX_METADATA_VALUE_CHARS",
    "CreateConversationBody",
    "conversation_object",
    "deleted_object",
    "find_item",
    "item_list",
    "parse_create_body",
    "parse_item",
    "parse_items",
    "parse_items_body",
    "parse_metadata",
    "parse_update_body",
]

MAX_ITEMS_PER_REQUEST: Final = 20
MAX_METADATA_PAIRS: Final = 16
MAX_METADATA_KEY_CHARS: Final = 64
MAX_METADATA_VALUE_CHARS: Final = 512

Mint = Callable[[str], str]

ITEM_TYPES: Final = ("message", "function_call", "function_call_output")
ROLES: Final = ("user", "system", "developer", "assistant")
STATUSES: Final = ("in_progress", "completed", "incomplete")
PHASES: Final = ("commentary", "final_answer")
_INPUT_PART_TYPES: Final = ("input_text",)
_IMAGE_PART_TYPES: Final = ("input_image",)
_ASSISTANT_PART_TYPES: Final = ("output_text", "refusal", "input_text")


@dataclass(frozen=True, slots=True)
class CreateConversationBody:
    metadata: dict[str, str]
    items: tuple[JsonObject, ...]


# --- Bodies -----------------------------------------------------------------------------------


def parse_create_body(data: object, mint: Mint = new_id) -> CreateConversationBody:
    """``POST /v1/conversations``: optional ``items`` (at most 20) and ``metadata``."""
    body = _object(data, None)
    _only_keys(body, ("items", "metadata"), "")
    raw_items = body.get("items")
    items = () if raw_items is None else parse_items(raw_items, mint, allow_empty=True)
    return CreateConversationBody(parse_metadata(body.get("metadata")), items)


def parse_update_body(data: object) -> dict[str, str]:
    """``POST /v1/conversations/{id}``: ``metadata`` (required; ``null`` clears it)."""
    body = _object(data, None)
    _only_keys(body, ("metadata",), "")
    if "metadata" not in body:
        raise _missing("metadata")
    return parse_metadata(body["metadata"])


def parse_items_body(data: object, mint: Mint = new_id) -> tuple[JsonObject, ...]:
    """``POST /v1/conversations/{id}/items``: ``items``, 1 to 20 of them."""
    body = _object(data, None)
    _only_keys(body, ("items",), "")
    if body.get("items") is None:
        raise _missing("items")
    return parse_items(body["items"], mint, allow_empty=False)


def parse_metadata(raw: object, path: str = "metadata") -> dict[str, str]:
    """Up to 16 string pairs, keys up to 64 characters, values up to 512; ``null`` is empty."""
    if raw is None:
        return {}
    pairs = _object(raw, path)
    if len(pairs) > MAX_METADATA_PAIRS:
        raise invalid_request(
            f"Invalid '{path}': at most {MAX_METADATA_PAIRS} pairs, got {len(pairs)}.", path
        )
    for key, value in pairs.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise _too_long(path, f"the key {key[:16]!r}...", MAX_METADATA_KEY_CHARS)
        if not isinstance(value, str):
            raise _wrong_type(f"{path}.{key}", "a string", value)
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise _too_long(f"{path}.{key}", "the value", MAX_METADATA_VALUE_CHARS)
    return dict(pairs)


# --- Items ------------------------------------------------------------------------------------


def parse_items(
    raw: object, mint: Mint = new_id, *, allow_empty: bool, path: str = "items"
) -> tuple[JsonObject, ...]:
    """An array of input items -> stored items, all or nothing."""
    if not isinstance(raw, list):
        raise _wrong_type(path, "an array of items", raw)
    if not raw and not allow_empty:
        raise invalid_request(f"Invalid '{path}': the array must not be empty.", path)
    if len(raw) > MAX_ITEMS_PER_REQUEST:
        raise invalid_request(
            f"Invalid '{path}': at most {MAX_ITEMS_PER_REQUEST} items may be added at a time, "
            f"got {len(raw)}.",
            path,
        )
    return tuple(parse_item(item, f"{path}[{i}]", mint) for i, item in enumerate(raw))


def parse_item(raw: object, path: str, mint: Mint = new_id) -> JsonObject:
    """One input item (message, function_call, function_call_output) -> its stored form."""
    item = _object(raw, path)
    kind = item.get("type")
    if kind is None and "role" in item:
        kind = "message"  # an easy input message may omit ``type``
    if kind is None:
        raise _missing(f"{path}.type")
    if kind not in ITEM_TYPES:
        raise invalid_request(
            f"Invalid value for '{path}.type': {_show(kind)} is not supported by this server; "
            f"supported: {_choices(ITEM_TYPES)}.",
            f"{path}.type",
        )
    _optional_str(item, "id", path)
    _choice(item, "status", STATUSES, path, required=False)
    if kind == "message":
        return _message(item, path, mint)
    if kind == "function_call":
        return _function_call(item, path, mint)
    return _function_call_output(item, path, mint)


def _message(item: Mapping[str, Any], path: str, mint: Mint) -> JsonObject:
    _only_keys(item, ("type", "role", "content", "id", "status", "phase"), path)
    role = str(_choice(item, "role", ROLES, path, required=True))
    phase = _choice(item, "phase", PHASES, path, required=False)
    if phase is not None and role != "assistant":
        raise invalid_request(
            f"Invalid '{path}.phase': only assistant messages carry a phase.", f"{path}.phase"
        )
    if "content" not in item:
        raise _missing(f"{path}.content")
    stored: JsonObject = {
        "id": mint("msg"),
        "type": "message",
        "role": role,
        "status": "completed",
        "content": _content(item["content"], role, f"{path}.content"),
    }
    if phase is not None:
        stored["phase"] = phase
    return stored


def _content(raw: object, role: str, path: str) -> list[JsonObject]:
    if isinstance(raw, str):
        if role == "assistant":
            return [output_text_part(raw)]
        return [{"type": "input_text", "text": raw}]
    if not isinstance(raw, list):
        raise _wrong_type(path, "a string or an array of content parts", raw)
    allowed = _ASSISTANT_PART_TYPES if role == "assistant" else _INPUT_PART_TYPES
    return _parts(raw, allowed, role, path)


def _parts(raw: list[Any], allowed: Sequence[str], role: str, path: str) -> list[JsonObject]:
    """Content parts -> their stored form. An image the HTTP edge accepted reaches here as an
    ``ImageRef`` in place of its part (``images.py``: no client JSON holds one) and is stored
    as its ``input_image`` part, as a response's input is."""
    out: list[JsonObject] = []
    for i, raw_part in enumerate(raw):
        if isinstance(raw_part, ImageRef) and role != "assistant":
            out.append(image_part(raw_part))
        else:
            out.append(_part(raw_part, allowed, role, f"{path}[{i}]"))
    return out


def _part(raw: object, allowed: Sequence[str], role: str, path: str) -> JsonObject:
    part = _object(raw, path)
    kind = part.get("type")
    if kind is None:
        raise _missing(f"{path}.type")
    if kind in _IMAGE_PART_TYPES and role != "assistant":
        # On a vision model the edge took each image already (an ``ImageRef``, ``images.py``).
        raise invalid_request(
            f"Invalid value for '{path}.type': {_show(kind)}: the served model is text-only "
            "and has no image, file or audio input.",
            f"{path}.type",
        )
    if kind not in allowed:
        raise invalid_request(
            f"Invalid value for '{path}.type': {_show(kind)} is not supported in a {role} "
            f"message by this server; supported: {_choices(allowed)}.",
            f"{path}.type",
        )
    if kind == "refusal":
        _only_keys(part, ("type", "refusal"), path)
        return {"type": "refusal", "refusal": _str(part, "refusal", path)}
    if kind == "input_text":
        _only_keys(part, ("type", "text"), path)
        return {"type": "input_text", "text": _str(part, "text", path)}
    _only_keys(part, ("type", "text", "annotations", "logprobs"), path)
    text = _str(part, "text", path)
    annotations = part.get("annotations")
    if annotations is not None and not isinstance(annotations, list):
        raise _wrong_type(f"{path}.annotations", "an array", annotations)
    if annotations:
        raise invalid_request(
            f"Invalid '{path}.annotations': annotations are not supported by this server; "
            "send an empty array.",
            f"{path}.annotations",
        )
    logprobs = part.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, list):
        raise _wrong_type(f"{path}.logprobs", "an array", logprobs)
    return output_text_part(text)  # logprobs are not kept (OpenAI returns them on request only)


def _function_call(item: Mapping[str, Any], path: str, mint: Mint) -> JsonObject:
    _only_keys(item, ("type", "id", "status", "call_id", "name", "arguments", "namespace"), path)
    stored: JsonObject = {
        "id": mint("fc"),
        "type": "function_call",
        "call_id": _nonempty_str(item, "call_id", path),
        "name": _nonempty_str(item, "name", path),
        "arguments": _str(item, "arguments", path),
        "status": "completed",
    }
    namespace = _optional_str(item, "namespace", path)
    if namespace is not None:
        stored["namespace"] = namespace
    return stored


def _function_call_output(item: Mapping[str, Any], path: str, mint: Mint) -> JsonObject:
    _only_keys(item, ("type", "id", "status", "call_id", "output", "name", "namespace"), path)
    if "output" not in item:
        raise _missing(f"{path}.output")
    output = item["output"]
    if isinstance(output, list):
        output = _parts(output, _INPUT_PART_TYPES, "function_call_output", f"{path}.output")
    elif not isinstance(output, str):
        raise _wrong_type(f"{path}.output", "a string or an array of content parts", output)
    stored: JsonObject = {
        "id": mint("fc"),
        "type": "function_call_output",
        "call_id": _nonempty_str(item, "call_id", path),
        "output": output,
        "status": "completed",
    }
    for key in ("name", "namespace"):
        value = _optional_str(item, key, path)
        if value is not None:
            stored[key] = value
    return stored


# --- Answers ----------------------------------------------------------------------------------


def conversation_object(record: ConversationRecord) -> JsonObject:
    """The SDK's ``Conversation``."""
    return {
        "id": record.id,
        "object": "conversation",
        "created_at": record.created_at,
        "metadata": dict(record.metadata),
    }


def deleted_object(conversation_id: str) -> JsonObject:
    """The SDK's ``ConversationDeletedResource``."""
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


def item_list(items: Sequence[JsonObject], *, has_more: bool) -> JsonObject:
    """The SDK's ``ConversationItemList``; ``first_id``/``last_id`` are ``""`` when empty (the
    SDK types them as strings; OpenAI's schema allows null)."""
    return {
        "object": "list",
        "data": list(items),
        "first_id": items[0]["id"] if items else "",
        "last_id": items[-1]["id"] if items else "",
        "has_more": has_more,
    }


def find_item(record: ConversationRecord, item_id: str) -> JsonObject | None:
    return next((item for item in record.items if item.get("id") == item_id), None)


# --- Checks -----------------------------------------------------------------------------------


def _object(raw: object, path: str | None) -> dict[str, Any]:
    if not isinstance(raw, dict):
        if path is None:
            raise invalid_request(
                f"Invalid request body: expected a JSON object, but got {json_type(raw)}.", None
            )
        raise _wrong_type(path, "an object", raw)
    return raw


def _only_keys(obj: Mapping[str, Any], allowed: Sequence[str], path: str) -> None:
    unknown = sorted(key for key in obj if key not in allowed)
    if unknown:
        param = f"{path}.{unknown[0]}" if path else unknown[0]
        raise invalid_request(f"Unknown parameter: '{param}'.", param)


def _str(obj: Mapping[str, Any], key: str, path: str) -> str:
    if key not in obj or obj[key] is None:
        raise _missing(f"{path}.{key}")
    value = obj[key]
    if not isinstance(value, str):
        raise _wrong_type(f"{path}.{key}", "a string", value)
    return value


def _nonempty_str(obj: Mapping[str, Any], key: str, path: str) -> str:
    value = _str(obj, key, path)
    if not value:
        raise invalid_request(f"Invalid '{path}.{key}': must not be empty.", f"{path}.{key}")
    return value


def _optional_str(obj: Mapping[str, Any], key: str, path: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise _wrong_type(f"{path}.{key}", "a string", value)
    return value


def _choice(
    obj: Mapping[str, Any], key: str, choices: Sequence[str], path: str, *, required: bool
) -> str | None:
    value = obj.get(key)
    if value is None and required:
        raise _missing(f"{path}.{key}")
    if value is not None and value not in choices:
        raise invalid_request(
            f"Invalid value for '{path}.{key}': {_show(value)}; supported values are "
            f"{_choices(choices)}.",
            f"{path}.{key}",
        )
    return value


def _missing(param: str) -> ApiError:
    return invalid_request(f"Missing required parameter: '{param}'.", param)


def _too_long(param: str, what: str, limit: int) -> ApiError:
    return invalid_request(f"Invalid '{param}': {what} is longer than {limit} characters.", param)


def _wrong_type(param: str, expected: str, value: object) -> ApiError:
    return invalid_request(
        f"Invalid type for '{param}': expected {expected}, but got {json_type(value)}.", param
    )


def _show(value: object) -> str:
    return repr(value) if isinstance(value, str | int | float | bool) else json_type(value)


def _choices(choices: Sequence[str]) -> str:
    return ", ".join(repr(choice) for choice in choices)
