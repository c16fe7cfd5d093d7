"""Tool search items in a request's ``input`` (issue 13; ``items.parse_item``): a
``tool_search_call`` becomes a ``FunctionCall`` named ``tool_search`` with its arguments as
JSON text, a ``tool_search_output`` a ``FunctionCallOutput`` whose text names the loaded tools.

Invariants:
- Unknown keys and an ``execution`` other than ``server`` / ``client`` are a 400 naming the
  path; a null ``call_id`` (a server search's) reads as ``""``.
"""

from __future__ import annotations

import json
from typing import Any, Final

from .errors import invalid_request
from .fields import json_type, optional_str
from .item_types import FunctionCall, FunctionCallOutput, JsonObject
from .objects import Execution
from .tool_spec import qualified_name

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


def parse_search_call(item: JsonObject, path: str) -> FunctionCall:
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


def parse_search_output(item: JsonObject, path: str) -> FunctionCallOutput:
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
