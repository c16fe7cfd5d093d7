"""Input items read: strict parsing of a request's ``input`` array and of the items we stored
(pure). The types live in ``values.py`` (re-exported here); ``write.py`` writes them.

Invariants:
- One reader for every item a client replays (messages with or without ``type``,
  ``function_call``, ``function_call_output``, their custom-tool forms, ``tool_search_call`` /
  ``tool_search_output``, ``reasoning``, ``compaction``, and the hosted tools' items, read in
  ``hosted_read.py``) and for the fields they hold:
  ``parse_item`` refuses anything else with an ``ApiError`` whose ``param`` is the JSON path
  (``input[2].content[0].type``); a field check never guesses a value of another type.
- ``read_item(item_json(x, id)) == x``, so a stored history replays exactly the items the
  original turn rendered; a previous ``output`` sent back verbatim as input parses to the same
  items the response produced.
- ``input_image`` / ``input_file`` parts from a client are refused with a clear 400 (the model is
  text-only). On a vision model the HTTP edge put an ``ImageRef`` in place of each image part
  it accepted (``images.py``), which becomes a typed part of the item's content; ``item_json``
  lists it as an ``input_image`` part again, and ``read_item`` (stored items, never a
  client's) reads such a part back into the same ``ImageRef``.
- A tool search item: unknown keys and an ``execution`` other than ``server`` / ``client`` are a
  400 naming the path; a null ``call_id`` (a server search's) reads as ``""``; a
  ``tool_search_call`` becomes a ``FunctionCall`` named ``tool_search`` with its arguments as
  JSON text, a ``tool_search_output`` a ``FunctionCallOutput`` whose text names the loaded tools.
- A ``compaction`` item carries its summary and retained items in ``encrypted_content``
  (base64url JSON, see ``compaction.py``); a malformed one is a 400 naming the problem, and its
  retained items never hold another compaction item.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any, Final

from ..errors import ApiError, invalid_request
from ..objects import Execution
from ..tools.spec import qualified_name
from .fields import json_type, optional_str, require_str
from .hosted_read import HOSTED_TYPES, parse_hosted
from .images import DETAILS, Content, ImageRef, Piece, content_of
from .values import (
    COMPACTION_FORMAT_VERSION,
    PHASES,
    ROLES,
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    HostedItem,
    InputItem,
    InputMessage,
    JsonObject,
    McpApprovalRequest,
    McpApprovalResponse,
    McpCall,
    McpListTools,
    Phase,
    Reasoning,
    Role,
    SearchAction,
    TurnItem,
    WebSearchCall,
)

# The item types live in values.py, the field checks in fields.py; importable from here.
__all__ = [
    "CLIENT_PASSTHROUGH_KEY",
    "COMPACTION_FORMAT_VERSION",
    "PHASES",
    "ROLES",
    "Compaction",
    "FunctionCall",
    "FunctionCallOutput",
    "HostedItem",
    "InputItem",
    "InputMessage",
    "JsonObject",
    "McpApprovalRequest",
    "McpApprovalResponse",
    "McpCall",
    "McpListTools",
    "Phase",
    "Reasoning",
    "Role",
    "SearchAction",
    "TurnItem",
    "WebSearchCall",
    "decode_compaction",
    "json_type",
    "optional_str",
    "parse_item",
    "read_item",
    "require_str",
]

_MEDIA_PARTS: Final = frozenset({"input_image", "input_file", "input_audio"})
# Codex CLI (0.171.0, built-in provider) sends its own metadata on every message; OpenAI
# accepts it, so refusing it would break Codex. It never reaches the model and is not echoed.
CLIENT_PASSTHROUGH_KEY: Final = "internal_chat_message_metadata_passthrough"
_MESSAGE_KEYS: Final = frozenset(
    {"type", "role", "content", "id", "status", "phase", CLIENT_PASSTHROUGH_KEY}
)


def parse_item(
    item: object, path: str, *, stored: bool = False, model_texts: bool = False
) -> InputItem:
    """One element of a request's ``input`` array, strictly; ``stored``: an item this server
    wrote (``item_json``), whose ``input_image`` parts are images it accepted before;
    ``model_texts``: a ``web_search_call`` may carry the private ``_model_text``
    (``hosted_read``: the server's own items only)."""
    if not isinstance(item, dict):
        raise invalid_request(
            f"Invalid type for '{path}': expected an object, but got {json_type(item)}.", path
        )
    kind = item.get("type", "message" if "role" in item else None)
    match kind:
        case "message":
            return _parse_message(item, path, stored)
        case "function_call" | "custom_tool_call":
            return _parse_call(item, path, custom=kind == "custom_tool_call")
        case "tool_search_call":
            return _parse_search_call(item, path)
        case "tool_search_output":
            return _parse_search_output(item, path)
        case "function_call_output" | "custom_tool_call_output":
            return _parse_output(item, path, stored, custom=kind == "custom_tool_call_output")
        case "reasoning":
            return _parse_reasoning(item, path)
        case "compaction":
            return _parse_compaction(item, path)
        case str() if kind in HOSTED_TYPES:
            return parse_hosted(item, path, model_texts=model_texts)
        case None:
            raise invalid_request(f"Missing required parameter: '{path}.type'.", f"{path}.type")
    raise invalid_request(
        f"Invalid value for '{path}.type': {kind!r} is not supported; supported: 'message', "
        "'function_call', 'function_call_output', 'custom_tool_call', "
        "'custom_tool_call_output', 'tool_search_call', 'tool_search_output', 'reasoning', "
        "'compaction', 'web_search_call', 'mcp_list_tools', 'mcp_call', 'mcp_approval_request', "
        "'mcp_approval_response'.",
        f"{path}.type",
    )


def _parse_call(item: JsonObject, path: str, *, custom: bool) -> FunctionCall:
    """A ``function_call`` (its arguments a JSON object as text) or a ``custom_tool_call``
    (its freeform ``input``)."""
    if custom:
        namespace = optional_str(item, "namespace", path)
        call_id, name = require_str(item, "call_id", path), require_str(item, "name", path)
        arguments = require_str(item, "input", path)
    else:
        arguments = require_str(item, "arguments", path)
        _check_arguments(arguments, f"{path}.arguments")
        namespace = optional_str(item, "namespace", path)
        call_id, name = require_str(item, "call_id", path), require_str(item, "name", path)
    return FunctionCall(call_id, name, arguments, namespace or None, custom=custom)


def _parse_output(item: JsonObject, path: str, stored: bool, *, custom: bool) -> FunctionCallOutput:
    output = item.get("output")
    if isinstance(output, list):
        content = _content_of_parts(output, "function_call_output", f"{path}.output", stored)
    elif isinstance(output, str):
        content = output
    else:
        raise invalid_request(
            f"Invalid type for '{path}.output': expected a string or an array of "
            f"content parts, but got {json_type(output)}.",
            f"{path}.output",
        )
    return FunctionCallOutput(require_str(item, "call_id", path), content, custom)


def _parse_reasoning(item: JsonObject, path: str) -> Reasoning:
    encrypted = item.get("encrypted_content")
    if encrypted is not None and not isinstance(encrypted, str):
        raise invalid_request(
            f"Invalid type for '{path}.encrypted_content': expected a string, but got "
            f"{json_type(encrypted)}.",
            f"{path}.encrypted_content",
        )
    return Reasoning(_reasoning_text(item, path), encrypted or None)


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
        content = _content_of_parts(parts, "reasoning", f"{path}.{key}")
        text = content if isinstance(content, str) else ""  # no images: never a tuple
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
    return InputMessage(role, _content_of_parts(content, role, f"{path}.content", stored), phase)


_ALLOWED_PARTS: Final[dict[str, frozenset[str]]] = {
    "assistant": frozenset({"output_text", "input_text", "refusal"}),
    "reasoning": frozenset({"reasoning_text", "summary_text"}),
    "function_call_output": frozenset({"input_text", "output_text"}),
}
_DEFAULT_PARTS: Final = frozenset({"input_text"})


# Who may hold images: what the HTTP edge accepts them in (never an assistant's content).
_IMAGE_OWNERS: Final = frozenset({"user", "system", "developer", "function_call_output"})


def _content_of_parts(parts: list[Any], owner: str, path: str, stored: bool = False) -> Content:
    """Content parts as ``Content``: their text runs, and the images the edge accepted
    (``ImageRef`` values, which no client JSON holds) or, ``stored``, this server wrote."""
    allowed = _ALLOWED_PARTS.get(owner, _DEFAULT_PARTS)
    pieces: list[Piece] = []
    for i, part in enumerate(parts):
        part_path = f"{path}[{i}]"
        image = part if isinstance(part, ImageRef) else None
        if image is None and stored and isinstance(part, dict):
            image = _stored_image(part)
        if image is not None and owner in _IMAGE_OWNERS:
            pieces.append(image)
        elif not isinstance(part, dict):
            raise invalid_request(
                f"Invalid type for '{part_path}': expected an object, but got {json_type(part)}.",
                part_path,
            )
        else:
            pieces.append(_text_part(part, allowed, owner, part_path))
    return content_of(pieces)


def _stored_image(part: Mapping[str, Any]) -> ImageRef | None:
    """The image a stored ``input_image`` part (``image_part``) holds; None when the part is no
    such part (a client's, which never reaches here unchecked, holds no ``data:`` URL then)."""
    url, detail = part.get("image_url"), part.get("detail")
    if part.get("type") != "input_image" or not isinstance(url, str):
        return None
    if not url.startswith("data:"):
        return None
    return ImageRef(url, detail if detail in DETAILS else "auto")


def _text_part(part: JsonObject, allowed: frozenset[str], owner: str, path: str) -> str:
    kind = part.get("type")
    if kind in _MEDIA_PARTS:
        raise invalid_request(
            f"Invalid value for '{path}.type': {kind!r} is not supported: the served "
            "model is text-only and has no image, file or audio input.",
            f"{path}.type",
        )
    if kind not in allowed:
        raise invalid_request(
            f"Invalid value for '{path}.type': {kind!r} is not supported in a "
            f"{owner} item; supported: {', '.join(repr(k) for k in sorted(allowed))}.",
            f"{path}.type",
        )
    field = "refusal" if kind == "refusal" else "text"
    value = part.get(field)
    if not isinstance(value, str):
        raise invalid_request(
            f"Invalid type for '{path}.{field}': expected a string, but got {json_type(value)}.",
            f"{path}.{field}",
        )
    return value


# --- tool search items ------------------------------------------------------------------

_SEARCH_CALL_KEYS: Final = frozenset(
    {"type", "id", "call_id", "execution", "status", "arguments", "created_by"}
)
_SEARCH_OUTPUT_KEYS: Final = frozenset(
    {"type", "id", "call_id", "execution", "status", "tools", "created_by"}
)


def _search_common(item: JsonObject, path: str, keys: frozenset[str]) -> tuple[str, Execution]:
    """A tool search item's ``call_id`` ("" when null, as a server search's may be) and
    ``execution`` (default ``server``)."""
    extra = set(item) - keys
    if extra:
        key = sorted(extra)[0]
        raise invalid_request(f"Unknown parameter: '{path}.{key}'.", f"{path}.{key}")
    call_id = optional_str(item, "call_id", path) or ""
    execution = item.get("execution") or "server"
    if execution not in ("server", "client"):
        raise invalid_request(
            f"Invalid value for '{path}.execution': {execution!r}; expected 'server' or 'client'.",
            f"{path}.execution",
        )
    return call_id, "client" if execution == "client" else "server"


def _parse_search_call(item: JsonObject, path: str) -> FunctionCall:
    call_id, execution = _search_common(item, path, _SEARCH_CALL_KEYS)
    if "arguments" not in item:
        raise invalid_request(
            f"Missing required parameter: '{path}.arguments'.", f"{path}.arguments"
        )
    arguments = item["arguments"]
    if not isinstance(arguments, dict):
        raise invalid_request(
            f"Invalid type for '{path}.arguments': expected an object, but got "
            f"{json_type(arguments)}.",
            f"{path}.arguments",
        )
    text = json.dumps(arguments, ensure_ascii=False)
    return FunctionCall(call_id, "tool_search", text, search=execution)


def _parse_search_output(item: JsonObject, path: str) -> FunctionCallOutput:
    call_id, execution = _search_common(item, path, _SEARCH_OUTPUT_KEYS)
    tools = item.get("tools")
    if not isinstance(tools, list):
        raise invalid_request(
            f"Invalid type for '{path}.tools': expected an array of tools, but got "
            f"{json_type(tools)}.",
            f"{path}.tools",
        )
    names = _loaded_names(tools)
    summary = "Tools loaded: " + (", ".join(names) if names else "none") + "."
    return FunctionCallOutput(
        call_id,
        summary,
        search=execution,
        search_tools=json.dumps(tools, ensure_ascii=False),
    )


def _loaded_names(tools: list[Any]) -> list[str]:
    """The names the model calls the loaded tools by (a namespace's functions qualified)."""
    names: list[str] = []
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        inner = tool.get("tools") if tool.get("type") == "namespace" else None
        if isinstance(inner, list):
            namespace = str(tool.get("name", ""))
            names += [
                qualified_name(namespace, str(t.get("name"))) for t in inner if isinstance(t, dict)
            ]
        elif isinstance(tool.get("name"), str):
            names.append(tool["name"])
    return names


def read_item(item: JsonObject) -> InputItem | None:
    """A stored or returned item (or a response's own output, for its continuation) back as an
    input item; None for types we do not read."""
    try:
        return parse_item(item, "item", stored=True, model_texts=True)
    except ApiError:
        return None


# --- the compaction item's encrypted_content (base64url JSON) ----------------------------------


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
        # Its images read back as typed parts, as a stored item's do: this server wrote them,
        # and one forged there is still decoded and checked when the prompt renders.
        item = parse_item(raw_item, f"{path}.encrypted_content.items[{index}]", stored=True)
        if isinstance(item, Compaction):
            raise _malformed(path, f"retained item {index} is itself a compaction item")
        retained.append(item)
    return Compaction(summary, tuple(retained))
