"""Input items written out: the JSON shapes we store and list (``input_items``, a response's
history, conversation items) and a compaction item's ``encrypted_content`` (pure).

Invariants:
- ``item_json`` and ``items.read_item`` round-trip: ``read_item(item_json(x, id)) == x``, so a
  stored history replays exactly the items the original turn rendered.
- A message's or a tool output's images (typed parts of its content, ``images.py``) are
  listed as ``input_image`` parts, between its text parts, in order.
- A hosted item is written with its own id (``hosted_json``); an ``mcp_approval_response``
  with the client's id when it sent one. A ``web_search_call``'s ``model_text`` is never
  written: it is not listed, stored nor put in a compaction item.
- ``encode_compaction`` writes the summary and the retained items (without the ids minted for
  them; a hosted item's own id kept) as base64url JSON (format ``COMPACTION_FORMAT_VERSION``);
  ``items.decode_compaction`` reads it.
"""

from __future__ import annotations

import base64
import json

from ..ids import new_id
from ..objects import (
    custom_tool_call_item,
    tool_search_call_item,
    tool_search_output_item,
)
from .images import content_parts, holds_images, text_of
from .values import (
    COMPACTION_FORMAT_VERSION,
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    InputMessage,
    JsonObject,
    McpApprovalRequest,
    McpApprovalResponse,
    McpCall,
    McpListTools,
    Reasoning,
    SearchAction,
    WebSearchCall,
)


def item_json(item: InputItem, item_id: str | None = None) -> JsonObject:
    """The stored / listed JSON shape of an input item, with its id."""
    match item:
        case InputMessage():
            return _message_json(item, item_id)
        case FunctionCall():
            return _call_json(item, item_id)
        case FunctionCallOutput():
            return _output_json(item, item_id)
        case Reasoning(text, encrypted):
            reasoning: JsonObject = {
                "id": item_id or new_id("rs"),
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": text}] if text else None,
            }
            if encrypted is not None:
                reasoning["encrypted_content"] = encrypted
            return reasoning
        case Compaction():
            return {
                "id": item_id or new_id("cmp"),
                "type": "compaction",
                "encrypted_content": encode_compaction(item),
            }
        case WebSearchCall() | McpListTools() | McpCall() | McpApprovalRequest():
            return hosted_json(item)
        case McpApprovalResponse():
            return {
                "id": item.id or item_id or new_id("mcpa"),
                "type": "mcp_approval_response",
                "approval_request_id": item.approval_request_id,
                "approve": item.approve,
                "reason": item.reason,
            }


def hosted_json(item: WebSearchCall | McpListTools | McpCall | McpApprovalRequest) -> JsonObject:
    """A hosted item with its own id (required by its shape, never minted again)."""
    match item:
        case WebSearchCall(item_id, status, action):
            return {
                "id": item_id,
                "type": "web_search_call",
                "status": status,
                "action": _action_json(action),
            }
        case McpListTools(item_id, label, tools, error):
            return {
                "id": item_id,
                "type": "mcp_list_tools",
                "server_label": label,
                "tools": json.loads(tools),
                "error": error,
            }
        case McpCall():
            shaped: JsonObject = {
                "id": item.id,
                "type": "mcp_call",
                "server_label": item.server_label,
                "name": item.name,
                "arguments": item.arguments,
                "output": item.output,
                "error": None if item.error is None else json.loads(item.error),
                "approval_request_id": item.approval_request_id,
            }
            if item.status is not None:
                shaped["status"] = item.status
            return shaped
        case McpApprovalRequest(item_id, label, name, arguments):
            return {
                "id": item_id,
                "type": "mcp_approval_request",
                "server_label": label,
                "name": name,
                "arguments": arguments,
            }


def _action_json(action: SearchAction) -> JsonObject:
    shaped: JsonObject = {"type": action.type}
    for key in ("query", "url", "pattern"):
        value = getattr(action, key)
        if value is not None:
            shaped[key] = value
    if action.queries is not None:
        shaped["queries"] = list(action.queries)
    if action.sources is not None:
        shaped["sources"] = [{"type": "url", "url": url} for url in action.sources]
    return shaped


def _message_json(message: InputMessage, item_id: str | None) -> JsonObject:
    part_type = "output_text" if message.role == "assistant" else "input_text"
    if holds_images(message.text):
        content = content_parts(message.text, part_type)
    else:
        part: JsonObject = {"type": part_type, "text": text_of(message.text)}
        if part_type == "output_text":
            part["annotations"] = []
        content = [part]
    shaped: JsonObject = {
        "id": item_id or new_id("msg"),
        "type": "message",
        "role": message.role,
        "status": "completed",
        "content": content,
    }
    if message.phase is not None:
        shaped["phase"] = message.phase
    return shaped


def _call_json(call: FunctionCall, item_id: str | None) -> JsonObject:
    if call.search is not None:
        return tool_search_call_item(
            item_id or new_id("tsc"),
            call_id=call.call_id,
            execution="client" if call.search == "client" else "server",
            arguments=call.arguments,
            status="completed",
        )
    if call.custom:
        return custom_tool_call_item(
            item_id or new_id("ctc"),
            call_id=call.call_id,
            name=call.name,
            text=call.arguments,
            namespace=call.namespace,
        )
    shaped: JsonObject = {
        "id": item_id or new_id("fc"),
        "type": "function_call",
        "call_id": call.call_id,
        "name": call.name,
        "arguments": call.arguments,
        "status": "completed",
    }
    if call.namespace is not None:
        shaped["namespace"] = call.namespace
    return shaped


def _output_json(output: FunctionCallOutput, item_id: str | None) -> JsonObject:
    if output.search is not None and output.search_tools is not None:
        return tool_search_output_item(
            item_id or new_id("tso"),
            call_id=output.call_id,
            execution="client" if output.search == "client" else "server",
            tools=json.loads(output.search_tools),
        )
    # An image the tool returned (Codex's view_image) is listed as its part.
    shown = (
        content_parts(output.output, "input_text") if holds_images(output.output) else output.output
    )
    if output.custom:
        return {
            "id": item_id or new_id("ctco"),
            "type": "custom_tool_call_output",
            "call_id": output.call_id,
            "output": shown,
        }
    return {
        "id": item_id or new_id("fco"),
        "type": "function_call_output",
        "call_id": output.call_id,
        "output": shown,
        "status": "completed",
    }


def encode_compaction(compaction: Compaction) -> str:
    items = []
    for item in compaction.retained:
        shaped = item_json(item, "-")
        if shaped["id"] == "-" and getattr(item, "id", None) is None:
            del shaped["id"]  # minted again on output; an item's own id (a hosted one's) is kept
        items.append(shaped)
    payload = {"v": COMPACTION_FORMAT_VERSION, "summary": compaction.summary, "items": items}
    raw = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
