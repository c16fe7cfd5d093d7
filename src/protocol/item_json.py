"""Input items written out: the JSON shapes we store and list (``input_items``, a response's
history, conversation items) and a compaction item's ``encrypted_content`` (pure).

Invariants:
- ``item_json`` and ``items.read_item`` round-trip: ``read_item(item_json(x, id)) == x``, so a
  stored history replays exactly the items the original turn rendered.
- An image (a marker in a message's or a tool output's text, ``images.py``) is listed as its
  ``input_image`` part again.
- ``encode_compaction`` writes the summary and the retained items (without ids) as base64url
  JSON (spec 000, format ``COMPACTION_FORMAT_VERSION``); ``items.decode_compaction`` reads it.
"""

from __future__ import annotations

import base64
import json

from .ids import new_id
from .images import has_images, image_parts
from .item_types import (
    COMPACTION_FORMAT_VERSION,
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    InputMessage,
    JsonObject,
    Reasoning,
)
from .objects import (
    custom_tool_call_item,
    tool_search_call_item,
    tool_search_output_item,
)


def item_json(item: InputItem, item_id: str | None = None) -> JsonObject:
    """The stored / listed JSON shape of an input item, with its id."""
    match item:
        case InputMessage(role, text, phase):
            part_type = "output_text" if role == "assistant" else "input_text"
            part: JsonObject = {"type": part_type, "text": text}
            if part_type == "output_text":
                part["annotations"] = []
            message: JsonObject = {
                "id": item_id or new_id("msg"),
                "type": "message",
                "role": role,
                "status": "completed",
                # An image (a marker in the text) is listed as its input_image part.
                "content": image_parts(text, part_type) if has_images(text) else [part],
            }
            if phase is not None:
                message["phase"] = phase
            return message
        case FunctionCall(call_id, name, arguments, search=str(execution)):
            return tool_search_call_item(
                item_id or new_id("tsc"),
                call_id=call_id,
                execution="client" if execution == "client" else "server",
                arguments=arguments,
                status="completed",
            )
        case FunctionCallOutput(call_id, search=str(execution), search_tools=str(tools)):
            return tool_search_output_item(
                item_id or new_id("tso"),
                call_id=call_id,
                execution="client" if execution == "client" else "server",
                tools=json.loads(tools),
            )
        case FunctionCall(call_id, name, arguments, namespace, custom=True):
            return custom_tool_call_item(
                item_id or new_id("ctc"),
                call_id=call_id,
                name=name,
                text=arguments,
                namespace=namespace,
            )
        case FunctionCall(call_id, name, arguments, namespace):
            call: JsonObject = {
                "id": item_id or new_id("fc"),
                "type": "function_call",
                "call_id": call_id,
                "name": name,
                "arguments": arguments,
                "status": "completed",
            }
            if namespace is not None:
                call["namespace"] = namespace
            return call
        case FunctionCallOutput(call_id, output, custom=True):
            return {
                "id": item_id or new_id("ctco"),
                "type": "custom_tool_call_output",
                "call_id": call_id,
                "output": image_parts(output, "input_text") if has_images(output) else output,
            }
        case FunctionCallOutput(call_id, output):
            return {
                "id": item_id or new_id("fco"),
                "type": "function_call_output",
                "call_id": call_id,
                # An image the tool returned (Codex's view_image) is listed as its part.
                "output": image_parts(output, "input_text") if has_images(output) else output,
                "status": "completed",
            }
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


def encode_compaction(compaction: Compaction) -> str:
    items = []
    for item in compaction.retained:
        shaped = item_json(item, "-")
        del shaped["id"]  # ids are minted again on output; the content needs none
        items.append(shaped)
    payload = {"v": COMPACTION_FORMAT_VERSION, "summary": compaction.summary, "items": items}
    raw = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
