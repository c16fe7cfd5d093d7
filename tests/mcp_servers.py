"""Real MCP servers for the tests: the ``mcp`` package's own server (``MCPServer``, the SDK 2.x
name of FastMCP) behind uvicorn, run as a subprocess::

    python tests/mcp_servers.py --port N --transport streamable-http|sse [--token T]

Streamable HTTP answers at ``/mcp``; SSE at ``/sse`` (messages at ``/messages/``). Tools:

- ``get_weather(city)`` -> ``"sunny, 18C"`` (annotations: ``readOnlyHint`` true);
- ``add(a, b)`` -> the sum;
- ``slow(seconds)`` sleeps; whether it finished or was cancelled is recorded;
- ``fail()`` raises, so the call's result is an error;
- ``calls_seen()`` -> JSON ``{"started": [...], "finished": [...], "cancelled": [...],
  "deletes": n}``: what the server saw, so a test can prove an outbound request was cancelled
  (``slow`` cancelled, or its session deleted) rather than merely abandoned by the client.

With ``--token T`` every request without ``Authorization: Bearer T`` is answered 401.

``start_mcp_server(transport, token=None)`` (Trio) starts one on a free port, waits until it
accepts connections, yields a ``RunningServer`` and kills the process at exit; every wait is
bounded.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import trio

Transport = Literal["streamable-http", "sse"]
START_DEADLINE = 30.0
SCRIPT = str(Path(__file__).resolve())
STOP_DEADLINE = 5.0

# ------------------------------------------------------------------------- the client's side


@dataclass(frozen=True)
class RunningServer:
    url: str
    transport: Transport
    port: int
    token: str | None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@asynccontextmanager
async def start_mcp_server(
    transport: Transport, *, token: str | None = None
) -> AsyncIterator[RunningServer]:
    port = free_port()
    command = [sys.executable, SCRIPT, "--port", str(port)]
    command += ["--transport", transport, *(["--token", token] if token else [])]
    process = await trio.lowlevel.open_process(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        with trio.fail_after(START_DEADLINE):
            await _wait_listening(port, process)
        path = "/sse" if transport == "sse" else "/mcp"
        yield RunningServer(f"http://127.0.0.1:{port}{path}", transport, port, token)
    finally:
        with trio.CancelScope(shield=True):
            process.kill()
            with trio.move_on_after(STOP_DEADLINE):
                await process.wait()


async def _wait_listening(port: int, process: trio.Process) -> None:
    while True:
        if process.returncode is not None:
            raise RuntimeError(f"the MCP server exited with {process.returncode}")
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
        except OSError:
            await trio.sleep(0.05)
            continue
        await stream.aclose()
        return


# ------------------------------------------------------------------------- the server's side

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

SEEN: dict[str, Any] = {"started": [], "finished": [], "cancelled": [], "deletes": 0}


def build_server() -> Any:
    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp_types import ToolAnnotations

    server = MCPServer("test-tools")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny, 18C"

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    async def slow(seconds: float) -> str:
        """Sleep, then answer."""
        SEEN["started"].append(seconds)
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            SEEN["cancelled"].append(seconds)
            raise
        SEEN["finished"].append(seconds)
        return f"slept {seconds}"

    @server.tool()
    def fail() -> str:
        """Always fails."""
        raise ValueError("the tool broke")

    @server.tool()
    def calls_seen() -> str:
        """What this server saw so far."""
        return json.dumps(SEEN)

    return server


def guarded(app: App, token: str | None) -> App:
    """401 without the bearer token; counts session DELETEs."""
    expected = f"Bearer {token}".encode()

    async def guard(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if token is not None and headers.get(b"authorization") != expected:
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
            if scope["method"] == "DELETE":
                SEEN["deletes"] += 1
        await app(scope, receive, send)

    return guard


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--transport", choices=["streamable-http", "sse"], required=True)
    parser.add_argument("--token")
    args = parser.parse_args(argv)
    server = build_server()
    app = server.sse_app() if args.transport == "sse" else server.streamable_http_app()
    config = uvicorn.Config(
        guarded(app, args.token), host="127.0.0.1", port=args.port, log_level="warning"
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
