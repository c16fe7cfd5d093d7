"""The event machine's items that are whole or run on the server (``machine.py``): hosted calls
(``web_search_call``, ``mcp_call``), whole items (``mcp_list_tools``, an approved
``mcp_call``, ``compaction``, ``tool_search_output``) and a message's citations, as drafts.

Event sequences (after the item's ``output_item.added``; ``where`` = ``item_id``,
``output_index``):
- ``web_search_call``: ``web_search_call.in_progress``; at ``ToolCallEnd``
  ``web_search_call.searching``; at ``HostedResult`` ``web_search_call.completed`` (ok or not:
  the SDK has no failed event; the item's ``status`` says), then the item done.
- ``mcp_call``: ``mcp_call.in_progress``; ``mcp_call_arguments.delta`` per ``ToolCallArgs``;
  at ``ToolCallEnd`` ``mcp_call_arguments.done``; at ``HostedResult`` ``mcp_call.completed``
  or ``mcp_call.failed``, then the item done.
- Whole ``mcp_list_tools``: added with ``tools: []``, ``mcp_list_tools.in_progress``,
  ``.completed`` (``.failed`` when it has an ``error``), done. Whole ``mcp_call``: added in
  progress without output or error, ``mcp_call.in_progress``, ``mcp_call_arguments.done``,
  ``.completed`` / ``.failed``, done.

Invariants:
- Pure: drafts and JSON values only; the machine numbers the drafts and owns the output.
- A web search's action comes from its arguments alone and never raises: ``{"url",
  "pattern"}`` -> ``find_in_page``, ``{"url"}`` -> ``open_page``, else ``search`` (with
  ``query`` when one is given); empty strings count as absent.
- An MCP error is always the SDK's ``McpToolCallError`` shape: a bare reason becomes an
  ``mcp_tool_execution_error`` whose content is that text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..objects import HostedStatus, JsonObject, json_copy, tool_search_output_item
from .inputs import Compacted, HostedCall, HostedResult
from .open_item import Draft, ItemType, OpenItem


def item_type(hosted: HostedCall) -> ItemType:
    if hosted.approval:
        return "mcp_approval_request"
    return "web_search_call" if hosted.kind == "web_search" else "mcp_call"


def opened(item: OpenItem) -> list[Draft]:
    """The drafts right after a hosted call's ``output_item.added``."""
    if item.type == "web_search_call":
        return [("response.web_search_call.in_progress", item.where())]
    if item.type == "mcp_call":
        return [("response.mcp_call.in_progress", item.where())]
    return []


def ended(item: OpenItem) -> list[Draft]:
    """A hosted call's arguments are whole (``item.chunks``): the server runs it now."""
    item.ended = True
    if item.type == "web_search_call":
        item.action = web_search_action(item.text)
        return [("response.web_search_call.searching", item.where())]
    return [("response.mcp_call_arguments.done", {**item.where(), "arguments": item.text})]


def result(item: OpenItem, outcome: HostedResult, *, sources_included: bool) -> list[Draft]:
    """Record a hosted call's outcome on ``item``; the drafts before its ``output_item.done``
    (whose status is :func:`result_status`). A search's ``sources`` show (as URLs) only when
    asked for and only on a ``search`` action that succeeded."""
    if item.type == "web_search_call":
        action: JsonObject = item.action if item.action is not None else {"type": "search"}
        if sources_included and outcome.ok and action["type"] == "search":
            action["sources"] = [{"type": "url", "url": url} for url, _ in outcome.sources]
        item.action = action
        return [("response.web_search_call.completed", item.where())]
    item.output = outcome.output
    if outcome.ok:
        item.error = None
        return [("response.mcp_call.completed", item.where())]
    item.error = mcp_error(outcome.error or "the tool call failed")
    return [("response.mcp_call.failed", item.where())]


def result_status(outcome: HostedResult) -> HostedStatus:
    """A hosted call's status once its result came: ``failed`` whenever ``ok`` is not set (an
    ``error`` on an ok result is not shown)."""
    return "completed" if outcome.ok else "failed"


def web_search_action(arguments: str) -> JsonObject:
    try:
        value: object = json.loads(arguments) if arguments else {}
    except ValueError:
        value = {}
    given: dict[str, str] = {}
    if isinstance(value, Mapping):
        given = {
            key: found
            for key in ("query", "url", "pattern")
            if isinstance(found := value.get(key), str) and found
        }
    if "url" in given and "pattern" in given:
        return {"type": "find_in_page", "url": given["url"], "pattern": given["pattern"]}
    if "url" in given:
        return {"type": "open_page", "url": given["url"]}
    if "query" in given:
        return {"type": "search", "query": given["query"]}
    return {"type": "search"}


def mcp_error(error: Mapping[str, Any] | str | None) -> JsonObject | None:
    if error is None:
        return None
    if isinstance(error, str):
        return {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": error}]}
    copied: JsonObject = json_copy(dict(error))
    return copied


def whole(item: Mapping[str, Any], index: int) -> tuple[list[Draft], JsonObject]:
    """The drafts of an item shown whole at ``output_index`` ``index``, and the item."""
    done: JsonObject = json_copy(dict(item))
    where = {"item_id": done["id"], "output_index": index}
    if done["type"] == "mcp_list_tools":
        added = {key: value for key, value in done.items() if key != "error"}
        added["tools"] = []
        verdict = "failed" if done.get("error") else "completed"
        middle: list[Draft] = [
            ("response.mcp_list_tools.in_progress", dict(where)),
            (f"response.mcp_list_tools.{verdict}", dict(where)),
        ]
    else:
        added = {**done, "status": "in_progress", "output": None, "error": None}
        failed = done.get("status") == "failed" or done.get("error") is not None
        arguments = {**where, "arguments": str(done.get("arguments", ""))}
        middle = [
            ("response.mcp_call.in_progress", dict(where)),
            ("response.mcp_call_arguments.done", arguments),
            (f"response.mcp_call.{'failed' if failed else 'completed'}", dict(where)),
        ]
    drafts: list[Draft] = [
        ("response.output_item.added", {"output_index": index, "item": added}),
        *middle,
        ("response.output_item.done", {"output_index": index, "item": json_copy(done)}),
    ]
    return drafts, done


def citations(item: OpenItem, annotations: Sequence[JsonObject]) -> list[Draft]:
    """One ``output_text.annotation.added`` per citation of a closing message."""
    item.annotations = json_copy(list(annotations))
    return [
        (
            "response.output_text.annotation.added",
            {**item.where(), "annotation_index": number, "annotation": json_copy(annotation)},
        )
        for number, annotation in enumerate(annotations)
    ]


def compacted(response_id: str, step: Compacted) -> tuple[list[Draft], JsonObject]:
    """The compaction events and its whole item, at ``output_index`` 0 (nothing is out yet)."""
    item: JsonObject = dict(step.item)
    before, after = step.input_tokens_before, step.input_tokens_after
    where = {"response_id": response_id}
    drafts: list[Draft] = [
        ("mlx.compaction.started", {**where, "input_tokens": before}),
        (
            "mlx.compaction.completed",
            {**where, "input_tokens_before": before, "input_tokens_after": after},
        ),
        ("response.output_item.added", {"output_index": 0, "item": dict(item)}),
        ("response.output_item.done", {"output_index": 0, "item": dict(item)}),
    ]
    return drafts, item


def search_output(
    item_id: str, call_id: str, tools: Sequence[Mapping[str, Any]], index: int
) -> tuple[list[Draft], JsonObject]:
    """A server search's ``tool_search_output``: added in progress with no tools, then done
    with the loaded ones (it is whole at once)."""
    item = tool_search_output_item(item_id, call_id=call_id, execution="server", tools=tools)
    added = {**item, "status": "in_progress", "tools": []}
    drafts: list[Draft] = [
        ("response.output_item.added", {"output_index": index, "item": added}),
        ("response.output_item.done", {"output_index": index, "item": json_copy(item)}),
    ]
    return drafts, item
