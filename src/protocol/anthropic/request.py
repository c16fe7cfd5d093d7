"""Anthropic Messages requests -> the internal ``CreateRequest`` (pure).

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
- ``messages`` and ``system`` become input items by ``anthropic_messages.py`` (Anthropic's
  turn combining and tool pairing); each value is read at its path by ``anthropic_values.py``.
- What the server cannot honour and would change the answer is a 400, never silently
  dropped: image and non-text document sources (the model is text-only), server tools,
  containers, deferred tools, a final assistant turn (prefill: the chat template always opens
  a new assistant turn). ``top_k`` is honoured (a logits processor keeps the k most likely
  tokens). Hints with no effect on one local model (``cache_control``,
  ``output_config.effort``, ``speed``, ``service_tier``, ...) are type-checked and ignored.

Anthropic's request grammar is these three modules: the body and its settings here, the
messages in ``anthropic_messages.py``, the path-checked readers in ``anthropic_values.py``.
The answer side is ``anthropic_stream.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..objects import ResponseConfig
from ..request import CreateRequest
from ..text_format import TEXT, TextFormat
from ..tools.offered import FunctionTool, ToolChoice, schema_problem
from .messages import decode_messages, decode_system
from .values import (
    bad,
    keyset,
    number_between,
    obj,
    one_of,
    only_keys,
    required,
    string,
    typed,
)

__all__ = [
    "COUNT_TOKENS_KEYS",
    "CREATE_KEYS",
    "MessagesRequest",
    "parse_count_tokens_request",
    "parse_messages_request",
]


# The SDK's MessageCountTokensParams keys; create adds generation settings, and the sampling
# settings the SDK no longer types but the API still accepts.
COUNT_TOKENS_KEYS: Final = keyset(
    "model messages system tools tool_choice thinking cache_control output_config speed "
    "user_profile_id workspace_id"
)
CREATE_KEYS: Final = COUNT_TOKENS_KEYS | keyset(
    "max_tokens stream stop_sequences metadata container diagnostics inference_geo service_tier "
    "temperature top_p top_k"
)

_TOOL_NAME: Final = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_TOOL_KEYS: Final = keyset(
    "type name description input_schema strict cache_control defer_loading "
    "eager_input_streaming input_examples allowed_callers"
)


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


# --- tools ----------------------------------------------------------------------------------


def _tool(raw: object, path: str) -> FunctionTool:
    tool = obj(raw, path)
    kind = tool.get("type")
    if isinstance(kind, str) and kind.startswith("web_search_"):
        raise bad(
            f"{path}.type",
            f"{kind!r} is not supported: on /v1/messages this server runs only client tools; "
            "its web search is a Responses API tool (POST /v1/responses with a 'web_search' "
            "tool on a server started with --web-search; docs/tools.md).",
        )
    if kind not in (None, "custom"):
        raise bad(
            f"{path}.type",
            f"{kind!r} is not supported: this server runs only client tools (no server tools "
            "such as web search, code execution, bash or text editing).",
        )
    only_keys(tool, _TOOL_KEYS, path)
    name = string(required(tool, "name", path), f"{path}.name")
    if not _TOOL_NAME.match(name):
        raise bad(f"{path}.name", f"{name!r} must match ^[a-zA-Z0-9_-]{{1,128}}$.")
    description = tool.get("description")
    if description is not None:
        string(description, f"{path}.description")
    schema = obj(required(tool, "input_schema", path), f"{path}.input_schema")
    if schema.get("type") != "object":
        raise bad(f"{path}.input_schema.type", "the input schema must have type 'object'.")
    problem = schema_problem(schema)
    if problem is not None:
        raise bad(
            f"{path}.input_schema",
            f"the input schema of tool {name!r} is not a valid JSON Schema: {problem}.",
        )
    strict = typed(tool.get("strict", False), f"{path}.strict", bool, "a boolean")
    if tool.get("defer_loading"):
        raise bad(
            f"{path}.defer_loading", "deferred tools need tool search, which is not available."
        )
    return FunctionTool(name, description, schema, strict)


def _tools(raw: object) -> tuple[FunctionTool, ...]:
    if raw is None:
        return ()
    tools = tuple(
        _tool(tool, f"tools.{i}")
        for i, tool in enumerate(typed(raw, "tools", list, "an array of tools"))
    )
    names = [tool.name for tool in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise bad(f"tools.{i}.name", f"tool names must be unique: {name!r}.")
    return tools


def _tool_choice(raw: object, tools: tuple[FunctionTool, ...]) -> tuple[ToolChoice, bool]:
    """``tool_choice`` -> (choice, parallel tool calls allowed)."""
    if raw is None:
        return ToolChoice("auto"), True
    choice = obj(raw, "tool_choice")
    kind = one_of(choice.get("type"), "tool_choice.type", ("auto", "any", "tool", "none"))
    allowed = {"type"} | ({"name"} if kind == "tool" else set())
    allowed |= {"disable_parallel_tool_use"} if kind != "none" else set()
    only_keys(choice, frozenset(allowed), "tool_choice")
    serial = typed(
        choice.get("disable_parallel_tool_use", False),
        "tool_choice.disable_parallel_tool_use",
        bool,
        "a boolean",
    )
    if kind in ("any", "tool") and not tools:
        raise bad("tool_choice", f"tool_choice {kind!r} may only be specified with tools.")
    match kind:
        case "any":
            return ToolChoice("required"), not serial
        case "tool":
            name = string(required(choice, "name", "tool_choice"), "tool_choice.name")
            if name not in {tool.name for tool in tools}:
                raise bad("tool_choice.name", f"{name!r} is not one of the tools.")
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
    config = obj(raw, "thinking")
    kind = one_of(
        config.get("type"), "thinking.type", ("enabled", "disabled", "adaptive", "between_tools")
    )
    allowed = {"type"} | ({"budget_tokens"} if kind == "enabled" else set())
    allowed |= {"display"} if kind in ("enabled", "adaptive") else set()
    only_keys(config, frozenset(allowed), "thinking")
    if kind == "disabled":
        # The bundled model (and Qwen3-style templates) reason unless told not to.
        return _Thinking({"enable_thinking": False}, False, None)
    budget = None
    if kind == "enabled":
        budget = typed(
            required(config, "budget_tokens", "thinking"),
            "thinking.budget_tokens",
            int,
            "an integer",
        )
        if budget < 1024:
            raise bad("thinking.budget_tokens", f"must be at least 1024, but got {budget}.")
    display = one_of(config.get("display"), "thinking.display", ("summarized", "omitted", None))
    # The model's own reasoning runs either way: enabled, adaptive and between_tools alike.
    return _Thinking({}, display == "omitted", budget)


def _text_format(raw: object) -> TextFormat:
    if raw is None:
        return TEXT
    config = obj(raw, "output_config")
    only_keys(config, frozenset({"effort", "format"}), "output_config")
    # effort is a hint for the model's own deliberation; a local model has one setting.
    one_of(
        config.get("effort"),
        "output_config.effort",
        ("low", "medium", "high", "xhigh", "max", None),
    )
    fmt = config.get("format")
    if fmt is None:
        return TEXT
    fmt = obj(fmt, "output_config.format")
    only_keys(fmt, frozenset({"type", "schema"}), "output_config.format")
    one_of(fmt.get("type"), "output_config.format.type", ("json_schema",))
    schema = obj(required(fmt, "schema", "output_config.format"), "output_config.format.schema")
    return TextFormat("json_schema", "output", schema, strict=True)


def _ignored_settings(body: Mapping[str, Any]) -> None:
    """Settings with no effect here, type-checked so a typo is still a 400."""
    checks: dict[str, Callable[[object], object]] = {
        "cache_control": lambda v: only_keys(
            obj(v, "cache_control"), frozenset({"type", "ttl"}), "cache_control"
        ),
        "inference_geo": lambda v: string(v, "inference_geo"),
        "service_tier": lambda v: one_of(v, "service_tier", ("auto", "standard_only")),
        "speed": lambda v: one_of(v, "speed", ("standard", "fast")),
        "user_profile_id": lambda v: string(v, "user_profile_id"),
        "workspace_id": lambda v: string(v, "workspace_id"),
        "diagnostics": lambda v: only_keys(
            obj(v, "diagnostics"), frozenset({"previous_message_id"}), "diagnostics"
        ),
    }
    for key, check in checks.items():
        if body.get(key) is not None:
            check(body[key])
    if body.get("container") is not None:
        raise bad("container", "containers are not available: this server has no server tools.")


def _user_id(raw: object) -> str | None:
    if raw is None:
        return None
    metadata = obj(raw, "metadata")
    only_keys(metadata, frozenset({"user_id"}), "metadata")
    user_id = metadata.get("user_id")
    return None if user_id is None else string(user_id, "metadata.user_id")


def _stop_sequences(raw: object) -> tuple[str, ...]:
    if raw is None:
        return ()
    sequences = typed(raw, "stop_sequences", list, "an array of strings")
    for i, sequence in enumerate(sequences):
        if not string(sequence, f"stop_sequences.{i}"):
            raise bad(f"stop_sequences.{i}", "stop sequences must be non-empty.")
    return tuple(dict.fromkeys(sequences))


# --- the request ----------------------------------------------------------------------------


def _decode(raw: object, allowed: frozenset[str], *, owner: str) -> MessagesRequest:
    body = typed(raw, "body", dict, "a JSON object")
    only_keys(body, allowed, "")
    model = string(required(body, "model", ""), "model")
    counting = "max_tokens" not in allowed
    max_tokens = 0
    if not counting:
        max_tokens = typed(required(body, "max_tokens", ""), "max_tokens", int, "an integer")
        if max_tokens < 0:
            raise bad("max_tokens", f"must be at least 0, but got {max_tokens}.")
    stream = body.get("stream") is not None and typed(body["stream"], "stream", bool, "a boolean")
    temperature = top_p = None
    if body.get("temperature") is not None:
        temperature = number_between(body["temperature"], "temperature", 0.0, 1.0)
    if body.get("top_p") is not None:
        top_p = number_between(body["top_p"], "top_p", 0.0, 1.0)
    top_k = 0
    if body.get("top_k") is not None:
        top_k = typed(body["top_k"], "top_k", int, "an integer")
        if top_k < 0:
            raise bad("top_k", f"must be at least 0, but got {top_k}.")
    thinking = _thinking(body.get("thinking"))
    if thinking.budget is not None and not counting and thinking.budget >= max_tokens:
        raise bad(
            "thinking.budget_tokens",
            f"must be less than max_tokens ({max_tokens}), but got {thinking.budget}.",
        )
    _ignored_settings(body)
    tools = _tools(body.get("tools"))
    tool_choice, parallel = _tool_choice(body.get("tool_choice"), tools)
    config = ResponseConfig(
        model=model,
        instructions=decode_system(body.get("system")),
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
        input=decode_messages(required(body, "messages", "")),
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
