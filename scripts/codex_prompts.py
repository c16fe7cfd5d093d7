"""Codex CLI's captured requests -> the chats the bundled model is trained on (scripts/codex_prompts.json).

`make conformance` runs the real Codex CLI (0.169.0) against the server. The bundled model
answers Codex only because scripts/build_tiny_model.py trains it on exactly the prompts the
server renders for Codex's requests. This script makes those prompts: it reads Codex's request
bodies, captured from `codex exec` with the conformance profile (tests/fixtures/codex-0.169.0-
small-*.json), and renders each one through the server's own request code (`parse_create_request`
with `--unsupported-tools drop`, `to_chat`, `FunctionTool.for_template`: what `render_items`
gives the chat template). So the tokens the build trains on are the tokens the server prefills.

What reaches the prompt: the developer message (the conformance instructions file), the user's
text, Codex's function tools and the `mcp__weather` namespace tool, and in the follow-up the
model's call and the MCP tool's output, which starts with Codex's `Wall time: 0.0028 seconds`
line (different on every run: the build trains on several values, see `CODEX_WALL_TIMES`;
``wall_time`` names the captured value).
Not in the prompt: call ids, item ids, `prompt_cache_key`, `client_metadata` (the chat template
renders none of them); the working directory and CODEX_HOME (the profile turns the environment
context off).

Run: `.venv/bin/python scripts/codex_prompts.py` (writes scripts/codex_prompts.json; `--check`
only compares). tests/test_codex_model.py checks that the file equals this rendering.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mlx_responses import formats
from mlx_responses.http.schemas import parse_create_request
from mlx_responses.protocol.items.history import input_items, items_from_json
from mlx_responses.text.chat import to_chat

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
OUT = ROOT / "scripts" / "codex_prompts.json"
CALL = '<tool_call>\n{"name": "mcp__weather__get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
# The same answer as the documented `tool_result` prompt: the model's behaviour after a tool
# response is one thing to learn, whatever the tool said.
ANSWER = "It is sunny and 18 degrees in Paris."

# name -> (captured body, the answer the model is trained to give)
TURNS: dict[str, tuple[str, str]] = {
    # Codex's first request with one MCP server: the model calls the MCP tool.
    "codex_mcp_call": ("codex-0.169.0-small-mcp-turn.json", CALL),
    # The follow-up: the same history, the namespaced call, its output: the model answers.
    "codex_mcp_answer": ("codex-0.169.0-small-mcp-tool-result.json", ANSWER),
    # `codex exec "Reply with: hello"` without an MCP server (the one-turn check).
    "codex_hello": ("codex-0.169.0-small-hello.json", "hello"),
}
# The wall-time text in the captured follow-up, replaced by the build's variants.
WALL_TIME = "0.0028"


def render(body: dict[str, Any], tool_format: str | None = None) -> dict[str, Any]:
    """A Codex request body as the server hands it to the chat template; with ``tool_format``
    (a model family's format, ``scripts/build_family_fixtures.py``), as the server does for a
    model of that format (its ``Replay``: where reasoning goes, arguments, descriptions)."""
    request = parse_create_request(body, drop_unsupported_tools=True, default_temperature=0)
    if request.tool_choice.mode == "none" or dict(request.template_kwargs):
        raise ValueError("expected tool_choice auto and no template kwargs")
    items = items_from_json(input_items(request.input))
    tools = [tool.for_template() for tool in request.tools]
    if tool_format is None:
        return {"messages": to_chat(request.config.instructions, items), "tools": tools}
    replay = formats.get(tool_format).replay
    return {
        "messages": to_chat(request.config.instructions, items, replay),
        "tools": replay.template_tools(tools),
    }


def codex_prompts() -> list[dict[str, Any]]:
    prompts = []
    for name, (fixture, expected) in TURNS.items():
        body = json.loads((FIXTURES / fixture).read_text(encoding="utf-8"))
        prompts.append({"name": name, "fixture": f"tests/fixtures/{fixture}", **render(body)})
        prompts[-1]["expected"] = expected
    answer = next(p for p in prompts if p["name"] == "codex_mcp_answer")
    if f"Wall time: {WALL_TIME} seconds" not in answer["messages"][-1]["content"]:
        raise ValueError(f"the follow-up's tool output has no 'Wall time: {WALL_TIME}' line")
    answer["wall_time"] = WALL_TIME
    return prompts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    text = json.dumps(codex_prompts(), indent=2, ensure_ascii=False) + "\n"
    if args.check:
        same = OUT.exists() and OUT.read_text(encoding="utf-8") == text
        print(f"{OUT} is {'up to date' if same else 'out of date'}")
        return 0 if same else 1
    OUT.write_text(text, encoding="utf-8")
    print(f"written to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
