"""Anthropic Messages requests -> the internal ``CreateRequest`` (pure; decision 14).

A ``POST /v1/messages`` body is decoded under Anthropic's rules (the ``anthropic`` SDK's
``MessageCreateParams`` is the reference) and normalised once into the same frozen
``CreateRequest`` the Responses route builds, so both encodings run on the same response actor
and model actor.

Invariants:
- Every refusal is an ``ApiError`` 400 raised before anything exists; its message starts with
  the Anthropic-style dotted path of the offending value (``messages.1.content.0.type: ...``).
- Top-level keys are exactly the SDK's ``MessageCreateParams`` (``MessageCountTokensParams`` for
  count_tokens) plus ``temperature``, ``top_p`` and ``top_k``; any other key is a 400. ``null``
  for an optional key means "not given".
- Messages become items in order: text -> ``InputMessage``; ``tool_use`` -> ``FunctionCall``
  (``input`` as JSON text, ``id`` as ``call_id``); ``tool_result`` -> ``FunctionCallOutput``;
  ``thinking`` -> ``Reasoning``; ``redacted_thinking`` renders as nothing. Consecutive turns of
  one role are combined into one turn (Anthropic's rule), their texts joined by a blank line.
- Tool pairing is Anthropic's: every ``tool_use`` id is unique and answered by a
  ``tool_result`` at the start of the very next (user) message; every ``tool_result`` answers a
  ``tool_use`` of the message before it.
- What the server cannot honour and would change the answer is a 400, never silently
  dropped: image and non-text document sources (the model is text-only), server tools,
  containers, deferred tools, a final assistant turn (prefill: the chat template always opens
  a new assistant turn). ``top_k`` is honoured (a logits processor keeps the k most likely
  tokens). Hints with no effect on one local model (``cache_control``,
  ``output_config.effort``, ``speed``, ``service_tier``, ...) are type-checked and ignored.

Longer than most modules on purpose: it is Anthropic's whole request grammar, kept in one place
so every path rule reads together. The answer side is ``anthropic_stream.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from .errors import ApiError, invalid_request
from .items import FunctionCall, FunctionCallOutput, InputItem, InputMessage, Reasoning, json_type
from .objects import ResponseConfig
from .request import CreateRequest
from .text_format import TEXT, TextFormat
from .tools import FunctionTool, ToolChoice, schema_problem

__all__ = [
    "COUNT_TOKENS_KEYS",
    "CREATE_KEYS",
    "MessagesRequest",
    "parse_count_tokens_request",
    "parse_messages_request",
]

JsonObject = dict[str, Any]


def _keyset(names: str) -> frozenset[str]:
    return frozenset(names.split())


# The SDK's MessageCountTokensParams keys; create adds generation settings, and the sampling
# settings the SDK no longer types but the API (and decision 14's issue) still accepts.
COUNT_TOKENS_KEYS: Final = _keyset(
    "model messages system tools tool_choice thinking cache_control output_config speed "
    "user_profile_id workspace_id"
)
CREATE_KEYS: Final = COUNT_TOKENS_KEYS | _keyset(
    "max_tokens stream stop_sequences metadata container diagnostics inference_geo service_tier "
    "temperature top_p top_k"
)

_TOOL_NAME: Final = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_TEXT_KEYS: Final = _keyset("type text cache_control citations")
_TOOL_USE_KEYS: Final = _keyset("type id name input cache_control caller toolset_name")
_TOOL_RESULT_KEYS: Final = _keyset("type tool_use_id content is_error cache_control toolset_name")
_DOCUMENT_KEYS: Final = _keyset("type source cache_control citations context title")
_TOOL_KEYS: Final = _keyset(
    "type name description input_schema strict cache_control defer_loading "
    "eager_input_streaming input_examples allowed_callers"
)
_USER_BLOCKS: Final = ("text", "document", "tool_result")
_ASSISTANT_BLOCKS: Final = ("text", "thinking", "redacted_thinking", "tool_use")


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    """A decoded Messages request: the internal request plus what only Anthropic has."""

    create: CreateRequest
    max_tokens: int  # 0: validate and count the prompt, generate nothing (cache pre-warm)
    stop_sequences: tuple[str, ...] = ()
    omit_thinking: bool = False  # thinking.display == "omitted": blocks keep no text

    @property
    def model(self) -> str:
        return self.create.config.model


def _bad(path: str, message: str) -> ApiError:
    return invalid_request(f"{path}: {message}", path)


_T = TypeVar("_T")


def _typed(value: object, path: str, kind: type[_T] | tuple[type, ...], expected: str) -> _T:
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
        raise _bad(path, f"expected {expected}, but got {json_type(value)}.")
    return value  # type: ignore[return-value]


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _obj(value: object, path: str) -> JsonObject:
    return _typed(value, path, dict, "an object")


def _str(value: object, path: str) -> str:
    return _typed(value, path, str, "a string")


def _keys(obj: Mapping[str, Any], allowed: frozenset[str], path: str) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        where = f"{path}.{extra[0]}" if path else extra[0]
        raise _bad(where, "Extra inputs are not permitted.")


def _required(obj: Mapping[str, Any], key: str, path: str) -> Any:
    if obj.get(key) is None:
        raise _bad(f"{path}.{key}" if path else key, "Field required.")
    return obj[key]


def _number(value: object, path: str, low: float, high: float) -> float:
    number: float = _typed(value, path, (int, float), "a number")
    if not low <= number <= high:
        raise _bad(path, f"expected a number between {low:g} and {high:g}, but got {number!r}.")
    return float(number)


def _choice(value: object, path: str, allowed: tuple[str | None, ...]) -> Any:
    if value not in allowed:
        names = ", ".join(repr(a) for a in allowed if a is not None)
        raise _bad(path, f"{value!r} is not one of {names}.")
    return value


# --- content --------------------------------------------------------------------------------


def _text_block(block: JsonObject, path: str) -> str:
    _keys(block, _TEXT_KEYS, path)
    text = _str(_required(block, "text", path), f"{path}.text")
    if not text:
        raise _bad(f"{path}.text", "text content blocks must be non-empty.")
    return text


def _document_text(block: JsonObject, path: str) -> str:
    """A document block's text: plain-text and content sources only (the model reads text)."""
    _keys(block, _DOCUMENT_KEYS, path)
    source = _obj(_required(block, "source", path), f"{path}.source")
    kind = source.get("type")
    if kind == "text":
        text = _str(_required(source, "data", f"{path}.source"), f"{path}.source.data")
    elif kind == "content":
        content = _required(source, "content", f"{path}.source")
        text = _tool_result_text(content, f"{path}.source.content")
    else:
        raise _bad(
            f"{path}.source.type",
            f"{kind!r} documents are not supported: the served model is text-only; send a "
            "'text' or 'content' source.",
        )
    header = [
        _str(block[key], f"{path}.{key}")
        for key in ("title", "context")
        if block.get(key) is not None
    ]
    return "\n\n".join([*header, text])


def _text_pieces(blocks: list[Any], path: str, allowed: tuple[str, ...]) -> str:
    """Text-like blocks (text, document) joined; other block types are refused."""
    pieces: list[tuple[bool, str]] = []
    for i, raw in enumerate(blocks):
        block_path = f"{path}.{i}"
        block = _obj(raw, block_path)
        kind = block.get("type")
        if kind == "text" and "text" in allowed:
            pieces.append((False, _text_block(block, block_path)))
        elif kind == "document" and "document" in allowed:
            pieces.append((True, _document_text(block, block_path)))
        else:
            raise _unsupported_block(kind, block_path, allowed)
    return _join(pieces)


def _join(pieces: list[tuple[bool, str]]) -> str:
    """Adjacent text blocks are one text (as chat templates join parts); a document is set
    apart from its neighbours by a blank line."""
    out: list[str] = []
    previous_document = False
    for i, (document, text) in enumerate(pieces):
        if i and (document or previous_document):
            out.append("\n\n")
        out.append(text)
        previous_document = document
    return "".join(out)


def _unsupported_block(kind: object, path: str, allowed: tuple[str, ...]) -> ApiError:
    if kind is None:
        return _bad(f"{path}.type", "Field required.")
    if kind == "image":
        reason = "the served model is text-only and has no image input."
    elif kind in ("search_result", "container_upload") or "tool" in str(kind):
        reason = "this server runs only client tools and has no server tools."
    else:
        reason = "it is not allowed here."
    names = ", ".join(repr(a) for a in allowed)
    return _bad(f"{path}.type", f"{kind!r} is not supported: {reason} Supported: {names}.")


def _tool_result_text(content: object, path: str) -> str:
    if isinstance(content, str):
        return content
    blocks = _typed(content, path, list, "a string or an array of content blocks")
    return _text_pieces(blocks, path, ("text", "document"))


@dataclass(slots=True)
class _Turn:
    """One message decoded: its items, the tool_use ids it asks and the results it gives."""

    role: str
    items: list[InputItem]
    tool_uses: list[str]
    tool_results: list[tuple[str, str]]  # (tool_use_id, path)


def _user_turn(role: str, blocks: list[Any], path: str) -> _Turn:
    turn = _Turn(role, [], [], [])
    pieces: list[tuple[bool, str]] = []
    for i, raw in enumerate(blocks):
        block_path = f"{path}.{i}"
        block = _obj(raw, block_path)
        kind = block.get("type")
        if kind == "tool_result" and role == "user":
            if pieces:
                raise _bad(
                    block_path,
                    "tool_result blocks must come first in the message content, before any text.",
                )
            _keys(block, _TOOL_RESULT_KEYS, block_path)
            call_id = _str(_required(block, "tool_use_id", block_path), f"{block_path}.tool_use_id")
            output = _tool_result_text(block.get("content") or "", f"{block_path}.content")
            is_error = _typed(
                block.get("is_error", False), f"{block_path}.is_error", bool, "a boolean"
            )
            if is_error:
                # The chat template has no error flag: the model reads it in the output.
                output = f"Error: {output}"
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
        block = _obj(raw, block_path)
        match block.get("type"):
            case "text":
                text.append(_text_block(block, block_path))
            case "thinking":
                _keys(block, frozenset({"type", "thinking", "signature"}), block_path)
                thinking = _str(_required(block, "thinking", block_path), f"{block_path}.thinking")
                _str(block.get("signature", ""), f"{block_path}.signature")
                flush_text()
                turn.items.append(Reasoning(thinking))
            case "redacted_thinking":
                # Encrypted by another provider: nothing this model can read.
                _keys(block, frozenset({"type", "data"}), block_path)
                _str(_required(block, "data", block_path), f"{block_path}.data")
            case "tool_use":
                _keys(block, _TOOL_USE_KEYS, block_path)
                call_id = _str(_required(block, "id", block_path), f"{block_path}.id")
                name = _str(_required(block, "name", block_path), f"{block_path}.name")
                arguments = _obj(_required(block, "input", block_path), f"{block_path}.input")
                flush_text()
                turn.items.append(FunctionCall(call_id, name, json.dumps(arguments)))
                turn.tool_uses.append(call_id)
            case kind:
                raise _unsupported_block(kind, block_path, _ASSISTANT_BLOCKS)
    flush_text()
    return turn


def _turn(raw: object, path: str) -> _Turn:
    message = _obj(raw, path)
    _keys(message, frozenset({"role", "content"}), path)
    role = _choice(
        _required(message, "role", path), f"{path}.role", ("user", "assistant", "system")
    )
    content = _required(message, "content", path)
    if isinstance(content, str):
        if not content:
            raise _bad(f"{path}.content", "all messages must have non-empty content.")
        content = [{"type": "text", "text": content}]
    blocks = _typed(content, f"{path}.content", list, "a string or an array of content blocks")
    if not blocks:
        raise _bad(f"{path}.content", "all messages must have non-empty content.")
    if role == "assistant":
        return _assistant_turn(blocks, f"{path}.content")
    return _user_turn(role, blocks, f"{path}.content")


def _check_pairing(turns: list[_Turn]) -> None:
    seen: set[str] = set()
    for index, turn in enumerate(turns):
        for call_id in turn.tool_uses:
            if call_id in seen:
                raise _bad(f"messages.{index}", f"tool_use ids must be unique: {call_id!r}.")
            seen.add(call_id)
        previous = turns[index - 1].tool_uses if index else []
        answered = {call_id for call_id, _ in turn.tool_results}
        for call_id, path in turn.tool_results:
            if call_id not in previous:
                raise _bad(
                    path,
                    f"unexpected tool_use_id found in tool_result blocks: {call_id!r}. Each "
                    "tool_result block must have a corresponding tool_use block in the previous "
                    "message.",
                )
        missing = [call_id for call_id in previous if call_id not in answered]
        if missing:
            raise _bad(
                f"messages.{index}",
                "tool_use ids were found without tool_result blocks immediately after: "
                f"{', '.join(missing)}. Each tool_use block must have a corresponding "
                "tool_result block in the next message.",
            )
    if turns and turns[-1].tool_uses:
        raise _bad(
            f"messages.{len(turns) - 1}",
            "tool_use ids were found without tool_result blocks immediately after: "
            f"{', '.join(turns[-1].tool_uses)}.",
        )


def _messages(raw: object) -> tuple[InputItem, ...]:
    messages = _typed(raw, "messages", list, "an array of messages")
    if not messages:
        raise _bad("messages", "at least one message is required.")
    turns = [_turn(message, f"messages.{i}") for i, message in enumerate(messages)]
    if turns[-1].role == "assistant":
        raise _bad(
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
                items[-1] = InputMessage(item.role, f"{last.text}\n\n{item.text}")
            else:
                items.append(item)
    return tuple(items)


def _system(raw: object) -> str | None:
    if raw is None or isinstance(raw, str):
        return raw or None
    blocks = _typed(raw, "system", list, "a string or an array of text blocks")
    return _text_pieces(blocks, "system", ("text",)) or None


# --- tools ----------------------------------------------------------------------------------


def _tool(raw: object, path: str) -> FunctionTool:
    tool = _obj(raw, path)
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise _bad(
            f"{path}.type",
            f"{kind!r} is not supported: this server runs only client tools (no server tools "
            "such as web search, code execution, bash or text editing).",
        )
    _keys(tool, _TOOL_KEYS, path)
    name = _str(_required(tool, "name", path), f"{path}.name")
    if not _TOOL_NAME.match(name):
        raise _bad(f"{path}.name", f"{name!r} must match ^[a-zA-Z0-9_-]{{1,128}}$.")
    description = tool.get("description")
    if description is not None:
        _str(description, f"{path}.description")
    schema = _obj(_required(tool, "input_schema", path), f"{path}.input_schema")
    if schema.get("type") != "object":
        raise _bad(f"{path}.input_schema.type", "the input schema must have type 'object'.")
    problem = schema_problem(schema)
    if problem is not None:
        raise _bad(
            f"{path}.input_schema",
            f"the input schema of tool {name!r} is not a valid JSON Schema: {problem}.",
        )
    strict = _typed(tool.get("strict", False), f"{path}.strict", bool, "a boolean")
    if tool.get("defer_loading"):
        raise _bad(
            f"{path}.defer_loading", "deferred tools need tool search, which is not available."
        )
    return FunctionTool(name, description, schema, strict)


def _tools(raw: object) -> tuple[FunctionTool, ...]:
    if raw is None:
        return ()
    tools = tuple(
        _tool(tool, f"tools.{i}")
        for i, tool in enumerate(_typed(raw, "tools", list, "an array of tools"))
    )
    names = [tool.name for tool in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise _bad(f"tools.{i}.name", f"tool names must be unique: {name!r}.")
    return tools


def _tool_choice(raw: object, tools: tuple[FunctionTool, ...]) -> tuple[ToolChoice, bool]:
    """``tool_choice`` -> (choice, parallel tool calls allowed)."""
    if raw is None:
        return ToolChoice("auto"), True
    choice = _obj(raw, "tool_choice")
    kind = _choice(choice.get("type"), "tool_choice.type", ("auto", "any", "tool", "none"))
    allowed = {"type"} | ({"name"} if kind == "tool" else set())
    allowed |= {"disable_parallel_tool_use"} if kind != "none" else set()
    _keys(choice, frozenset(allowed), "tool_choice")
    serial = _typed(
        choice.get("disable_parallel_tool_use", False),
        "tool_choice.disable_parallel_tool_use",
        bool,
        "a boolean",
    )
    if kind in ("any", "tool") and not tools:
        raise _bad("tool_choice", f"tool_choice {kind!r} may only be specified with tools.")
    match kind:
        case "any":
            return ToolChoice("required"), not serial
        case "tool":
            name = _str(_required(choice, "name", "tool_choice"), "tool_choice.name")
            if name not in {tool.name for tool in tools}:
                raise _bad("tool_choice.name", f"{name!r} is not one of the tools.")
            return ToolChoice("required", name), not serial
        case "none":
            return ToolChoice("none"), True
    return ToolChoice("auto"), not serial


# --- settings -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Thinking:
    template_kwargs: Mapping[str, Any]
    omit: bool
    budget: int | None


def _thinking(raw: object) -> _Thinking:
    if raw is None:
        return _Thinking({}, False, None)
    config = _obj(raw, "thinking")
    kind = _choice(
        config.get("type"), "thinking.type", ("enabled", "disabled", "adaptive", "between_tools")
    )
    allowed = {"type"} | ({"budget_tokens"} if kind == "enabled" else set())
    allowed |= {"display"} if kind in ("enabled", "adaptive") else set()
    _keys(config, frozenset(allowed), "thinking")
    if kind == "disabled":
        # The bundled model (and Qwen3-style templates) reason unless told not to.
        return _Thinking({"enable_thinking": False}, False, None)
    budget = None
    if kind == "enabled":
        budget = _typed(
            _required(config, "budget_tokens", "thinking"),
            "thinking.budget_tokens",
            int,
            "an integer",
        )
        if budget < 1024:
            raise _bad("thinking.budget_tokens", f"must be at least 1024, but got {budget}.")
    display = _choice(config.get("display"), "thinking.display", ("summarized", "omitted", None))
    # The model's own reasoning runs either way: enabled, adaptive and between_tools alike.
    return _Thinking({}, display == "omitted", budget)


def _text_format(raw: object) -> TextFormat:
    if raw is None:
        return TEXT
    config = _obj(raw, "output_config")
    _keys(config, frozenset({"effort", "format"}), "output_config")
    # effort is a hint for the model's own deliberation; a local model has one setting.
    _choice(
        config.get("effort"),
        "output_config.effort",
        ("low", "medium", "high", "xhigh", "max", None),
    )
    fmt = config.get("format")
    if fmt is None:
        return TEXT
    fmt = _obj(fmt, "output_config.format")
    _keys(fmt, frozenset({"type", "schema"}), "output_config.format")
    _choice(fmt.get("type"), "output_config.format.type", ("json_schema",))
    schema = _obj(_required(fmt, "schema", "output_config.format"), "output_config.format.schema")
    return TextFormat("json_schema", "output", schema, strict=True)


def _ignored_settings(body: Mapping[str, Any]) -> None:
    """Settings with no effect here, type-checked so a typo is still a 400."""
    checks: dict[str, Callable[[object], object]] = {
        "cache_control": lambda v: _keys(
            _obj(v, "cache_control"), frozenset({"type", "ttl"}), "cache_control"
        ),
        "inference_geo": lambda v: _str(v, "inference_geo"),
        "service_tier": lambda v: _choice(v, "service_tier", ("auto", "standard_only")),
        "speed": lambda v: _choice(v, "speed", ("standard", "fast")),
        "user_profile_id": lambda v: _str(v, "user_profile_id"),
        "workspace_id": lambda v: _str(v, "workspace_id"),
        "diagnostics": lambda v: _keys(
            _obj(v, "diagnostics"), frozenset({"previous_message_id"}), "diagnostics"
        ),
    }
    for key, check in checks.items():
        if body.get(key) is not None:
            check(body[key])
    if body.get("container") is not None:
        raise _bad("container", "containers are not available: this server has no server tools.")


def _user_id(raw: object) -> str | None:
    if raw is None:
        return None
    metadata = _obj(raw, "metadata")
    _keys(metadata, frozenset({"user_id"}), "metadata")
    user_id = metadata.get("user_id")
    return None if user_id is None else _str(user_id, "metadata.user_id")


def _stop_sequences(raw: object) -> tuple[str, ...]:
    if raw is None:
        return ()
    sequences = _typed(raw, "stop_sequences", list, "an array of strings")
    for i, sequence in enumerate(sequences):
        if not _str(sequence, f"stop_sequences.{i}"):
            raise _bad(f"stop_sequences.{i}", "stop sequences must be non-empty.")
    return tuple(dict.fromkeys(sequences))


# --- the request ----------------------------------------------------------------------------


def _decode(raw: object, allowed: frozenset[str], *, owner: str) -> MessagesRequest:
    body = _typed(raw, "body", dict, "a JSON object")
    _keys(body, allowed, "")
    model = _str(_required(body, "model", ""), "model")
    counting = "max_tokens" not in allowed
    max_tokens = 0
    if not counting:
        max_tokens = _typed(_required(body, "max_tokens", ""), "max_tokens", int, "an integer")
        if max_tokens < 0:
            raise _bad("max_tokens", f"must be at least 0, but got {max_tokens}.")
    stream = body.get("stream") is not None and _typed(body["stream"], "stream", bool, "a boolean")
    temperature = top_p = None
    if body.get("temperature") is not None:
        temperature = _number(body["temperature"], "temperature", 0.0, 1.0)
    if body.get("top_p") is not None:
        top_p = _number(body["top_p"], "top_p", 0.0, 1.0)
    top_k = 0
    if body.get("top_k") is not None:
        top_k = _typed(body["top_k"], "top_k", int, "an integer")
        if top_k < 0:
            raise _bad("top_k", f"must be at least 0, but got {top_k}.")
    thinking = _thinking(body.get("thinking"))
    if thinking.budget is not None and not counting and thinking.budget >= max_tokens:
        raise _bad(
            "thinking.budget_tokens",
            f"must be less than max_tokens ({max_tokens}), but got {thinking.budget}.",
        )
    _ignored_settings(body)
    tools = _tools(body.get("tools"))
    tool_choice, parallel = _tool_choice(body.get("tool_choice"), tools)
    config = ResponseConfig(
        model=model,
        instructions=_system(body.get("system")),
        max_output_tokens=max_tokens or None,
        temperature=temperature,
        top_p=top_p,
        store=False,  # Anthropic has no stored messages
        user=_user_id(body.get("metadata")),
        parallel_tool_calls=parallel,
    )
    stop_sequences = _stop_sequences(body.get("stop_sequences"))
    create = CreateRequest(
        config=config,
        input=_messages(_required(body, "messages", "")),
        stream=stream,
        tools=tools,
        tool_choice=tool_choice,
        template_kwargs=thinking.template_kwargs,
        text_format=_text_format(body.get("output_config")),
        owner=owner,
        stop_sequences=stop_sequences,
        top_k=top_k,
    )
    return MessagesRequest(create, max_tokens, stop_sequences, thinking.omit)


def parse_messages_request(raw: object, *, owner: str = "") -> MessagesRequest:
    """A ``POST /v1/messages`` body -> the request, or a 400 naming the offending path."""
    return _decode(raw, CREATE_KEYS, owner=owner)


def parse_count_tokens_request(raw: object, *, owner: str = "") -> MessagesRequest:
    """A ``POST /v1/messages/count_tokens`` body (no ``max_tokens``) -> the request."""
    return _decode(raw, COUNT_TOKENS_KEYS, owner=owner)
