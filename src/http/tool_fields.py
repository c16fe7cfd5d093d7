"""A create's ``tools`` and ``tool_choice`` as the request carries them on: what the Response
echoes, what the model is shown, and the choice (a hosted one resolved).

Invariants:
- The echoed tools are the request's ``tools`` as sent, in their order: namespaced functions
  regrouped into their namespace, each ``mcp`` tool back at its index.
- Deferred tools are declared but not shown until a ``tool_search_output`` loads them; with
  ``allowed_tools`` the model is shown only that subset.
- A ``web_search`` ``tool_choice`` is resolved here; one naming an MCP server's tool waits
  (``mcp_choice``) until the server's tools are listed (``actors/hosted_prep.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..protocol.request import InputItem
from ..protocol.tools.hosted import (
    WEB_SEARCH_TYPES,
    HostedChoice,
    McpSpec,
    parse_hosted_choice,
    resolve_choice,
)
from ..protocol.tools.offered import (
    FunctionTool,
    ToolChoice,
    echo_tools,
    offered_tools,
    parse_tool_choice,
)
from ..protocol.tools.search import discoverable


@dataclass(frozen=True, slots=True)
class RequestTools:
    """A request's tools: as the Response echoes them, all declared ones (when some are
    deferred), those the model is shown, and the tool choice (one naming an MCP server's
    tool waits for its listing: ``mcp_choice``)."""

    echoed: tuple[dict[str, Any], ...]
    declared: tuple[FunctionTool, ...]
    offered: tuple[FunctionTool, ...]
    choice: ToolChoice
    mcp_choice: HostedChoice | None = None


def request_tools(
    tools: tuple[FunctionTool, ...],
    servers: tuple[McpSpec, ...],
    raw_choice: object,
    messages: tuple[InputItem, ...],
) -> RequestTools:
    """The parsed ``tools`` and MCP servers, and the raw ``tool_choice`` checked against the
    tools the input lets the model see."""
    echoed = _in_order(echo_tools(tools), servers)
    declared = tools if any(tool.deferred for tool in tools) else ()
    # Deferred tools wait for a tool_search_output in the input (or in the history:
    # protocol/history.py ``resolve``), so the model is not shown them before it searched.
    visible = discoverable(tools, messages)
    if isinstance(raw_choice, dict) and (
        raw_choice.get("type") in WEB_SEARCH_TYPES or raw_choice.get("type") == "mcp"
    ):
        hosted = parse_hosted_choice(raw_choice, visible, servers)
        if hosted.kind == "mcp":  # resolved once the server's tools are listed
            placeholder = ToolChoice("required", echo=hosted.echo)
            return RequestTools(echoed, declared, visible, placeholder, hosted)
        choice = resolve_choice(hosted, visible)
    else:
        choice = parse_tool_choice(raw_choice, visible)
    # With allowed_tools the model is shown only that subset.
    return RequestTools(echoed, declared, offered_tools(visible, choice), choice)


def _in_order(
    echoed: list[dict[str, Any]], servers: tuple[McpSpec, ...]
) -> tuple[dict[str, Any], ...]:
    """The echoed tools with each ``mcp`` tool back at its place in the request's ``tools``
    (the others keep their order)."""
    out = list(echoed)
    for server in servers:
        out.insert(min(server.index, len(out)), dict(server.echo))
    return tuple(out)
