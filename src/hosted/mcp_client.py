"""The server as an MCP client: list a remote MCP server's tools and call one, with the official
``mcp`` SDK over streamable HTTP (or SSE when the URL's path ends with ``/sse``), under Trio.

Each ``list_tools`` / ``call_tool`` opens its own session (a connection, the protocol's
negotiation, the request, the close): a response's tool calls are few and far apart (a model
turn between them), and a session per call holds nothing open between them.

Invariants:
- Nothing is sent before ``egress.check`` passes, and every connection goes to the address it
  checked (``egress.pinned_client``).
- Every wait is bounded by ``timeout_s`` (connect, negotiation, the request), plus
  ``CLOSE_GRACE_S`` to close the session.
- A Trio cancel of the caller interrupts the request at once: the SDK aborts the request's POST
  and sends ``notifications/cancelled``; the session's close (the ``DELETE`` of a handshake-era
  session) still runs, shielded and bounded by ``CLOSE_GRACE_S``; then ``Cancelled``
  propagates to the caller.
- ``list_tools`` raises only ``McpUnavailable`` (or ``Cancelled``); ``call_tool`` never raises
  for the MCP server's trouble: a refusal, a transport failure or the tool's own error is an
  ``McpOutcome`` whose ``error`` has the OpenAI ``McpToolCallError`` shape. A failure that has
  no HTTP status of its own gets a gateway's: 403 refused by egress, 502 no connection or a
  broken transport, 504 no answer in time.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx2
import trio
from mcp import Client
from mcp.client._transport import TransportStreams
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextContent, Tool

from .egress import EgressPolicy, EgressRefused, PinnedTarget, check, pinned_client

CLOSE_GRACE_S = 2.0
# "auto": the stateless 2026 protocol where the server speaks it (a discover probe first), else
# the handshake-era session (initialize ... DELETE). Tests set "legacy" to exercise the latter.
CONNECT_MODE = "auto"
MAX_TOOL_PAGES = 100
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class McpServer:
    label: str
    url: str
    headers: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class McpToolInfo:
    name: str
    description: str | None
    input_schema: Mapping[str, Any]
    annotations: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class McpOutcome:
    output: str | None
    error: Mapping[str, Any] | None


class McpUnavailable(Exception):
    """The MCP server could not be used; the message says why, ``error`` is the same reason in
    the ``McpToolCallError`` shape."""

    def __init__(self, message: str, error: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.error = error


# ------------------------------------------------------------------------------ operations


async def list_tools(
    server: McpServer, policy: EgressPolicy, timeout_s: float
) -> list[McpToolInfo]:
    """Every tool the server lists (following its pages), or ``McpUnavailable``."""

    async def op(client: Client) -> list[McpToolInfo]:
        tools: list[McpToolInfo] = []
        cursor: str | None = None
        for _ in range(MAX_TOOL_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools.extend(_tool_info(tool) for tool in page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    return await _in_session(server, policy, timeout_s, op)


async def call_tool(
    server: McpServer,
    name: str,
    arguments: Mapping[str, Any],
    policy: EgressPolicy,
    timeout_s: float,
) -> McpOutcome:
    """The tool's result: its text output, or an error (the tool's, the server's, or why the
    server could not be reached)."""

    async def op(client: Client) -> CallToolResult:
        return await client.call_tool(name, dict(arguments))

    try:
        result = await _in_session(server, policy, timeout_s, op)
    except McpUnavailable as unavailable:
        return McpOutcome(None, unavailable.error)
    return outcome_of(result)


def outcome_of(result: CallToolResult) -> McpOutcome:
    if result.is_error:
        content = [
            part.model_dump(mode="json", by_alias=True, exclude_none=True)
            for part in result.content
        ]
        return McpOutcome(None, {"type": "mcp_tool_execution_error", "content": content})
    texts = [part.text for part in result.content if isinstance(part, TextContent)]
    if texts:
        return McpOutcome("\n".join(texts), None)
    if result.structured_content is not None:
        return McpOutcome(json.dumps(result.structured_content), None)
    return McpOutcome("", None)


def _tool_info(tool: Tool) -> McpToolInfo:
    annotations = None
    if tool.annotations is not None:
        annotations = tool.annotations.model_dump(mode="json", by_alias=True, exclude_none=True)
    return McpToolInfo(tool.name, tool.description, dict(tool.input_schema), annotations)


# ------------------------------------------------------------------------------ one session


class _Seen:
    """The last HTTP error status of one session (the SDK reports some as a bare -32603)."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.reason = ""

    def response(self, response: httpx2.Response) -> None:
        if response.status_code >= 400:
            self.status, self.reason = response.status_code, response.reason_phrase


@dataclass(slots=True)
class _Session:
    """The scopes of one session: ``whole`` bounds everything, shielded from the caller;
    ``work`` is the request, which a caller's cancel or the deadline interrupts."""

    whole: trio.CancelScope
    work: trio.CancelScope
    entered: bool = False

    def interrupt(self) -> None:
        if not self.entered:
            self.whole.cancel()  # nothing to close yet
            return
        self.work.cancel()
        self.whole.deadline = min(self.whole.deadline, trio.current_time() + CLOSE_GRACE_S)


async def _in_session(
    server: McpServer,
    policy: EgressPolicy,
    timeout_s: float,
    op: Callable[[Client], Awaitable[_T]],
) -> _T:
    deadline = trio.current_time() + timeout_s  # the check's DNS wait included
    with trio.move_on_at(deadline) as resolving:
        try:
            target = await check(server.url, policy)
        except EgressRefused as refused:
            raise _unavailable(f"refused by the egress policy: {refused}", 403) from None
    if resolving.cancelled_caught:
        raise _unavailable(f"no answer from {server.url} within {timeout_s:g} s", 504)
    seen = _Seen()
    session = _Session(
        trio.CancelScope(shield=True, deadline=deadline), trio.CancelScope(deadline=deadline)
    )
    results: list[_T] = []
    failures: list[Exception] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_interrupt_on_cancel, session)
        with session.whole:
            try:
                async with Client(
                    _open_transport(server, target, timeout_s, seen),
                    read_timeout_seconds=timeout_s,
                    mode=CONNECT_MODE,
                    cache=None,
                ) as client:
                    session.entered = True
                    session.whole.deadline = deadline + CLOSE_GRACE_S
                    with session.work:
                        results.append(await op(client))
            except Exception as error:
                failures.append(error)
        nursery.cancel_scope.cancel()
    if results:
        return results[0]
    raise _failure(server, timeout_s, seen, failures)


async def _interrupt_on_cancel(session: _Session) -> None:
    # The session runs shielded so that its close is not lost; the caller's cancel reaches it
    # through here. (Also runs when the session is over and this task is stopped: harmless.)
    try:
        await trio.sleep_forever()
    finally:
        session.interrupt()


@asynccontextmanager
async def _open_transport(
    server: McpServer, target: PinnedTarget, timeout_s: float, seen: _Seen
) -> AsyncIterator[TransportStreams]:
    def factory(
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient:
        return pinned_client(
            target,
            headers=headers,
            timeout=timeout or httpx2.Timeout(timeout_s),
            on_response=seen.response,
        )

    headers = dict(server.headers)
    if urlsplit(server.url).path.rstrip("/").endswith("/sse"):
        async with sse_client(
            server.url,
            headers=headers,
            timeout=timeout_s,
            sse_read_timeout=timeout_s,
            httpx_client_factory=factory,
        ) as streams:
            yield streams
    else:
        async with (
            factory(headers) as http,
            streamable_http_client(server.url, http_client=http) as streams,
        ):
            yield streams


def _unavailable(message: str, code: int) -> McpUnavailable:
    return McpUnavailable(message, {"type": "http_error", "code": code, "message": message})


def _failure(
    server: McpServer, timeout_s: float, seen: _Seen, failures: list[Exception]
) -> McpUnavailable:
    if seen.status is not None:
        return _unavailable(
            f"the MCP server answered HTTP {seen.status} {seen.reason}", seen.status
        )
    error = _leaf(failures[0]) if failures else None
    if error is None:
        return _unavailable(f"no answer from {server.url} within {timeout_s:g} s", 504)
    if isinstance(error, MCPError):
        message = f"protocol error {error.code}: {error.message}"
        return McpUnavailable(
            message, {"type": "mcp_protocol_error", "code": error.code, "message": error.message}
        )
    if isinstance(error, EgressRefused):
        return _unavailable(f"refused by the egress policy: {error}", 403)
    if isinstance(error, httpx2.TimeoutException | TimeoutError):
        return _unavailable(f"no answer from {server.url} within {timeout_s:g} s", 504)
    if isinstance(error, httpx2.ConnectError):
        return _unavailable(f"could not connect to {server.url}: {error}", 502)
    return _unavailable(f"the MCP connection failed: {type(error).__name__}: {error}", 502)


def _leaf(error: BaseException) -> BaseException:
    """The first exception inside nested groups (the SDK's task groups wrap its errors)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


# ------------------------------------------------------------------------------ settings


@dataclass(frozen=True, slots=True)
class McpSettings:
    allow_hosts: tuple[str, ...] = ()
    allow_private: bool = False
    timeout_s: float = 30.0

    @property
    def policy(self) -> EgressPolicy | None:
        """None when no host is allowed: MCP tools are off."""
        if not self.allow_hosts:
            return None
        return EgressPolicy(self.allow_hosts, self.allow_private)


def hosts_flag(text: str) -> tuple[str, ...]:
    """``--mcp-allow-hosts``: comma-separated hosts, ``*.domain`` or ``*``."""
    hosts = tuple(part.strip().lower() for part in text.split(",") if part.strip())
    for host in hosts:
        wild = host.startswith("*.") and "*" not in host[2:] and len(host) > 2
        if ("*" in host and host != "*" and not wild) or any(c in host for c in "/@ "):
            raise argparse.ArgumentTypeError(
                f"{host!r} is not a host, '*.domain' or '*' (use names, no scheme or path)"
            )
    return hosts


def timeout_flag(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("the MCP timeout must be a positive number of seconds")
    return value


def add_flags(parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    env = os.environ if environ is None else environ
    raw_hosts = env.get("MLX_RESPONSES_MCP_ALLOW_HOSTS", "")
    raw_timeout = env.get("MLX_RESPONSES_MCP_TIMEOUT")
    try:
        hosts = hosts_flag(raw_hosts)
        timeout = 30.0 if raw_timeout is None else timeout_flag(raw_timeout)
    except (ValueError, argparse.ArgumentTypeError) as error:
        parser.error(f"an MCP environment variable is not valid: {error}")
    parser.add_argument(
        "--mcp-allow-hosts",
        dest="mcp_allow_hosts",
        type=hosts_flag,
        default=hosts,
        metavar="HOSTS",
        help="comma-separated hosts whose MCP servers a request's 'mcp' tool may reach: exact "
        "names, '*.domain' (its subdomains) or '*' (any); empty (the default) turns MCP tools "
        "off [env: MLX_RESPONSES_MCP_ALLOW_HOSTS]",
    )
    parser.add_argument(
        "--mcp-allow-private",
        dest="mcp_allow_private",
        action="store_true",
        default=env.get("MLX_RESPONSES_MCP_ALLOW_PRIVATE", "") not in ("", "0", "false"),
        help="let allowed MCP hosts resolve to loopback, private or link-local addresses "
        "(off by default: a request could reach the operator's own network) "
        "[env: MLX_RESPONSES_MCP_ALLOW_PRIVATE]",
    )
    parser.add_argument(
        "--mcp-timeout",
        dest="mcp_timeout",
        type=timeout_flag,
        default=timeout,
        metavar="SECONDS",
        help="the longest one MCP list or call may take, connecting included "
        "[env: MLX_RESPONSES_MCP_TIMEOUT]",
    )


def settings_from(args: argparse.Namespace) -> McpSettings:
    return McpSettings(
        allow_hosts=tuple(args.mcp_allow_hosts),
        allow_private=bool(args.mcp_allow_private),
        timeout_s=float(args.mcp_timeout),
    )
