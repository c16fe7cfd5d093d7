"""A minimal MCP server over stdio for `make conformance`: one tool, get_weather.

Codex CLI starts it (``[mcp_servers.weather]``), lists its tools (Codex then sends them to the
server as the namespace tool ``mcp__weather``) and calls it when the model's ``function_call``
carries ``namespace: "mcp__weather"``. The answer is fixed: "sunny, 18C".
"""

from __future__ import annotations

import json
import sys

TOOLS = [
    {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "inputSchema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]


def answer(method: str, params: dict[str, object]) -> dict[str, object]:
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "weather", "version": "1"},
        }
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        return {"content": [{"type": "text", "text": "sunny, 18C"}]}
    return {}


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("id") is None:
            continue  # a notification
        result = answer(str(message.get("method")), message.get("params") or {})
        reply = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
