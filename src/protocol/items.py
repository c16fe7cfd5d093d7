"""Input items: the internal frozen types, strict parsing of a request's ``input`` array, and the
JSON shapes we store and list (``input_items``, conversation items).

Invariants:
- ``parse_item`` accepts every item type a client replays (messages with or without ``type``,
  ``function_call``, ``function_call_output``, ``reasoning``) and refuses anything else with an
  ``ApiError`` whose ``param`` is the JSON path (``input[2].content[0].type``).
- ``item_json`` and ``read_item`` round-trip: ``read_item(item_json(x, id)) == x``, so a stored
  history replays exactly the items the original turn rendered; a previous ``output`` sent back
  verbatim as input parses to the same items the response produced.
- ``input_image`` / ``input_file`` parts from a client are refused with a clear 400 (the model is
  text-only). On a vision model the HTTP edge turned each accepted image into a marker in the
  text first (``images.py``); ``item_json`` lists it as an ``input_image`` part again, and
  ``read_item`` (stored items, never a client's) reads such a part back into the marker.
- A ``compaction`` item (issue 6) carries its summary and retained items in ``encrypted_content``
  (base64url JSON, see ``compaction.py``); a malformed one is a 400 naming the problem, and its
  retained items never hold another compaction item.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Final

from .errors import ApiError, invalid_request
from .fields import json_type as json_type  # re-exported: importers of items find it here
from .fields import optional_str as optional_str
from .fields import require_str
from .ids import new_id
from .images import ImageRef, has_images, image_parts, marker
from .item_types import (
    PHASES,
    ROLES,
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    InputMessage,
    JsonObject,
    Phase,
    Reasoning,
    Role,
    TurnItem,
)
from .objects import (
    custom_tool_call_item,
    tool_search_call_item,
    tool_search_output_item,
)
from .search_items import parse_search_call, parse_search_output

# The item types live in item_types.py; they stay importable from here.
__all__ = [
    "CLIENT_PASSTHROUGH_KEY",
    "COMPACTION_FORMAT_VERSION",
    "PHASES",
    "ROLES",
    "Compaction",
    "FunctionCall",
    "FunctionCallOutput",
    "InputItem",
    "InputMessage",
    "JsonObject",
    "Phase",
    "Reasoning",
    "Role",
    "TurnItem",
    "decode_compaction",
    "encode_compaction",
    "item_json",
    "json_type",
    "optional_str",
    "parse_item",
    "read_item",
]

_MEDIA_PARTS: Final = frozenset({"input_image", "input_file", "input_audio"})
# Codex CLI (0.171.0, built-in provider) sends its own metadata on every message; OpenAI
# accepts it (decision 3). It never reaches the model and is not echoed.
CLIENT_PASSTHROUGH_KEY: Final = "internal_chat_message_metadata_passthrough"
_MESSAGE_KEYS: Final = frozenset(
    {"type", "role", "content", "id", "status", "phase", CLIENT_PASSTHROUGH_KEY}
)


def parse_item(item: object, path: str, *, stored: bool = False) -> InputItem:
    """One element of a request's ``input`` array, strictly; ``stored``: an item this server
    wrote (``item_json``), whose ``input_image`` parts are images it accepted before."""
    if not isinstance(item, dict):
        raise invalid_request(
            f"Invalid type for '{path}': expected an object, but got {json_type(item)}.", path
        )
    kind = item.get("type", "message" if "role" in item else None)
    match kind:
        case "message":
            return _parse_message(item, path, stored)
        case "function_call":
            arguments = require_str(item, "arguments", path)
            _check_arguments(arguments, f"{path}.arguments")
            namespace = optional_str(item, "namespace", path)
            return FunctionCall(
                require_str(item, "call_id", path),
                require_str(item, "name", path),
                arguments,
                namespace or None,
            )
        case "custom_tool_call":
            namespace = optional_str(item, "namespace", path)
            return FunctionCall(
                require_str(item, "call_id", path),
                require_str(item, "name", path),
                require_str(item, "input", path),
                namespace or None,
                custom=True,
            )
        case "tool_search_call":
            return parse_search_call(item, path)
        case "tool_search_output":
            return parse_search_output(item, path)
        case "function_call_output" | "custom_tool_call_output":
            output = item.get("output")
            if isinstance(output, list):
                output = _text_of_parts(output, "function_call_output", f"{path}.output", stored)
            elif not isinstance(output, str):
                raise invalid_request(
                    f"Invalid type for '{path}.output': expected a string or an array of "
                    f"content parts, but got {json_type(output)}.",
                    f"{path}.output",
                )
            return FunctionCallOutput(
                require_str(item, "call_id", path), output, kind == "custom_tool_call_output"
            )
        case "reasoning":
            encrypted = item.get("encrypted_content")
            if encrypted is not None and not isinstance(encrypted, str):
                raise invalid_request(
                    f"Invalid type for '{path}.encrypted_content': expected a string, but got "
                    f"{json_type(encrypted)}.",
                    f"{path}.encrypted_content",
                )
            return Reasoning(_reasoning_text(item, path), encrypted or None)
        case "compaction":
            return _parse_compaction(item, path)
        case None:
            raise invalid_request(f"Missing required parameter: '{path}.type'.", f"{path}.type")
    raise invalid_request(
        f"Invalid value for '{path}.type': {kind!r} is not supported; supported: 'message', "
        "'function_call', 'function_call_output', 'custom_tool_call', "
        "'custom_tool_call_output', 'tool_search_call', 'tool_search_output', 'reasoning', "
        "'compaction'.",
        f"{path}.type",
    )


_COMPACTION_KEYS: Final = frozenset({"type", "id", "encrypted_content", "created_by"})


def _parse_compaction(item: JsonObject, path: str) -> Compaction:
    extra = set(item) - _COMPACTION_KEYS
    if extra:
        key = sorted(extra)[0]
        raise invalid_request(f"Unknown parameter: '{path}.{key}'.", f"{path}.{key}")
    return decode_compaction(require_str(item, "encrypted_content", path), path)


def _check_arguments(arguments: str, path: str) -> None:
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise invalid_request(f"Invalid value for '{path}': expected a JSON object as text.", path)


def _reasoning_text(item: JsonObject, path: str) -> str:
    for key in ("content", "summary"):
        parts = item.get(key)
        if parts is None:
            continue  # Codex sends content: null with an encrypted_content
        if not isinstance(parts, list):
            raise invalid_request(
                f"Invalid type for '{path}.{key}': expected an array, but got {json_type(parts)}.",
                f"{path}.{key}",
            )
        text = _text_of_parts(parts, "reasoning", f"{path}.{key}")
        if text:
            return text
    return ""


def _parse_message(item: JsonObject, path: str, stored: bool = False) -> InputMessage:
    role = item.get("role")
    if role is None:
        raise invalid_request(f"Missing required parameter: '{path}.role'.", f"{path}.role")
    if role not in ROLES:
        raise invalid_request(
            f"Invalid value for '{path}.role': {role!r}; supported values are "
            f"{', '.join(repr(r) for r in ROLES)}.",
            f"{path}.role",
        )
    extra = set(item) - _MESSAGE_KEYS
    if extra:
        key = sorted(extra)[0]
        raise invalid_request(f"Unknown parameter: '{path}.{key}'.", f"{path}.{key}")
    if "content" not in item:
        raise invalid_request(f"Missing required parameter: '{path}.content'.", f"{path}.content")
    phase = item.get("phase")
    if phase is not None and phase not in PHASES:
        raise invalid_request(
            f"Invalid value for '{path}.phase': {phase!r}; supported values are "
            f"{', '.join(repr(p) for p in PHASES)}.",
            f"{path}.phase",
        )
    content = item["content"]
    if isinstance(content, str):
        return InputMessage(role, content, phase)
    if not isinstance(content, list):
        raise invalid_request(
            f"Invalid type for '{path}.content': expected a string or an array of content "
            f"parts, but got {json_type(content)}.",
            f"{path}.content",
        )
    return InputMessage(role, _text_of_parts(content, role, f"{path}.content", stored), phase)


_ALLOWED_PARTS: Final[dict[str, frozenset[str]]] = {
    "assistant": frozenset({"output_text", "input_text", "refusal"}),
    "reasoning": frozenset({"reasoning_text", "summary_text"}),
    "function_call_output": frozenset({"input_text", "output_text"}),
}
_DEFAULT_PARTS: Final = frozenset({"input_text"})


def _text_of_parts(parts: list[Any], owner: str, path: str, stored: bool = False) -> str:
    allowed = _ALLOWED_PARTS.get(owner, _DEFAULT_PARTS)
    texts: list[str] = []
    for i, part in enumerate(parts):
        part_path = f"{path}[{i}]"
        if not isinstance(part, dict):
            raise invalid_request(
                f"Invalid type for '{part_path}': expected an object, but got {json_type(part)}.",
                part_path,
            )
        kind = part.get("type")
        if stored and kind == "input_image" and owner != "assistant":
            url, detail = part.get("image_url"), part.get("detail")
            if isinstance(url, str) and url.startswith("data:"):
                texts.append(marker(ImageRef(url, detail if isinstance(detail, str) else "auto")))
                continue
        if kind in _MEDIA_PARTS:
            raise invalid_request(
                f"Invalid value for '{part_path}.type': {kind!r} is not supported: the served "
                "model is text-only and has no image, file or audio input.",
                f"{part_path}.type",
            )
        if kind not in allowed:
            raise invalid_request(
                f"Invalid value for '{part_path}.type': {kind!r} is not supported in a "
                f"{owner} item; supported: {', '.join(repr(k) for k in sorted(allowed))}.",
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


def item_json(item: InputItem, item_id: str | None = None) -> JsonObject:
    """The stored / listed JSON shape of an input item, with its id."""
    match item:
        case InputMessage(role, text, phase):
            part_type = "output_text" if role == "assistant" else "input_text"
            part: JsonObject = {"type": part_type, "text": text}
            if part_type == "output_text":
                part["annotations"] = []
            message: JsonObject = {
                "id": item_id or new_id("msg"),
                "type": "message",
                "role": role,
                "status": "completed",
                # An image (a marker in the text) is listed as its input_image part.
                "content": image_parts(text, part_type) if has_images(text) else [part],
            }
            if phase is not None:
                message["phase"] = phase
            return message
        case FunctionCall(call_id, name, arguments, search=str(execution)):
            return tool_search_call_item(
                item_id or new_id("tsc"),
                call_id=call_id,
                execution="client" if execution == "client" else "server",
                arguments=arguments,
                status="completed",
            )
        case FunctionCallOutput(call_id, search=str(execution), search_tools=str(tools)):
            return tool_search_output_item(
                item_id or new_id("tso"),
                call_id=call_id,
                execution="client" if execution == "client" else "server",
                tools=json.loads(tools),
            )
        case FunctionCall(call_id, name, arguments, namespace, custom=True):
            return custom_tool_call_item(
                item_id or new_id("ctc"),
                call_id=call_id,
                name=name,
                text=arguments,
                namespace=namespace,
            )
        case FunctionCall(call_id, name, arguments, namespace):
            call: JsonObject = {
                "id": item_id or new_id("fc"),
                "type": "function_call",
                "call_id": call_id,
                "name": name,
                "arguments": arguments,
                "status": "completed",
            }
            if namespace is not None:
                call["namespace"] = namespace
            return call
        case FunctionCallOutput(call_id, output, custom=True):
            return {
                "id": item_id or new_id("ctco"),
                "type": "custom_tool_call_output",
                "call_id": call_id,
                "output": image_parts(output, "input_text") if has_images(output) else output,
            }
        case FunctionCallOutput(call_id, output):
            return {
                "id": item_id or new_id("fco"),
                "type": "function_call_output",
                "call_id": call_id,
                # An image the tool returned (Codex's view_image) is listed as its part.
                "output": image_parts(output, "input_text") if has_images(output) else output,
                "status": "completed",
            }
        case Reasoning(text, encrypted):
            reasoning: JsonObject = {
                "id": item_id or new_id("rs"),
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": text}] if text else None,
            }
            if encrypted is not None:
                reasoning["encrypted_content"] = encrypted
            return reasoning
        case Compaction():
            return {
                "id": item_id or new_id("cmp"),
                "type": "compaction",
                "encrypted_content": encode_compaction(item),
            }


def read_item(item: JsonObject) -> InputItem | None:
    """A stored or returned item back as an input item; None for types that do not render."""
    try:
        return parse_item(item, "item", stored=True)
    except ApiError:
        return None


COMPACTION_FORMAT_VERSION: Final = 1


# --- the compaction item's encrypted_content (base64url JSON; spec 000) --------------------------------------------------------------------


def encode_compaction(compaction: Compaction) -> str:
    items = []
    for item in compaction.retained:
        shaped = item_json(item, "-")
        del shaped["id"]  # ids are minted again on output; the content needs none
        items.append(shaped)
    payload = {"v": COMPACTION_FORMAT_VERSION, "summary": compaction.summary, "items": items}
    raw = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _malformed(path: str, why: str) -> ApiError:
    param = f"{path}.encrypted_content"
    return invalid_request(f"Invalid value for '{param}': {why}.", param)


def decode_compaction(text: str, path: str) -> Compaction:
    """The ``encrypted_content`` of the compaction item at ``path``; raises a 400."""
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise _malformed(path, "not base64url text from a compaction item") from None
    try:
        payload = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _malformed(path, "the decoded content is not JSON") from None
    if not isinstance(payload, dict):
        raise _malformed(path, f"the decoded content is {json_type(payload)}, not an object")
    if set(payload) != {"v", "summary", "items"}:
        keys = ", ".join(sorted(map(repr, payload)))
        raise _malformed(path, f"expected the keys 'v', 'summary', 'items', found {keys}")
    if payload["v"] != COMPACTION_FORMAT_VERSION:
        raise _malformed(path, f"unsupported version {payload['v']!r} (expected 1)")
    summary, items = payload["summary"], payload["items"]
    if not isinstance(summary, str):
        raise _malformed(path, f"'summary' is {json_type(summary)}, not a string")
    if not isinstance(items, list):
        raise _malformed(path, f"'items' is {json_type(items)}, not an array")
    retained: list[TurnItem] = []
    for index, raw_item in enumerate(items):
        item = parse_item(raw_item, f"{path}.encrypted_content.items[{index}]")
        if isinstance(item, Compaction):
            raise _malformed(path, f"retained item {index} is itself a compaction item")
        retained.append(item)
    return Compaction(summary, tuple(retained))
