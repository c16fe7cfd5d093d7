"""A request's ``tools`` array: each entry parsed by its type into frozen values (pure).

Invariants:
- ``function``, ``custom``, ``namespace`` and ``tool_search`` tools are parsed by
  ``offered.py``; the hosted ``web_search`` and ``mcp`` tools by ``hosted.py``, under the
  operator's switches (``HostedSwitches``). Any other type is a 400 naming ``tools[i].type``
  unless the server drops such tools (``--unsupported-tools drop``, decision 6), as is a
  ``namespace`` tool that wraps anything but function tools.
- Function names are unique (at most one ``tool_search``), and so are MCP server labels.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..errors import invalid_request
from ..items.read import json_type
from .hosted import (
    WEB_SEARCH_TYPES,
    HostedSwitches,
    McpSpec,
    parse_mcp,
    parse_web_search,
)
from .offered import custom_tool, function_tool, namespace_tools, parse_search_tool
from .spec import FunctionTool

log = logging.getLogger(__name__)


def parse_tools(raw: object, *, drop_unsupported: bool = False) -> tuple[FunctionTool, ...]:
    """``tools`` with no hosted tool enabled (a hosted one is a 400, or dropped)."""
    return parse_request_tools(raw, HostedSwitches(drop_unsupported=drop_unsupported))[0]


def parse_request_tools(
    raw: object, switches: HostedSwitches
) -> tuple[tuple[FunctionTool, ...], tuple[McpSpec, ...]]:
    """``tools`` -> the functions (a ``web_search`` among them when enabled) and the MCP
    servers (``hosted.py``), or a 400 naming the bad tool."""
    if raw is None:
        return (), ()
    if not isinstance(raw, list):
        raise invalid_request(
            f"Invalid type for 'tools': expected an array, but got {json_type(raw)}.", "tools"
        )
    tools: list[FunctionTool] = []
    servers: list[McpSpec] = []
    for i, tool in enumerate(raw):
        path = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid_request(
                f"Invalid type for '{path}': expected an object, but got {json_type(tool)}.", path
            )
        if tool.get("type") == "mcp":
            server = parse_mcp(tool, path, i, switches)
            servers += [server] if server is not None else []
        else:
            tools += _parse_tool(tool, path, switches)
    _unique_labels(servers)
    return _unique(tools), tuple(servers)


def _parse_tool(tool: Mapping[str, Any], path: str, switches: HostedSwitches) -> list[FunctionTool]:
    kind = tool.get("type")
    drop_unsupported = switches.drop_unsupported
    if kind == "function":
        return [function_tool(tool, path)]
    if kind == "custom":
        return [custom_tool(tool, path)]
    if kind == "tool_search":
        return [parse_search_tool(tool, path)]
    if kind in WEB_SEARCH_TYPES:
        search = parse_web_search(tool, path, switches)
        return [search] if search is not None else []
    if kind == "namespace" and isinstance(tool.get("tools"), list):
        inner = tool["tools"]
        if all(isinstance(t, dict) and t.get("type") == "function" for t in inner):
            return namespace_tools(tool, path)
        if not drop_unsupported:
            raise invalid_request(
                f"Invalid value for '{path}.tools': a namespace tool may only wrap function "
                "tools on this server.",
                f"{path}.tools",
            )
        log.warning("dropping namespace tool %s with non-function tools", path)
        return []
    if not drop_unsupported:
        raise invalid_request(
            f"Invalid value for '{path}.type': {kind!r} is not supported: this server runs "
            "'function' and 'custom' tools on the client's side and 'web_search', 'mcp' and "
            "'tool_search' itself (start the server with --unsupported-tools drop to ignore "
            "other hosted tools; docs/tools.md).",
            f"{path}.type",
        )
    log.warning("dropping unsupported tool %s of type %r", path, kind)
    return []


def _unique_labels(servers: list[McpSpec]) -> None:
    labels: set[str] = set()
    for server in servers:
        if server.label in labels:
            path = f"tools[{server.index}].server_label"
            raise invalid_request(
                f"Invalid value for '{path}': the server_label {server.label!r} appears twice.",
                path,
            )
        labels.add(server.label)


def _unique(tools: list[FunctionTool]) -> tuple[FunctionTool, ...]:
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.name in seen and tool.search is not None:
            raise invalid_request(
                "Invalid value for 'tools': only one 'tool_search' tool may be given.",
                f"tools[{i}]",
            )
        if tool.name in seen:
            raise invalid_request(
                f"Invalid value for 'tools': the function name {tool.name!r} appears twice.",
                f"tools[{i}].name",
            )
        seen.add(tool.name)
    return tuple(tools)
