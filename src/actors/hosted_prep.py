"""A request's MCP servers prepared before its prompt renders: their tools listed (or the
listing found in the history, as OpenAI reuses it along a chain), offered to the model as
functions, a ``tool_choice`` naming one resolved, and the calls the client approved run.

Invariants:
- Everything that can refuse the request does so before anything runs or exists: a server
  outside the operator's allow-list is a 400 naming ``tools[i].server_url``; a server that
  cannot list its tools is a 424 (``external_connector_error``, as OpenAI answers) naming
  ``tools[i]``; an ``mcp_approval_response`` naming no ``mcp_approval_request`` of the
  history or input is a 400 naming it. Nothing is stored for a refused request.
- Items made here are whole before the response starts (``mcp_list_tools`` for each server
  listed now, an ``mcp_call`` per approved call): the run shows them first, in this order,
  and the prompt renders them after the input, so the model reads the approved calls'
  results.
- A call is run once: an approval whose ``mcp_call`` is already in the history is not run
  again. ``run_approved=False`` (counting input tokens) runs none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..hosted.egress import EgressRefused, check
from ..hosted.mcp_client import McpToolInfo, McpUnavailable, list_tools
from ..protocol.errors import ApiError, invalid_request
from ..protocol.ids import new_id
from ..protocol.items.history import input_items
from ..protocol.objects import JsonObject, mcp_list_tools_item
from ..protocol.request import CreateRequest
from ..protocol.tools.hosted import McpSpec, listed_tools, mcp_function, resolve_choice
from ..protocol.tools.offered import FunctionTool
from .hosted_tools import HostedTools, approved_call, mcp_server


@dataclass(frozen=True, slots=True)
class HostedPrep:
    """The request with its MCP servers' tools offered, and the items to show first."""

    request: CreateRequest
    items: tuple[JsonObject, ...] = ()


async def prepare_hosted(
    request: CreateRequest,
    history: tuple[JsonObject, ...],
    hosted: HostedTools | None,
    *,
    run_approved: bool = True,
) -> HostedPrep:
    """List (or reuse the listing of) each MCP server of ``request``, offer its allowed
    tools, resolve an MCP ``tool_choice`` and run the approved calls; raises ``ApiError``."""
    given = input_items(request.input)
    if not request.mcp_servers and not _approvals(given):
        return HostedPrep(request)
    known = history + given
    listings = listed_tools(known)
    made: list[JsonObject] = []
    tools: list[FunctionTool] = []
    for spec in request.mcp_servers:
        listing = listings.get(spec.label)
        if listing is None:
            listing = await _listing(spec, hosted)
            made.append(listing)
        tools += [
            mcp_function(spec, tool)
            for tool in listing.get("tools") or ()
            if spec.allows(str(tool["name"]), tool.get("annotations"))
        ]
    offered = request.tools + tuple(tools)
    choice = request.tool_choice
    if request.mcp_choice is not None:
        choice = resolve_choice(request.mcp_choice, offered)
    request = dataclasses.replace(request, tools=offered, tool_choice=choice, mcp_choice=None)
    approved = await _approved_calls(request, known, given, hosted, run_approved)
    return HostedPrep(request, tuple(made) + approved)


def _approvals(items: Sequence[Mapping[str, Any]]) -> list[tuple[int, Mapping[str, Any]]]:
    return [(i, x) for i, x in enumerate(items) if x.get("type") == "mcp_approval_response"]


async def _listing(spec: McpSpec, hosted: HostedTools | None) -> JsonObject:
    """An ``mcp_list_tools`` item for ``spec``'s server, listed now."""
    path = f"tools[{spec.index}]"
    policy = hosted.egress if hosted is not None else None
    if policy is None or hosted is None:
        raise invalid_request(
            f"Invalid value for '{path}.type': MCP servers are not enabled on this server "
            "(start it with --mcp-allow-hosts; see docs/tools.md).",
            f"{path}.type",
        )
    try:
        await check(spec.url, policy)
    except EgressRefused as exc:
        raise invalid_request(
            f"Invalid value for '{path}.server_url': this server may not reach it ({exc}); "
            "the operator allows hosts with --mcp-allow-hosts.",
            f"{path}.server_url",
        ) from None
    try:
        found = await list_tools(mcp_server(spec), policy, hosted.mcp_timeout_s)
    except McpUnavailable as exc:
        raise ApiError(
            424,
            "external_connector_error",
            f"Error retrieving tool list from MCP server: '{spec.label}'. {exc}",
            param=path,
            code="http_error",
        ) from None
    tools = [_tool_json(tool) for tool in found]
    return mcp_list_tools_item(new_id("mcpl"), server_label=spec.label, tools=tools)


def _tool_json(tool: McpToolInfo) -> JsonObject:
    listed: JsonObject = {"name": tool.name, "input_schema": dict(tool.input_schema)}
    if tool.description is not None:
        listed["description"] = tool.description
    if tool.annotations is not None:
        listed["annotations"] = dict(tool.annotations)
    return listed


async def _approved_calls(
    request: CreateRequest,
    known: tuple[JsonObject, ...],
    given: tuple[JsonObject, ...],
    hosted: HostedTools | None,
    run_approved: bool,
) -> tuple[JsonObject, ...]:
    """The ``mcp_call`` items of the calls this request's input approves (run now)."""
    asked = {x.get("id"): x for x in known if x.get("type") == "mcp_approval_request"}
    done = {x.get("approval_request_id") for x in known if x.get("type") == "mcp_call"}
    servers = {spec.label: spec for spec in request.mcp_servers}
    calls: list[JsonObject] = []
    for i, answer in _approvals(given):
        request_id = answer.get("approval_request_id")
        path = f"input[{i}].approval_request_id"
        asked_for = asked.get(request_id)
        if asked_for is None:
            raise invalid_request(
                f"Invalid value for '{path}': no mcp_approval_request with id {request_id!r} "
                "in this request's input or history.",
                path,
            )
        spec = servers.get(str(asked_for.get("server_label")))
        if spec is None:
            raise invalid_request(
                f"Invalid value for '{path}': the approved call is of the MCP server "
                f"{asked_for.get('server_label')!r}, which is not among this request's tools.",
                path,
            )
        if answer.get("approve") is True and request_id not in done and run_approved:
            calls.append(await approved_call(spec, asked_for, hosted))
    return tuple(calls)
