"""Input items written out: the JSON shapes we store and list (``input_items``, a response's
history, conversation items) and a compaction item's ``encrypted_content`` (pure).

Invariants:
- ``item_json`` and ``items.read_item`` round-trip: ``read_item(item_json(x, id)) == x``, so a
  stored history replays exactly the items the original turn rendered.
- A message's or a tool output's images (typed parts of its content, ``images.py``) are
  listed as ``input_image`` parts, between its text parts, in order.
- ``encode_compaction`` writes the summary and the retained items (without ids) as base64url
  JSON (format ``COMPACTION_FORMAT_VERSION``); ``items.decode_compaction`` reads it.
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
    Reasoning,
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
        del shaped["id"]  # ids are minted again on output; the content needs none
        items.append(shaped)
    payload = {"v": COMPACTION_FORMAT_VERSION, "summary": compaction.summary, "items": items}
    raw = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
