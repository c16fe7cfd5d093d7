"""Anthropic Messages' ``messages`` and ``system`` -> input items (``anthropic.py``; pure).

Invariants:
- Messages become items in order: text -> ``InputMessage``; ``tool_use`` -> ``FunctionCall``
  (``input`` as JSON text, ``id`` as ``call_id``); ``tool_result`` -> ``FunctionCallOutput``;
  ``thinking`` -> ``Reasoning``; ``redacted_thinking`` renders as nothing. Consecutive turns of
  one role are combined into one turn (Anthropic's rule), their texts joined by a blank line.
- Tool pairing is Anthropic's: every ``tool_use`` id is unique and answered by a
  ``tool_result`` at the start of the very next (user) message; every ``tool_result`` answers a
  ``tool_use`` of the message before it.
- Image and non-text document sources (the model is text-only) and a final assistant turn
  (prefill: the chat template always opens a new assistant turn) are a 400.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from ..errors import ApiError
from ..items.images import Content, ImageRef, Piece, content_of, join_content, text_of
from ..items.read import FunctionCall, FunctionCallOutput, InputItem, InputMessage, Reasoning
from .values import (
    JsonObject,
    bad,
    keyset,
    obj,
    one_of,
    only_keys,
    required,
    string,
    typed,
)

_TEXT_KEYS: Final = keyset("type text cache_control citations")
_TOOL_USE_KEYS: Final = keyset("type id name input cache_control caller toolset_name")
_TOOL_RESULT_KEYS: Final = keyset("type tool_use_id content is_error cache_control toolset_name")
_DOCUMENT_KEYS: Final = keyset("type source cache_control citations context title")
_USER_BLOCKS: Final = ("text", "document", "tool_result")
_ASSISTANT_BLOCKS: Final = ("text", "thinking", "redacted_thinking", "tool_use")


def _text_block(block: JsonObject, path: str) -> str:
    only_keys(block, _TEXT_KEYS, path)
    text = string(required(block, "text", path), f"{path}.text")
    if not text:
        raise bad(f"{path}.text", "text content blocks must be non-empty.")
    return text


def _document_text(block: JsonObject, path: str) -> str:
    """A document block's text: plain-text and content sources only (the model reads text)."""
    only_keys(block, _DOCUMENT_KEYS, path)
    source = obj(required(block, "source", path), f"{path}.source")
    kind = source.get("type")
    if kind == "text":
        text = string(required(source, "data", f"{path}.source"), f"{path}.source.data")
    elif kind == "content":
        content = required(source, "content", f"{path}.source")
        if isinstance(content, str):
            text = content
        else:
            blocks = typed(
                content, f"{path}.source.content", list, "a string or an array of content blocks"
            )
            text = text_of(_text_pieces(blocks, f"{path}.source.content", ("text", "document")))
    else:
        raise bad(
            f"{path}.source.type",
            f"{kind!r} documents are not supported: the served model is text-only; send a "
            "'text' or 'content' source.",
        )
    header = [
        string(block[key], f"{path}.{key}")
        for key in ("title", "context")
        if block.get(key) is not None
    ]
    return "\n\n".join([*header, text])


def _text_pieces(
    blocks: list[Any], path: str, allowed: tuple[str, ...], *, images: bool = False
) -> Content:
    """Text-like blocks (text, document) joined, with (``images``) the images the HTTP edge
    accepted in place of image blocks (``images.ImageRef``); other block types are refused."""
    pieces: list[tuple[bool, Piece]] = []
    for i, raw in enumerate(blocks):
        block_path = f"{path}.{i}"
        if isinstance(raw, ImageRef) and images:
            pieces.append((False, raw))
            continue
        block = obj(raw, block_path)
        kind = block.get("type")
        if kind == "text" and "text" in allowed:
            pieces.append((False, _text_block(block, block_path)))
        elif kind == "document" and "document" in allowed:
            pieces.append((True, _document_text(block, block_path)))
        else:
            raise _unsupported_block(kind, block_path, allowed)
    return _join(pieces)


def _join(pieces: list[tuple[bool, Piece]]) -> Content:
    """Adjacent text blocks are one text (as chat templates join parts); a document is set
    apart from its neighbours by a blank line."""
    out: list[Piece] = []
    previous_document = False
    for i, (document, text) in enumerate(pieces):
        if i and (document or previous_document):
            out.append("\n\n")
        out.append(text)
        previous_document = document
    return content_of(out)


def _unsupported_block(kind: object, path: str, allowed: tuple[str, ...]) -> ApiError:
    if kind is None:
        return bad(f"{path}.type", "Field required.")
    if kind == "image":
        reason = "the served model is text-only and has no image input."
    elif kind in ("search_result", "container_upload") or "tool" in str(kind):
        reason = "this server runs only client tools and has no server tools."
    else:
        reason = "it is not allowed here."
    names = ", ".join(repr(a) for a in allowed)
    return bad(f"{path}.type", f"{kind!r} is not supported: {reason} Supported: {names}.")


def _tool_result_content(content: object, path: str) -> Content:
    if isinstance(content, str):
        return content
    blocks = typed(content, path, list, "a string or an array of content blocks")
    return _text_pieces(blocks, path, ("text", "document"), images=True)


@dataclass(slots=True)
class _Turn:
    """One message decoded: its items, the tool_use ids it asks and the results it gives."""

    role: str
    items: list[InputItem]
    tool_uses: list[str]
    tool_results: list[tuple[str, str]]  # (tool_use_id, path)


def _user_turn(role: str, blocks: list[Any], path: str) -> _Turn:
    turn = _Turn(role, [], [], [])
    pieces: list[tuple[bool, Piece]] = []
    for i, raw in enumerate(blocks):
        block_path = f"{path}.{i}"
        if isinstance(raw, ImageRef):  # an image block the HTTP edge accepted
            pieces.append((False, raw))
            continue
        block = obj(raw, block_path)
        kind = block.get("type")
        if kind == "tool_result" and role == "user":
            if pieces:
                raise bad(
                    block_path,
                    "tool_result blocks must come first in the message content, before any text.",
                )
            only_keys(block, _TOOL_RESULT_KEYS, block_path)
            call_id = string(
                required(block, "tool_use_id", block_path), f"{block_path}.tool_use_id"
            )
            output = _tool_result_content(block.get("content") or "", f"{block_path}.content")
            is_error = typed(
                block.get("is_error", False), f"{block_path}.is_error", bool, "a boolean"
            )
            if is_error:
                # The chat template has no error flag: the model reads it in the output.
                output = join_content(["Error: ", output])
            turn.items.append(FunctionCallOutput(call_id, output))
            turn.tool_results.append((call_id, block_path))
        elif kind == "text":
            pieces.append((False, _text_block(block, block_path)))
        elif kind == "document" and role == "user":
            pieces.append((True, _document_text(block, block_path)))
        else:
            allowed = _USER_BLOCKS if role == "user" else ("text",)
            raise _unsupported_block(kind, block_path, allowed)
    if pieces:
        turn.items.append(InputMessage("user" if role == "user" else "system", _join(pieces)))
    return turn


def _assistant_turn(blocks: list[Any], path: str) -> _Turn:
    turn = _Turn("assistant", [], [], [])
    text: list[str] = []

    def flush_text() -> None:
        if text:
            turn.items.append(InputMessage("assistant", "".join(text)))
            text.clear()

    for i, raw in enumerate(blocks):
        block_path = f"{path}.{i}"
        block = obj(raw, block_path)
        match block.get("type"):
            case "text":
                text.append(_text_block(block, block_path))
            case "thinking":
                only_keys(block, frozenset({"type", "thinking", "signature"}), block_path)
                thinking = string(required(block, "thinking", block_path), f"{block_path}.thinking")
                string(block.get("signature", ""), f"{block_path}.signature")
                flush_text()
                turn.items.append(Reasoning(thinking))
            case "redacted_thinking":
                # Encrypted by another provider: nothing this model can read.
                only_keys(block, frozenset({"type", "data"}), block_path)
                string(required(block, "data", block_path), f"{block_path}.data")
            case "tool_use":
                only_keys(block, _TOOL_USE_KEYS, block_path)
                call_id = string(required(block, "id", block_path), f"{block_path}.id")
                name = string(required(block, "name", block_path), f"{block_path}.name")
                arguments = obj(required(block, "input", block_path), f"{block_path}.input")
                flush_text()
                turn.items.append(FunctionCall(call_id, name, json.dumps(arguments)))
                turn.tool_uses.append(call_id)
            case kind:
                raise _unsupported_block(kind, block_path, _ASSISTANT_BLOCKS)
    flush_text()
    return turn


def _turn(raw: object, path: str) -> _Turn:
    message = obj(raw, path)
    only_keys(message, frozenset({"role", "content"}), path)
    role = one_of(required(message, "role", path), f"{path}.role", ("user", "assistant", "system"))
    content = required(message, "content", path)
    if isinstance(content, str):
        if not content:
            raise bad(f"{path}.content", "all messages must have non-empty content.")
        content = [{"type": "text", "text": content}]
    blocks = typed(content, f"{path}.content", list, "a string or an array of content blocks")
    if not blocks:
        raise bad(f"{path}.content", "all messages must have non-empty content.")
    if role == "assistant":
        return _assistant_turn(blocks, f"{path}.content")
    return _user_turn(role, blocks, f"{path}.content")


def _check_pairing(turns: list[_Turn]) -> None:
    seen: set[str] = set()
    for index, turn in enumerate(turns):
        for call_id in turn.tool_uses:
            if call_id in seen:
                raise bad(f"messages.{index}", f"tool_use ids must be unique: {call_id!r}.")
            seen.add(call_id)
        previous = turns[index - 1].tool_uses if index else []
        answered = {call_id for call_id, _ in turn.tool_results}
        for call_id, path in turn.tool_results:
            if call_id not in previous:
                raise bad(
                    path,
                    f"unexpected tool_use_id found in tool_result blocks: {call_id!r}. Each "
                    "tool_result block must have a corresponding tool_use block in the previous "
                    "message.",
                )
        missing = [call_id for call_id in previous if call_id not in answered]
        if missing:
            raise bad(
                f"messages.{index}",
                "tool_use ids were found without tool_result blocks immediately after: "
                f"{', '.join(missing)}. Each tool_use block must have a corresponding "
                "tool_result block in the next message.",
            )
    if turns and turns[-1].tool_uses:
        raise bad(
            f"messages.{len(turns) - 1}",
            "tool_use ids were found without tool_result blocks immediately after: "
            f"{', '.join(turns[-1].tool_uses)}.",
        )


def decode_messages(raw: object) -> tuple[InputItem, ...]:
    messages = typed(raw, "messages", list, "an array of messages")
    if not messages:
        raise bad("messages", "at least one message is required.")
    turns = [_turn(message, f"messages.{i}") for i, message in enumerate(messages)]
    if turns[-1].role == "assistant":
        raise bad(
            f"messages.{len(turns) - 1}",
            "a final assistant message (prefill) is not supported: this server's chat template "
            "always starts a new assistant turn. End with a user message.",
        )
    _check_pairing(turns)
    items: list[InputItem] = []
    for turn in turns:
        for item in turn.items:
            last = items[-1] if items else None
            if (
                isinstance(item, InputMessage)
                and isinstance(last, InputMessage)
                and last.role == item.role
                and item.role in ("user", "assistant")
            ):
                items[-1] = InputMessage(item.role, join_content([last.text, item.text], "\n\n"))
            else:
                items.append(item)
    return tuple(items)


def decode_system(raw: object) -> str | None:
    if raw is None or isinstance(raw, str):
        return raw or None
    blocks = typed(raw, "system", list, "a string or an array of text blocks")
    return text_of(_text_pieces(blocks, "system", ("text",))) or None
