"""What the MCP client adds to a hosted call: ``hosted/mcp_client.call_tool`` against a local
MCP server, beside a raw HTTP POST of the same JSON-RPC ``tools/call``.

Run::

    .venv/bin/python bench/mcp_call.py [--calls 50] [--transport streamable-http]

The server is tests/mcp_servers.py (the ``mcp`` package's own ``MCPServer`` under uvicorn, in a
subprocess on 127.0.0.1); the tool is ``get_weather`` (it answers at once), so the figures are
the client's and the protocol's cost, not a tool's. Cases, each timed ``--calls`` times after
``--warmup`` untimed calls, medians reported:

- ``call_tool``: the whole hosted call as the server makes it: the egress check, a new
  connection, the protocol's negotiation (a ``server/discover`` probe on this 2026-era server),
  the ``tools/call``, the close;
- ``raw POST, new connection``: the ``tools/call`` request the SDK sent (captured once, headers
  and body), replayed with a fresh httpx2 client per call: the floor for one call that opens
  its own connection;
- ``raw POST, kept connection``: the same over one kept-alive connection: the floor of any
  client.

Ratios are ``call_tool`` over each raw case, measured in the same run. Machine facts (Python,
CPU, whether OpenBLAS was loaded: irrelevant to this network-bound path, printed for the
record) head the report. Results also go to ``bench/results/mcp_call-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from tests.mcp_servers import Transport, start_mcp_server  # noqa: E402

from mlx_responses.blas import openblas_loaded  # noqa: E402
from mlx_responses.hosted.egress import EgressPolicy  # noqa: E402
from mlx_responses.hosted.mcp_client import McpServer, call_tool  # noqa: E402
from throughput import machine_facts  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
POLICY = EgressPolicy(("127.0.0.1",), allow_private=True)
ARGUMENTS = {"city": "Paris"}


def machine() -> dict[str, Any]:
    return {**machine_facts(), "openblas_loaded": openblas_loaded()}


async def capture_call(url: str) -> tuple[dict[str, str], bytes]:
    """The headers and body of the ``tools/call`` POST the SDK sends."""
    captured: list[tuple[dict[str, str], bytes]] = []

    async def record(request: httpx2.Request) -> None:
        body = request.content
        if request.method == "POST" and b'"tools/call"' in body:
            captured.append((dict(request.headers), body))

    async with (
        httpx2.AsyncClient(event_hooks={"request": [record]}) as http,
        Client(streamable_http_client(url, http_client=http), cache=None) as client,
    ):
        await client.call_tool("get_weather", ARGUMENTS)
    headers, body = captured[0]
    for hop in ("host", "content-length", "connection"):
        headers.pop(hop, None)
    return headers, body


async def timed(calls: int, warmup: int, op: Callable[[], Awaitable[None]]) -> list[float]:
    for _ in range(warmup):
        await op()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        await op()
        times.append(time.perf_counter() - start)
    return times


async def run(calls: int, warmup: int, transport: Transport) -> dict[str, Any]:
    async with start_mcp_server(transport) as running:
        server = McpServer("bench", running.url, {})
        cases: dict[str, list[float]] = {}

        async def hosted() -> None:
            outcome = await call_tool(server, "get_weather", ARGUMENTS, POLICY, 10)
            assert outcome.output == "sunny, 18C", outcome

        cases["call_tool"] = await timed(calls, warmup, hosted)
        if transport == "streamable-http":
            headers, body = await capture_call(running.url)

            async def post(http: httpx2.AsyncClient) -> None:
                response = await http.post(running.url, content=body, headers=headers)
                assert b"sunny, 18C" in response.content, response.text

            tls = httpx2.create_ssl_context()  # loaded once, as call_tool's clients share one

            async def fresh() -> None:
                async with httpx2.AsyncClient(verify=tls) as http:
                    await post(http)

            cases["raw POST, new connection"] = await timed(calls, warmup, fresh)
            async with httpx2.AsyncClient() as kept:
                cases["raw POST, kept connection"] = await timed(calls, warmup, lambda: post(kept))
    return {name: statistics.median(times) for name, times in cases.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--transport", choices=["streamable-http", "sse"], default="streamable-http"
    )
    args = parser.parse_args()
    facts = machine()
    for key, value in facts.items():
        print(f"{key}: {value}")
    medians = trio.run(run, args.calls, args.warmup, args.transport)
    print(f"\n{args.transport}, {args.calls} calls each, medians:")
    for name, seconds in medians.items():
        print(f"  {name:28s} {seconds * 1000:8.2f} ms")
    hosted = medians["call_tool"]
    ratios = {name: hosted / seconds for name, seconds in medians.items() if name != "call_tool"}
    for name, ratio in ratios.items():
        print(f"  call_tool / {name}: {ratio:.2f}x (+{(hosted - medians[name]) * 1000:.2f} ms)")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    report = {"machine": facts, "transport": args.transport, "calls": args.calls}
    report |= {"median_s": medians, "ratios": ratios}
    path = RESULTS_DIR / f"mcp_call-{stamp}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nresults: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
