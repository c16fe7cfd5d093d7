"""The tools the server runs inside a response, one mechanism for all of them: the model's
call ends its sequence, the server runs it (a tool search already ran inside the output
parser; a web search or an MCP call runs here), its result goes out, and a continuation
over the output so far goes on in the same response (``run.py``, the lifecycle table's
``TOOL_RUNNING`` and ``CONTINUING`` phases).

Invariants:
- What a continuation generates with is decided here from the request and the output so far:
  a tool search swaps ``tool_search`` for the tools it loaded (``protocol/tools/search.py``);
  after a hosted call the same tools stay offered, a choice that forced a call becomes
  ``auto`` (it was honoured), and once the response made ``max_tool_calls`` hosted calls (or
  the server's own cap, ``MAX_HOSTED_CALLS``) the continuation is shown no tools at all, so
  the model answers with what it has.
- A hosted call's result text (what the model reads) is kept by the run per item id and put
  on the continuation's copies of its items only (``protocol/items/hosted_read.py``'s
  ``with_model_texts``): the stored item is
  the API's, the model's reading of it in this response is the full result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..protocol.request import CreateRequest
from ..protocol.tools.offered import FunctionTool, ToolChoice
from ..protocol.tools.search import after_server_search

# The most hosted calls (web searches, MCP calls) one response makes, whatever it asks.
MAX_HOSTED_CALLS: Final = 16
HOSTED_CALL_TYPES: Final = frozenset({"web_search_call", "mcp_call"})


def hosted_calls(output: Sequence[Mapping[str, Any]]) -> int:
    """How many hosted calls the output holds (the server ran them, successfully or not)."""
    return sum(1 for item in output if item.get("type") in HOSTED_CALL_TYPES)


def after_hosted_call(
    request: CreateRequest, output: Sequence[Mapping[str, Any]]
) -> tuple[tuple[FunctionTool, ...], ToolChoice]:
    """The tools and the choice a continuation after a hosted call generates with."""
    made = hosted_calls(output)
    limit = MAX_HOSTED_CALLS
    if request.config.max_tool_calls is not None:
        limit = min(limit, request.config.max_tool_calls)
    if made >= limit:
        return request.tools, ToolChoice("none")
    choice = request.tool_choice
    if choice.mode == "required":  # honoured: the model may now answer
        choice = dataclasses.replace(choice, mode="auto", name=None, custom=False)
    return request.tools, choice


def following(
    request: CreateRequest, output: Sequence[Mapping[str, Any]], hosted_call: bool
) -> tuple[tuple[FunctionTool, ...], ToolChoice] | None:
    """What a continuation generates with when the sequence stopped on a server tool's call
    (``hosted_call``: a hosted one), None when nothing the server runs was called."""
    if hosted_call:
        return after_hosted_call(request, output)
    return after_server_search(request.tools, request.tool_choice, output)
