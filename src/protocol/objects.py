"""The Response object and its parts, as JSON-ready dicts shaped like the pinned ``openai`` SDK.

Invariants:
- Every builder returns fresh ``dict``/``list`` values that ``json.dumps`` accepts and that
  validate strictly (``Response.model_validate(..., strict=True)``) with no key the SDK model
  does not define; callers may mutate what they get back.
- Timestamps are integer Unix seconds (the SDK types them ``float``; OpenAI sends integers).
- A foreground object has no ``background`` key at all; a background one carries
  ``"background": true``.
- ``store``, ``presence_penalty`` and ``frequency_penalty`` are echoed on every Response object
  (Open Responses requires them) though the pinned SDK's ``Response`` model does not
  declare them; they are the documented extension keys (docs/api.md).
- :class:`ResponseConfig` is deeply immutable: nested JSON (tools, text format, metadata) is
  frozen into read-only mappings and tuples at construction and thawed into fresh JSON on output.
- Logprobs come in two SDK shapes: a content part's entry (``ResponseOutputText.Logprob``:
  ``token``, ``logprob``, ``bytes``, ``top_logprobs`` of ``{token, bytes, logprob}``, all
  required) and a text event's entry (``ResponseTextDeltaEvent.Logprob``: ``token``,
  ``logprob``, ``top_logprobs`` of ``{token, logprob}``, no ``bytes``). We hold the part shape
  and derive the event shape with :func:`event_logprob`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal, TypeVar, cast, get_args

__all__ = [
    "RESPONSE_ERROR_CODES",
    "TERMINAL_STATUSES",
    "ItemStatus",
    "JsonObject",
    "ResponseConfig",
    "ResponseErrorCode",
    "ResponseStatus",
    "Usage",
    "event_logprob",
    "function_call_item",
    "is_part_logprob",
    "mcp_approval_request_item",
    "mcp_call_item",
    "mcp_list_tools_item",
    "message_item",
    "output_text_part",
    "part_logprob",
    "reasoning_item",
    "reasoning_text_part",
    "response_object",
    "web_search_call_item",
]

JsonObject = dict[str, Any]
"""A JSON object as ``json.loads`` returns it."""

ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]
HostedStatus = Literal["in_progress", "completed", "incomplete", "failed"]
"""A server-run call's status (``web_search_call``, ``mcp_call``): it may also fail."""

TERMINAL_STATUSES: Final = frozenset({"completed", "incomplete", "failed", "cancelled"})

# The SDK types `Response.error.code` as this closed Literal (openai 3.57
# `types/responses/response_error.py`); any other code fails strict validation.
ResponseErrorCode = Literal[
    "server_error",
    "rate_limit_exceeded",
    "invalid_prompt",
    "data_residency_mismatch",
    "bio_policy",
    "misalignment_policy_violation",
    "vector_store_timeout",
    "invalid_image",
    "invalid_image_format",
    "invalid_base64_image",
    "invalid_image_url",
    "image_too_large",
    "image_too_small",
    "image_parse_error",
    "image_content_policy_violation",
    "invalid_image_mode",
    "image_file_too_large",
    "unsupported_image_media_type",
    "empty_image_file",
    "failed_to_download_image",
    "image_file_not_found",
]
RESPONSE_ERROR_CODES: Final[frozenset[str]] = frozenset(get_args(ResponseErrorCode))


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one response, as the model counted them."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Usage.{name} must be a non-negative int, got {value!r}")
        if self.cached_tokens > self.input_tokens:
            raise ValueError("Usage.cached_tokens cannot exceed input_tokens")
        if self.reasoning_tokens > self.output_tokens:
            raise ValueError("Usage.reasoning_tokens cannot exceed output_tokens")

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_json(self) -> JsonObject:
        return {
            "input_tokens": self.input_tokens,
            # `cache_write_tokens` is REQUIRED by the 3.57 SDK; a local prompt cache has no
            # billed cache writes, so it is always 0.
            "input_tokens_details": {"cached_tokens": self.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.total_tokens,
        }


def _freeze(value: object) -> object:
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


_T = TypeVar("_T")


def json_copy(value: _T) -> _T:
    """A deep copy of a JSON value (dicts, lists, scalars): what ``copy.deepcopy`` gives for
    one, several times faster (no memo; JSON has no shared or cyclic parts)."""
    return cast(_T, _json_copy(value))


def _json_copy(value: Any) -> Any:
    kind = type(value)
    if kind is dict:
        return {k: _json_copy(v) for k, v in value.items()}
    if kind is list:
        return [_json_copy(v) for v in value]
    return value


def _thaw(value: object) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_thaw(v) for v in value]
    return value


def _text_format_default() -> Mapping[str, object]:
    return MappingProxyType({"type": "text"})


def _empty_mapping() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ResponseConfig:
    """The request settings a Response object echoes, already validated at the HTTP edge.

    ``None`` means "not given"; the echo fills in what OpenAI echoes then (temperature and top_p
    1.0). Nested JSON is deep-frozen in ``__post_init__``.
    """

    model: str
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    store: bool = True
    metadata: Mapping[str, str] = field(default_factory=_empty_mapping)
    background: bool = False
    # --background-key always: a foreground Response says ``"background": false``
    # too, as OpenAI does; by default it has no such key.
    background_key: bool = False
    previous_response_id: str | None = None
    conversation_id: str | None = None
    user: str | None = None
    parallel_tool_calls: bool = True
    tool_choice: str | Mapping[str, object] = "auto"
    tools: Sequence[Mapping[str, object]] = ()
    max_tool_calls: int | None = None
    text_format: Mapping[str, object] = field(default_factory=_text_format_default)
    verbosity: Literal["low", "medium", "high"] = "medium"
    reasoning_effort: str | None = None
    reasoning_summary: Literal["auto", "concise", "detailed"] | None = None
    top_logprobs: int = 0
    truncation: Literal["auto", "disabled"] = "disabled"
    service_tier: str = "default"
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # include "web_search_call.action.sources": done searches list their sources. Not echoed.
    sources_included: bool = False

    def __post_init__(self) -> None:
        # Frozen dataclass: the documented way to normalise fields is object.__setattr__.
        object.__setattr__(self, "metadata", _freeze(self.metadata))
        object.__setattr__(self, "tools", _freeze(self.tools))
        object.__setattr__(self, "text_format", _freeze(self.text_format))
        if not isinstance(self.tool_choice, str):
            object.__setattr__(self, "tool_choice", _freeze(self.tool_choice))


def output_text_part(text: str, logprobs: Sequence[Mapping[str, Any]] = ()) -> JsonObject:
    """An ``output_text`` content part (no annotations); ``logprobs`` are part-shaped entries."""
    return {
        "type": "output_text",
        "text": text,
        "annotations": [],
        "logprobs": [part_logprob(entry) for entry in logprobs],
    }


def reasoning_text_part(text: str) -> JsonObject:
    """A ``reasoning_text`` content part (of a reasoning item, or in ``content_part`` events)."""
    return {"type": "reasoning_text", "text": text}


def reasoning_item(item_id: str, status: ItemStatus, content: Sequence[JsonObject]) -> JsonObject:
    """A ``reasoning`` output item with raw reasoning text and no summary."""
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [],
        "content": list(content),
        "status": status,
    }


def function_call_item(
    item_id: str,
    *,
    call_id: str,
    name: str,
    arguments: str,
    status: ItemStatus,
    namespace: str | None = None,
) -> JsonObject:
    """A ``function_call`` output item; ``arguments`` is JSON text (possibly partial);
    ``namespace`` only for a function of a namespace tool."""
    item: JsonObject = {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }
    if namespace is not None:
        item["namespace"] = namespace
    return item


def custom_tool_call_item(
    item_id: str, *, call_id: str, name: str, text: str, namespace: str | None = None
) -> JsonObject:
    """A ``custom_tool_call`` output item (the SDK's type has no ``status``)."""
    item: JsonObject = {
        "id": item_id,
        "type": "custom_tool_call",
        "call_id": call_id,
        "name": name,
        "input": text,
    }
    if namespace is not None:
        item["namespace"] = namespace
    return item


Execution = Literal["server", "client"]


def tool_search_call_item(
    item_id: str, *, call_id: str, execution: Execution, arguments: str, status: str
) -> JsonObject:
    """A ``tool_search_call`` output item; ``arguments`` (JSON text) as an object."""
    try:
        value: object = json.loads(arguments) if arguments else {}
    except ValueError:
        value = arguments  # an in-progress or unparsable call keeps its text
    return {
        "id": item_id,
        "type": "tool_search_call",
        "call_id": call_id or None,
        "execution": execution,
        "arguments": value,
        "status": status,
    }


def tool_search_output_item(
    item_id: str, *, call_id: str, execution: Execution, tools: Sequence[Mapping[str, Any]]
) -> JsonObject:
    """A ``tool_search_output`` item: the loaded tool definitions."""
    return {
        "id": item_id,
        "type": "tool_search_output",
        "call_id": call_id or None,
        "execution": execution,
        "status": "completed",
        "tools": [dict(tool) for tool in tools],
    }


def web_search_call_item(item_id: str, *, status: HostedStatus, action: JsonObject) -> JsonObject:
    """A ``web_search_call`` output item; ``action`` is ``search`` (``query``, and ``sources``
    of ``{"type": "url", "url"}`` when asked for), ``open_page`` (``url``) or ``find_in_page``
    (``url``, ``pattern``)."""
    return {"id": item_id, "type": "web_search_call", "status": status, "action": _thaw(action)}


def mcp_call_item(
    item_id: str,
    *,
    server_label: str,
    name: str,
    arguments: str,
    status: HostedStatus,
    output: str | None = None,
    error: Mapping[str, Any] | None = None,
    approval_request_id: str | None = None,
) -> JsonObject:
    """An ``mcp_call`` output item; ``error`` in the SDK's ``McpToolCallError`` shape
    (``mcp_protocol_error`` / ``mcp_tool_execution_error`` / ``http_error``)."""
    return {
        "id": item_id,
        "type": "mcp_call",
        "server_label": server_label,
        "name": name,
        "arguments": arguments,
        "approval_request_id": approval_request_id,
        "output": output,
        "error": _thaw(error),
        "status": status,
    }


def mcp_list_tools_item(
    item_id: str,
    *,
    server_label: str,
    tools: Sequence[Mapping[str, Any]],
    error: str | None = None,
) -> JsonObject:
    """An ``mcp_list_tools`` output item; each tool ``{name, input_schema, description?,
    annotations?}``; ``error`` (a string) only when listing failed."""
    item: JsonObject = {
        "id": item_id,
        "type": "mcp_list_tools",
        "server_label": server_label,
        "tools": [_thaw(tool) for tool in tools],
    }
    if error is not None:
        item["error"] = error
    return item


def mcp_approval_request_item(
    item_id: str, *, server_label: str, name: str, arguments: str
) -> JsonObject:
    """An ``mcp_approval_request`` output item (the SDK's type has no ``status``)."""
    return {
        "id": item_id,
        "type": "mcp_approval_request",
        "server_label": server_label,
        "name": name,
        "arguments": arguments,
    }


_PART_LOGPROB_KEYS: Final = frozenset({"token", "logprob", "bytes", "top_logprobs"})
_TOP_LOGPROB_KEYS: Final = frozenset({"token", "logprob", "bytes"})


def _is_token_logprob(value: object, keys: frozenset[str]) -> bool:
    if not isinstance(value, Mapping) or set(value) != keys:
        return False
    logprob, raw = value["logprob"], value["bytes"]
    return (
        isinstance(value["token"], str)
        and isinstance(logprob, int | float)
        and not isinstance(logprob, bool)
        and math.isfinite(logprob)
        and isinstance(raw, list | tuple)
        and all(type(b) is int and 0 <= b <= 255 for b in raw)
    )


def is_part_logprob(value: object) -> bool:
    """Whether ``value`` is a complete part-shaped logprob entry that JSON can carry."""
    if not _is_token_logprob(value, _PART_LOGPROB_KEYS):
        return False
    assert isinstance(value, Mapping)
    top = value["top_logprobs"]
    return isinstance(top, list | tuple) and all(
        _is_token_logprob(entry, _TOP_LOGPROB_KEYS) for entry in top
    )


def part_logprob(entry: Mapping[str, Any]) -> JsonObject:
    """A fresh JSON copy of a part-shaped logprob entry."""
    copied: JsonObject = _thaw(entry)
    return copied


def event_logprob(entry: Mapping[str, Any]) -> JsonObject:
    """The text-event shape of a part-shaped logprob entry (``bytes`` dropped at both levels)."""
    return {
        "token": entry["token"],
        "logprob": entry["logprob"],
        "top_logprobs": [
            {"token": top["token"], "logprob": top["logprob"]} for top in entry["top_logprobs"]
        ],
    }


def message_item(item_id: str, status: ItemStatus, content: Sequence[JsonObject]) -> JsonObject:
    """An assistant ``message`` output item."""
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": list(content),
    }


def response_object(
    *,
    response_id: str,
    config: ResponseConfig,
    created_at: int,
    status: ResponseStatus,
    output: Sequence[JsonObject],
    usage: Usage | None,
    error: Mapping[str, object] | None,
    incomplete_details: Mapping[str, object] | None,
    completed_at: int | None,
) -> JsonObject:
    """The full Response object (``object: "response"``), keys in OpenAI's order."""
    obj: JsonObject = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
    }
    if config.background or config.background_key:
        obj["background"] = config.background
    obj.update(
        {
            "completed_at": completed_at,
            "error": _thaw(error),
            "incomplete_details": _thaw(incomplete_details),
            "instructions": config.instructions,
            "max_output_tokens": config.max_output_tokens,
            "max_tool_calls": config.max_tool_calls,
            "model": config.model,
            "output": list(output),
            "parallel_tool_calls": config.parallel_tool_calls,
            "presence_penalty": config.presence_penalty,
            "frequency_penalty": config.frequency_penalty,
            "previous_response_id": config.previous_response_id,
            "prompt_cache_key": config.prompt_cache_key,
            "reasoning": {"effort": config.reasoning_effort, "summary": config.reasoning_summary},
            "safety_identifier": config.safety_identifier,
            "service_tier": config.service_tier,
            "store": config.store,
            "temperature": 1.0 if config.temperature is None else config.temperature,
            "text": {"format": _thaw(config.text_format), "verbosity": config.verbosity},
            "tool_choice": _thaw(config.tool_choice),
            "tools": _thaw(config.tools),
            "top_logprobs": config.top_logprobs,
            "top_p": 1.0 if config.top_p is None else config.top_p,
            "truncation": config.truncation,
            "usage": None if usage is None else usage.to_json(),
            "user": config.user,
            "metadata": _thaw(config.metadata),
        }
    )
    if config.conversation_id is not None:
        obj["conversation"] = {"id": config.conversation_id}
    return obj
