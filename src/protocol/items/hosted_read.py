"""The hosted tools' items read strictly: ``web_search_call``, ``mcp_list_tools``, ``mcp_call``,
``mcp_approval_request`` and ``mcp_approval_response`` (pure; ``read.parse_item`` dispatches
here).

Invariants:
- Keys and types are the pinned SDK's input shapes (``response_input_item_param``): an unknown
  key, a missing required field, a wrong type or a value outside a closed set is a 400 whose
  ``param`` is the JSON path (``input[3].action.query``). Required ids are required: a
  ``web_search_call``'s and an ``mcp_call``'s id is the call_id they render under, an
  ``mcp_approval_request``'s is what an approval names.
- ``read_item(item_json(x, id)) == x`` for every hosted item (``write.py``): the ``tools`` of
  an ``mcp_list_tools`` and the ``error`` of an ``mcp_call`` are kept as JSON text, as sent.
- ``MODEL_TEXT_KEY`` (what the model read as a search's result, which a response puts on its
  own ``web_search_call`` for its continuation with ``with_model_texts``) is read only with
  ``model_texts`` (``read.read_item``: the server's own items); anywhere else, a client's
  input or a compaction item's content among them, it is an unknown key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..errors import invalid_request
from .fields import only_keys, optional_str, require_str, wrong_type
from .values import (
    MCP_CALL_STATUSES,
    SEARCH_ACTIONS,
    WEB_SEARCH_STATUSES,
    HostedItem,
    JsonObject,
    McpApprovalRequest,
    McpApprovalResponse,
    McpCall,
    McpCallStatus,
    McpListTools,
    SearchAction,
    SearchActionType,
    WebSearchCall,
    WebSearchStatus,
)

HOSTED_TYPES: Final = (
    "web_search_call",
    "mcp_list_tools",
    "mcp_call",
    "mcp_approval_request",
    "mcp_approval_response",
)
MODEL_TEXT_KEY: Final = "_model_text"

_SEARCH_KEYS: Final = frozenset({"type", "id", "status", "action"})
_ACTION_KEYS: Final[Mapping[str, frozenset[str]]] = {
    "search": frozenset({"type", "query", "queries", "sources"}),
    "open_page": frozenset({"type", "url"}),
    "find_in_page": frozenset({"type", "url", "pattern"}),
}
_LIST_KEYS: Final = frozenset({"type", "id", "server_label", "tools", "error"})
_TOOL_KEYS: Final = frozenset({"name", "input_schema", "annotations", "description"})
_CALL_KEYS: Final = frozenset(
    {"type", "id", "server_label", "name", "arguments", "status", "output", "error"}
).union({"approval_request_id"})
_REQUEST_KEYS: Final = frozenset({"type", "id", "server_label", "name", "arguments"})
_RESPONSE_KEYS: Final = frozenset({"type", "id", "approval_request_id", "approve", "reason"})
# The SDK's McpToolCallError shapes: type -> (its keys, the required ones).
_ERROR_KEYS: Final[Mapping[str, frozenset[str]]] = {
    "mcp_protocol_error": frozenset({"type", "code", "message"}),
    "http_error": frozenset({"type", "code", "message"}),
    "mcp_tool_execution_error": frozenset({"type", "content"}),
}


def parse_hosted(item: JsonObject, path: str, *, model_texts: bool = False) -> HostedItem:
    """A hosted tool's item (its ``type`` one of ``HOSTED_TYPES``), strictly."""
    match item.get("type"):
        case "web_search_call":
            return _web_search_call(item, path, model_texts)
        case "mcp_list_tools":
            only_keys(item, _LIST_KEYS, path)
            tools = item.get("tools")
            if not isinstance(tools, list):
                raise wrong_type(f"{path}.tools", "an array of tools", tools)
            for i, tool in enumerate(tools):
                _listed_tool(tool, f"{path}.tools[{i}]")
            return McpListTools(
                require_str(item, "id", path),
                require_str(item, "server_label", path),
                json.dumps(tools, ensure_ascii=False),
                optional_str(item, "error", path),
            )
        case "mcp_call":
            return _mcp_call(item, path)
        case "mcp_approval_request":
            only_keys(item, _REQUEST_KEYS, path)
            return McpApprovalRequest(
                require_str(item, "id", path),
                require_str(item, "server_label", path),
                require_str(item, "name", path),
                require_str(item, "arguments", path),
            )
        case "mcp_approval_response":
            only_keys(item, _RESPONSE_KEYS, path)
            approve = item.get("approve")
            if not isinstance(approve, bool):
                raise _missing_or_wrong(item, "approve", path, "a boolean")
            return McpApprovalResponse(
                require_str(item, "approval_request_id", path),
                approve,
                optional_str(item, "reason", path),
                optional_str(item, "id", path),
            )
    raise invalid_request(f"Invalid value for '{path}.type'.", f"{path}.type")


def with_model_texts(
    items: Sequence[JsonObject], texts: Mapping[str, str]
) -> tuple[JsonObject, ...]:
    """``items`` with each ``web_search_call`` whose id ``texts`` names carrying that text as
    ``MODEL_TEXT_KEY`` (copies; the rest as they are): a response's own output, rendered for
    its continuation (``read.read_item``), so the model reads the results it was given."""
    return tuple(
        {**item, MODEL_TEXT_KEY: texts[item["id"]]}
        if item.get("type") == "web_search_call" and item.get("id") in texts
        else item
        for item in items
    )


def _missing_or_wrong(item: Mapping[str, Any], key: str, path: str, expected: str) -> Exception:
    if item.get(key) is None:
        return invalid_request(f"Missing required parameter: '{path}.{key}'.", f"{path}.{key}")
    return wrong_type(f"{path}.{key}", expected, item[key])


def _choice(item: Mapping[str, Any], key: str, allowed: Sequence[str], path: str) -> str | None:
    """``item[key]``, one of ``allowed`` or absent/null; else a 400 naming it."""
    value = optional_str(item, key, path)
    if value is not None and value not in allowed:
        raise invalid_request(
            f"Invalid value for '{path}.{key}': {value!r}; supported values are "
            f"{', '.join(repr(v) for v in allowed)}.",
            f"{path}.{key}",
        )
    return value


def _web_search_call(item: JsonObject, path: str, model_texts: bool) -> WebSearchCall:
    only_keys(item, _SEARCH_KEYS | ({MODEL_TEXT_KEY} if model_texts else set()), path)
    item_id = require_str(item, "id", path)
    status = _choice(item, "status", WEB_SEARCH_STATUSES, path)
    if status is None:
        raise invalid_request(f"Missing required parameter: '{path}.status'.", f"{path}.status")
    model_text = optional_str(item, MODEL_TEXT_KEY, path) if model_texts else None
    return WebSearchCall(item_id, _status(status), _action(item.get("action"), path), model_text)


def _status(status: str) -> WebSearchStatus:
    match status:
        case "in_progress" | "searching" | "completed" | "failed" | "incomplete":
            return status
    raise AssertionError(status)  # _choice checked it


def _action(action: object, path: str) -> SearchAction:
    path = f"{path}.action"
    if action is None:
        raise invalid_request(f"Missing required parameter: '{path}'.", path)
    if not isinstance(action, dict):
        raise wrong_type(path, "an object", action)
    kind = _choice(action, "type", SEARCH_ACTIONS, path)
    if kind is None:
        raise invalid_request(f"Missing required parameter: '{path}.type'.", f"{path}.type")
    only_keys(action, _ACTION_KEYS[kind], path)
    action_type: SearchActionType = (
        "search" if kind == "search" else "open_page" if kind == "open_page" else "find_in_page"
    )
    if action_type == "find_in_page":
        url, pattern = require_str(action, "url", path), require_str(action, "pattern", path)
        return SearchAction(action_type, url=url, pattern=pattern)
    if action_type == "open_page":
        return SearchAction(action_type, url=optional_str(action, "url", path))
    return SearchAction(
        action_type,
        query=optional_str(action, "query", path),
        queries=_strings(action.get("queries"), f"{path}.queries"),
        sources=_sources(action.get("sources"), f"{path}.sources"),
    )


def _strings(value: object, path: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise wrong_type(path, "an array of strings", value)
    for i, entry in enumerate(value):
        if not isinstance(entry, str):
            raise wrong_type(f"{path}[{i}]", "a string", entry)
    return tuple(value)


def _sources(value: object, path: str) -> tuple[str, ...] | None:
    """The URLs of a search's ``sources`` (``{"type": "url", "url"}`` each)."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise wrong_type(path, "an array of sources", value)
    urls: list[str] = []
    for i, source in enumerate(value):
        at = f"{path}[{i}]"
        if not isinstance(source, dict):
            raise wrong_type(at, "an object", source)
        only_keys(source, ("type", "url"), at)
        if source.get("type") != "url":
            raise invalid_request(
                f"Invalid value for '{at}.type': {source.get('type')!r}; expected 'url'.",
                f"{at}.type",
            )
        urls.append(require_str(source, "url", at))
    return tuple(urls)


def _listed_tool(tool: object, path: str) -> None:
    """One tool of an ``mcp_list_tools`` (``name``, ``input_schema``, optional
    ``annotations`` and ``description``)."""
    if not isinstance(tool, dict):
        raise wrong_type(path, "an object", tool)
    only_keys(tool, _TOOL_KEYS, path)
    require_str(tool, "name", path)
    optional_str(tool, "description", path)
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        raise _missing_or_wrong(tool, "input_schema", path, "an object")
    annotations = tool.get("annotations")
    if annotations is not None and not isinstance(annotations, dict):
        raise wrong_type(f"{path}.annotations", "an object", annotations)


def _mcp_call(item: JsonObject, path: str) -> McpCall:
    only_keys(item, _CALL_KEYS, path)
    status = _choice(item, "status", MCP_CALL_STATUSES, path)
    error = item.get("error")
    if error is not None:
        _check_error(error, f"{path}.error")
    return McpCall(
        require_str(item, "id", path),
        require_str(item, "server_label", path),
        require_str(item, "name", path),
        require_str(item, "arguments", path),
        _call_status(status),
        optional_str(item, "output", path),
        None if error is None else json.dumps(error, ensure_ascii=False),
        optional_str(item, "approval_request_id", path),
    )


def _call_status(status: str | None) -> McpCallStatus | None:
    match status:
        case None | "in_progress" | "completed" | "incomplete" | "calling" | "failed":
            return status
    raise AssertionError(status)  # _choice checked it


def _check_error(error: object, path: str) -> None:
    """An ``mcp_call``'s ``error``: one of the SDK's ``McpToolCallError`` objects."""
    if not isinstance(error, dict):
        raise wrong_type(path, "an object", error)
    kind = _choice(error, "type", tuple(_ERROR_KEYS), path)
    if kind is None:
        raise invalid_request(f"Missing required parameter: '{path}.type'.", f"{path}.type")
    only_keys(error, _ERROR_KEYS[kind], path)
    if kind == "mcp_tool_execution_error":
        if "content" not in error:
            raise invalid_request(
                f"Missing required parameter: '{path}.content'.", f"{path}.content"
            )
        return
    code = error.get("code")
    if isinstance(code, bool) or not isinstance(code, int):
        raise _missing_or_wrong(error, "code", path, "an integer")
    require_str(error, "message", path)
