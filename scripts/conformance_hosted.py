"""`make conformance`'s hosted-tools checks (``scripts/conformance.py`` calls ``hosted_checks``):
the OpenAI Agents SDK with its own ``WebSearchTool`` and ``HostedMCPTool`` against a real
server that runs them, each to a final answer.

- The server runs the trained hosted-tools fixture (``tests/fixtures/hosted_model``,
  docs/models.md) with ``--web-search local`` over ``tests/fixtures/web_index`` and
  ``--mcp-allow-hosts 127.0.0.1 --mcp-allow-private`` (the MCP server is on this machine).
- The MCP server is the ``mcp`` package's own (``tests/mcp_servers.py``), started by the run
  as a subprocess, streamable HTTP.
- ``WebSearchTool``: the agent (instructions "Answer with a web search.") is asked "What is the
  capital of France?"; the server searches, and the answer must be the fixture's cited one,
  with a ``web_search_call`` item among the run's items.
- ``HostedMCPTool``: the agent (instructions "Answer with the weather tool.") is asked "What is
  the weather in Paris?" with the weather server (``require_approval: "never"``); the server
  calls ``get_weather``, and the answer must be "It is sunny, 18C in Paris.", with an
  ``mcp_call`` item among the run's items.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "hosted_model"
INDEX = ROOT / "tests" / "fixtures" / "web_index"
MODEL = "hosted-tiny"
DEADLINE = 300
SEARCH_ANSWER = "The capital of France is Paris [1]."
WEATHER_ANSWER = "It is sunny, 18C in Paris."

Serving = Callable[[list[str], str], AbstractContextManager[str]]


@contextlib.contextmanager
def mcp_server() -> Iterator[str]:
    """``tests/mcp_servers.py`` on a free port (streamable HTTP); yields its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = ROOT / "tests" / "mcp_servers.py"
    command = [sys.executable, str(script), "--port", str(port), "--transport", "streamable-http"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if process.poll() is not None or time.monotonic() > until:
                raise RuntimeError("the MCP server did not start")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def _run_agent(base: str, instructions: str, question: str, tool: Any) -> tuple[str, list[str]]:
    from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    async def run() -> tuple[str, list[str]]:
        async with AsyncOpenAI(base_url=f"{base}/v1", api_key="local", max_retries=0) as client:
            model = OpenAIResponsesModel(model=MODEL, openai_client=client)
            agent = Agent(name="hosted", instructions=instructions, model=model, tools=[tool])
            result = await Runner.run(agent, question, max_turns=3)
            kinds = [str(getattr(item.raw_item, "type", "")) for item in result.new_items]
            return str(result.final_output), kinds

    return asyncio.run(asyncio.wait_for(run(), DEADLINE))


def web_search_check(base: str) -> dict[str, Any]:
    from agents import WebSearchTool

    try:
        answer, kinds = _run_agent(
            base, "Answer with a web search.", "What is the capital of France?", WebSearchTool()
        )
    except Exception as exc:  # any SDK error is this check's failure, reported
        return {"ok": False, "error": repr(exc)[:500]}
    ok = answer == SEARCH_ANSWER and "web_search_call" in kinds
    return {"ok": ok, "final_output": answer, "items": kinds}


def mcp_check(base: str, url: str) -> dict[str, Any]:
    from agents import HostedMCPTool

    config = {
        "type": "mcp",
        "server_label": "weather",
        "server_url": url,
        "require_approval": "never",
    }
    try:
        answer, kinds = _run_agent(
            base,
            "Answer with the weather tool.",
            "What is the weather in Paris?",
            HostedMCPTool(tool_config=config),  # type: ignore[arg-type]
        )
    except Exception as exc:
        return {"ok": False, "error": repr(exc)[:500]}
    ok = answer == WEATHER_ANSWER and "mcp_call" in kinds
    return {"ok": ok, "final_output": answer, "items": kinds}


def hosted_checks(summary: dict[str, Any], serving: Serving) -> None:
    """The Agents SDK's hosted tools against a server of their own."""
    extra = [
        *("--model", str(FIXTURE), "--alias", MODEL),
        *("--web-search", "local", "--web-search-index", str(INDEX)),
        *("--mcp-allow-hosts", "127.0.0.1", "--mcp-allow-private"),
    ]
    with serving(extra, "server-hosted.log") as base, mcp_server() as url:
        summary["openai-agents WebSearchTool (local index)"] = web_search_check(base)
        summary["openai-agents HostedMCPTool (mcp server)"] = mcp_check(base, url)
