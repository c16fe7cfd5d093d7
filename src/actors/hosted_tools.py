"""Running a tool the server runs, inside the response's own task: a web search (or a page
opened, or text found in it) on the operator's backend, or a remote MCP server's tool.

Invariants:
- Every call is bounded (the backend's and the MCP client's own timeouts, and
  ``HostedTools.deadline`` around the whole call) and runs in the caller's task: a cancel,
  a hang-up or shutdown cancels it, and with it the outbound request.
- A call never raises for the backend's or the server's failure: it answers a failed
  ``HostedResult`` and the text the model reads says why (the response goes on).
- What the model reads is ``protocol/tools/hosted_text.py``'s, so a replay renders the same.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from ..hosted.egress import EgressPolicy
from ..hosted.mcp_client import McpOutcome, McpServer, McpSettings, call_tool
from ..hosted.web_search import (
    SearchFailed,
    SearchOptions,
    WebSearchBackend,
    WebSearchSettings,
    allowed,
    build_backend,
    find_in_page,
)
from ..protocol.events.inputs import HostedResult
from ..protocol.ids import new_id
from ..protocol.objects import JsonObject, mcp_call_item
from ..protocol.request import CreateRequest
from ..protocol.tools.hosted import McpSpec, web_search_spec
from ..protocol.tools.hosted_text import (
    failed_text,
    mcp_result_text,
    open_page_text,
    search_result_text,
)
from ..protocol.tools.spec import FunctionTool

log = logging.getLogger(__name__)

# Characters of an opened page, and around each match found in one, the model reads.
PAGE_CHARS = {"low": 2000, "medium": 4000, "high": 8000}
FIND_CHARS = {"low": 160, "medium": 240, "high": 400}


@dataclass(frozen=True, slots=True)
class HostedTools:
    """What the operator enabled: a search backend, the MCP hosts and their timeouts."""

    search: WebSearchBackend | None = None
    search_timeout_s: float = 10.0
    egress: EgressPolicy | None = None  # None: MCP servers are off
    mcp_timeout_s: float = 30.0

    @property
    def deadline(self) -> float:
        """The most any one call may take, whatever the backend does."""
        return max(self.search_timeout_s, self.mcp_timeout_s) + 5.0


@dataclass(frozen=True, slots=True)
class Ran:
    """A hosted call's outcome: what the event machine is fed, what the model reads."""

    result: HostedResult
    text: str


@asynccontextmanager
async def open_hosted_tools(
    search: WebSearchSettings, mcp: McpSettings
) -> AsyncIterator[HostedTools | None]:
    """The operator's hosted tools for the server's life (None: none enabled): the search
    backend built (a local index brought up to date first) and closed at the end."""
    if search.kind == "off" and mcp.policy is None:
        yield None
        return
    backend: WebSearchBackend | None = None
    if search.kind != "off":
        backend = build_backend(
            search.kind,
            index_dir=search.index_dir,
            searxng_url=search.searxng_url,
            timeout_s=search.timeout_s,
            allow_private_pages=search.allow_private_pages,
        )
        ensure = getattr(backend, "ensure_index", None)
        if ensure is not None:
            await ensure()
    try:
        yield HostedTools(backend, search.timeout_s, mcp.policy, mcp.timeout_s)
    finally:
        if backend is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await backend.aclose()


def mcp_server(spec: McpSpec) -> McpServer:
    return McpServer(spec.label, spec.url, dict(spec.headers))


async def run_call(
    tool: FunctionTool, arguments: str, request: CreateRequest, hosted: HostedTools | None
) -> Ran:
    """Run the call the model made of ``tool`` (a hosted one) with ``arguments`` (with no
    hosted tools enabled, it fails: the request could not have offered it)."""
    assert tool.hosted is not None
    hosted = hosted or HostedTools()
    with trio.move_on_after(hosted.deadline):
        if tool.hosted.kind == "web_search":
            return await _web_search(tool, _arguments(arguments), hosted)
        return await _mcp_call(tool, _arguments(arguments), request, hosted)
    reason = "the tool did not answer in time"
    if tool.hosted.kind == "web_search":
        return Ran(HostedResult(False, error=reason), failed_text(reason))
    return Ran(HostedResult(False, error=reason), mcp_result_text(None, reason))


def _arguments(arguments: str) -> dict[str, Any]:
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


async def _web_search(tool: FunctionTool, args: Mapping[str, Any], hosted: HostedTools) -> Ran:
    backend = hosted.search
    spec = web_search_spec(tool)
    query, url, pattern = (_text(args, key) for key in ("query", "url", "pattern"))
    try:
        if backend is None:
            raise SearchFailed("web search is not enabled on this server")
        if url:
            if not allowed(url, spec.allowed_domains):
                raise SearchFailed(f"{url} is outside the allowed domains")
            page = await backend.open_page(url)
            if pattern:
                found = find_in_page(page, pattern, FIND_CHARS[spec.context_size])
                return Ran(HostedResult(True), found or "Not found.")
            text = page.text[: PAGE_CHARS[spec.context_size]]
            return Ran(HostedResult(True), open_page_text(page.title, page.url, text))
        if not query:
            raise SearchFailed("the call gave no query and no url")
        options = SearchOptions(spec.allowed_domains, spec.context_size)
        sources = await backend.search(query, options)
    except SearchFailed as exc:
        log.info("web search failed: %s", exc)
        return Ran(HostedResult(False, error=str(exc)), failed_text(str(exc)))
    pairs = tuple((s.url, s.title) for s in sources)
    text = search_result_text(tuple((s.title, s.url, s.snippet) for s in sources))
    return Ran(HostedResult(True, sources=pairs), text)


def _text(args: Mapping[str, Any], key: str) -> str:
    value = args.get(key)
    return value.strip() if isinstance(value, str) else ""


async def _mcp_call(
    tool: FunctionTool, args: Mapping[str, Any], request: CreateRequest, hosted: HostedTools
) -> Ran:
    assert tool.hosted is not None
    spec = next((s for s in request.mcp_servers if s.label == tool.hosted.server_label), None)
    if spec is None or hosted.egress is None:
        error = f"the MCP server {tool.hosted.server_label!r} is not available"
        return Ran(HostedResult(False, error=error), mcp_result_text(None, error))
    outcome = await call_tool(
        mcp_server(spec), tool.call_name, args, hosted.egress, hosted.mcp_timeout_s
    )
    result = HostedResult(outcome.error is None, output=outcome.output, error=outcome.error)
    return Ran(result, mcp_result_text(outcome.output, outcome.error))


async def approved_call(
    spec: McpSpec, asked: Mapping[str, Any], hosted: HostedTools | None
) -> JsonObject:
    """Run the call an ``mcp_approval_request`` asked for, which the client approved: its
    ``mcp_call`` item (with the request's id), whole."""
    name, arguments = str(asked.get("name")), str(asked.get("arguments") or "{}")
    hosted = hosted or HostedTools()
    if hosted.egress is None:
        error = {"type": "http_error", "code": 0, "message": "MCP servers are not enabled"}
        outcome = McpOutcome(None, error)
    else:
        late = {"type": "http_error", "code": 504, "message": "the MCP server did not answer"}
        outcome = McpOutcome(None, late)
        with trio.move_on_after(hosted.deadline):
            outcome = await call_tool(
                mcp_server(spec), name, _arguments(arguments), hosted.egress, hosted.mcp_timeout_s
            )
    return mcp_call_item(
        new_id("mcp"),
        server_label=spec.label,
        name=name,
        arguments=arguments,
        status="completed" if outcome.error is None else "failed",
        output=outcome.output,
        error=outcome.error,
        approval_request_id=str(asked.get("id")),
    )
