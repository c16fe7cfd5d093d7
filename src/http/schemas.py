"""Request bodies at the HTTP edge (the only place Pydantic is used) and their conversion.

Invariants:
- Every key of OpenAI's ``ResponseCreateParams`` (plus ``stream``) is accepted as a key; an
  unknown top-level key is a 400 naming it, as OpenAI answers.
- Scalars are strict: no string-to-number or number-to-bool coercion.
- A field whose value we cannot honour yet is a 400 saying so, never silently dropped.
- The result is the internal frozen ``CreateRequest`` (``compact_schema.py``: the ``CompactRequest``); nothing downstream
  sees Pydantic.
- ``tools`` are parsed by ``protocol/tools/parse.py``, then with ``tool_choice`` by
  ``tool_fields.py``; ``include`` values are checked by ``include.py``.
- ``context_management`` is ``[]`` / absent, or exactly ``[{"type": "compaction",
  "compact_threshold": N}]`` with N in 1..100000000; anything else is a 400 naming the path.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr
from pydantic import ValidationError as PydanticValidationError

from ..protocol.errors import ApiError, invalid_request
from ..protocol.items.sealed import Sealer, open_sealed
from ..protocol.objects import ResponseConfig
from ..protocol.request import CreateRequest, json_type, parse_input
from ..protocol.text_format import TextFormat, parse_text_format
from ..protocol.tools.hosted import HostedSwitches
from ..protocol.tools.parse import parse_request_tools
from .include import LOGPROBS_INCLUDE, SEALED_INCLUDE, SOURCES_INCLUDE, check_includable
from .tool_fields import RequestTools, request_tools

Number = StrictFloat | StrictInt


class StreamOptions(BaseModel):
    """``stream_options``: accepted, no effect (there is no obfuscation padding here)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    include_obfuscation: StrictBool | None = None


class PromptCacheOptions(BaseModel):
    """``prompt_cache_options``: checked as OpenAI types it, no effect here: the
    prefix cache is always implicit, lives in memory, and warms through WebSocket warm-ups."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    comparison_response_id: StrictStr | None = None
    mode: Literal["implicit", "explicit"] | None = None
    prewarm: StrictBool | None = None
    ttl: Literal["30m", "12h"] | None = None


PromptCacheRetention = Literal["in_memory", "24h"]


class CreateResponseBody(BaseModel):
    """``POST /v1/responses``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: StrictStr | None = None
    input: Any = None
    instructions: StrictStr | None = None
    max_output_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    store: StrictBool | None = None
    stream: StrictBool | None = None
    metadata: (
        dict[
            Annotated[StrictStr, Field(max_length=64)], Annotated[StrictStr, Field(max_length=512)]
        ]
        | None
    ) = None
    user: StrictStr | None = None
    safety_identifier: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None
    parallel_tool_calls: StrictBool | None = None
    truncation: StrictStr | None = None
    service_tier: StrictStr | None = None
    # Accepted keys whose non-default values later work will honour.
    background: StrictBool | None = None
    tools: Any = None
    tool_choice: Any = None
    max_tool_calls: Annotated[StrictInt, Field(ge=1)] | None = None
    # Extensions (documented in docs/api.md).
    chat_template_kwargs: dict[StrictStr, Any] | None = None
    text: Any = None
    reasoning: Any = None
    include: list[StrictStr] | None = None
    previous_response_id: StrictStr | None = None
    conversation: Any = None
    context_management: Any = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    # mlx's random key takes a 64-bit signed seed; outside that the sampler cannot start.
    seed: Annotated[StrictInt, Field(ge=0, le=2**63 - 1)] | None = None
    prompt: Any = None
    stream_options: StreamOptions | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    prompt_cache_retention: PromptCacheRetention | None = None
    access_programs: Any = None
    background_options: Any = None
    image: Any = None
    moderation: Any = None
    # Sent by real clients and accepted by OpenAI before an SDK types them. Codex
    # puts whole JSON documents in its values (x-codex-turn-metadata), so no metadata-like caps.
    client_metadata: (
        dict[
            Annotated[StrictStr, Field(max_length=256)],
            Annotated[StrictStr, Field(max_length=65536)],
        ]
        | None
    ) = None
    # Open Responses sampling fields, honoured by logits processors.
    presence_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None


# Keys that are accepted but whose non-empty/non-default values this build cannot honour yet.
_NOT_YET: dict[str, str] = {
    "prompt": "prompt templates",
    "image": "image",
    "background_options": "background_options",
    "access_programs": "access_programs",
    "moderation": "moderation",
}


def _unsupported(param: str, what: str) -> ApiError:
    return invalid_request(f"Unsupported parameter: '{param}' ({what}) is not supported.", param)


def _check_not_yet(body: CreateResponseBody) -> None:
    for key, what in _NOT_YET.items():
        value = getattr(body, key)
        if value is None or value == []:
            continue
        raise _unsupported(key, what)
    if body.background and body.stream:
        raise invalid_request(
            "Parameters 'background' and 'stream' cannot both be true: create the background "
            "response, then stream it with GET /v1/responses/{id}?stream=true.",
            "stream",
        )
    if body.truncation not in (None, "disabled"):
        raise invalid_request(
            f"Invalid value for 'truncation': {body.truncation!r}; only 'disabled' is supported.",
            "truncation",
        )
    if body.service_tier not in (None, "auto", "default"):
        raise invalid_request(
            f"Invalid value for 'service_tier': {body.service_tier!r}; this server has only "
            "the 'default' tier.",
            "service_tier",
        )
    for i, value in enumerate(body.include or ()):
        check_includable(value, f"include[{i}]")
    if body.top_p is not None and body.top_p <= 0:
        raise invalid_request(
            f"Invalid value for 'top_p': {body.top_p!r}; expected a number in (0, 1].", "top_p"
        )


_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
_SUMMARIES = ("auto", "concise", "detailed")


def _parse_reasoning(reasoning: object) -> tuple[str | None, str | None]:
    """``reasoning`` -> (effort, summary), echoed; effort is not mapped to the template."""
    if reasoning is None:
        return None, None
    if not isinstance(reasoning, dict):
        raise invalid_request(
            f"Invalid type for 'reasoning': expected an object, but got {json_type(reasoning)}.",
            "reasoning",
        )
    unknown = set(reasoning) - {"effort", "summary", "generate_summary", "context", "mode"}
    if unknown:
        key = sorted(unknown)[0]
        raise invalid_request(f"Unknown parameter: 'reasoning.{key}'.", f"reasoning.{key}")
    effort = reasoning.get("effort")
    if effort is not None and effort not in _EFFORTS:
        raise invalid_request(
            f"Invalid value for 'reasoning.effort': {effort!r}; supported values are "
            f"{', '.join(repr(e) for e in _EFFORTS)}.",
            "reasoning.effort",
        )
    summary = reasoning.get("summary", reasoning.get("generate_summary"))
    if summary is not None and summary not in _SUMMARIES:
        raise invalid_request(
            f"Invalid value for 'reasoning.summary': {summary!r}; supported values are "
            f"{', '.join(repr(e) for e in _SUMMARIES)}.",
            "reasoning.summary",
        )
    return effort, summary


_Body = TypeVar("_Body", bound=BaseModel)


def validate_body(schema: type[_Body], data: object) -> tuple[_Body, str]:
    """A JSON object validated by ``schema``, and its ``model`` (required); else a 400."""
    if not isinstance(data, dict):
        raise invalid_request(
            f"Invalid request body: expected a JSON object, but got {json_type(data)}.", None
        )
    try:
        body = schema.model_validate(data)
    except PydanticValidationError as exc:
        raise validation_error(exc) from None
    model = getattr(body, "model", None)
    if not isinstance(model, str):
        raise invalid_request("Missing required parameter: 'model'.", "model")
    return body, model


def parse_create_request(
    data: object,
    *,
    drop_unsupported_tools: bool = False,
    owner: str = "",
    sealer: Sealer | None = None,
    default_temperature: float | None = None,
    background_key: bool = False,
    hosted: HostedSwitches | None = None,
) -> CreateRequest:
    """A decoded JSON body -> ``CreateRequest``, or an ``ApiError`` naming the bad field.
    ``sealer`` opens sealed reasoning in ``input`` and seals the output's when asked."""
    body, model = validate_body(CreateResponseBody, data)
    if body.input is None:
        raise invalid_request("Missing required parameter: 'input'.", "input")
    _check_not_yet(body)
    compact_threshold = _compact_threshold(body.context_management)
    raw_input, compact_now = _compaction_trigger(body.input)
    conversation_id = _conversation_id(body.conversation)
    if body.previous_response_id is not None and conversation_id is not None:
        raise invalid_request(
            "Parameters 'previous_response_id' and 'conversation' cannot be used together.",
            "conversation",
        )
    messages = open_sealed(parse_input(raw_input), sealer)
    switches = dataclasses.replace(
        hosted or HostedSwitches(), drop_unsupported=drop_unsupported_tools
    )
    parsed_tools, servers = parse_request_tools(body.tools, switches)
    text_format, verbosity = parse_text_format(body.text)
    reasoning = _parse_reasoning(body.reasoning)
    tools = request_tools(parsed_tools, servers, body.tool_choice, messages)
    config = _response_config(
        body,
        model,
        conversation_id=conversation_id,
        tools=tools,
        text_format=text_format,
        verbosity=verbosity,
        reasoning=reasoning,
        default_temperature=default_temperature,
        background_key=background_key,
    )
    include = body.include or ()
    if SOURCES_INCLUDE in include:
        config = dataclasses.replace(config, sources_included=True)
    return CreateRequest(
        config=config,
        input=messages,
        stream=bool(body.stream),
        tools=tools.offered,
        tool_choice=tools.choice,
        declared_tools=tools.declared,
        mcp_servers=servers,
        mcp_choice=tools.mcp_choice,
        template_kwargs=body.chat_template_kwargs or {},
        logprobs=(body.top_logprobs or 0) if LOGPROBS_INCLUDE in include else None,
        seed=body.seed,
        text_format=text_format,
        owner=owner,
        compact_threshold=compact_threshold,
        compact_now=compact_now,
        seal=sealer.seal if sealer is not None and SEALED_INCLUDE in include else None,
    )


def _response_config(
    body: CreateResponseBody,
    model: str,
    *,
    conversation_id: str | None,
    tools: RequestTools,
    text_format: TextFormat,
    verbosity: str,
    reasoning: tuple[str | None, str | None],
    default_temperature: float | None,
    background_key: bool,
) -> ResponseConfig:
    """What the Response object echoes of its request, defaults filled in."""
    effort, summary = reasoning
    return ResponseConfig(
        model=model,
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        temperature=default_temperature if body.temperature is None else float(body.temperature),
        top_p=None if body.top_p is None else float(body.top_p),
        store=True if body.store is None else body.store,
        metadata=body.metadata or {},
        user=body.user,
        safety_identifier=body.safety_identifier,
        prompt_cache_key=body.prompt_cache_key,
        parallel_tool_calls=True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        previous_response_id=body.previous_response_id,
        conversation_id=conversation_id,
        background=bool(body.background),
        background_key=background_key,
        tools=tools.echoed,
        tool_choice=tools.choice.to_json(),
        max_tool_calls=body.max_tool_calls,
        top_logprobs=body.top_logprobs or 0,
        reasoning_effort=effort,
        reasoning_summary=summary,  # type: ignore[arg-type]
        text_format=text_format.to_json(),
        verbosity=verbosity,  # type: ignore[arg-type]
        presence_penalty=float(body.presence_penalty or 0),
        frequency_penalty=float(body.frequency_penalty or 0),
    )


MAX_COMPACT_THRESHOLD = 100_000_000  # OpenAI's bound (docs/compaction.md)


TRIGGER_KEYS = frozenset({"type", "id"})


def _compaction_trigger(value: object) -> tuple[object, bool]:
    """A ``compaction_trigger`` item ends the input of a create that compacts the
    history before it (Codex's remote compaction); the input without it, and whether it was
    there. Anywhere else it is the 400 OpenAI gives."""
    if not isinstance(value, list):
        return value, False
    at = [
        i
        for i, item in enumerate(value)
        if isinstance(item, dict) and item.get("type") == "compaction_trigger"
    ]
    if not at:
        return value, False
    if at[0] != len(value) - 1:
        raise invalid_request(
            f"Invalid 'input[{at[0]}]': 'compaction_trigger' must be the final input item.",
            f"input[{at[0]}]",
        )
    extra = sorted(set(value[-1]) - TRIGGER_KEYS)
    if extra:
        path = f"input[{at[0]}].{extra[0]}"
        raise invalid_request(f"Unknown parameter: '{path}'.", path)
    return value[:-1], True


def _compact_threshold(value: object) -> int | None:
    """``context_management`` -> the compaction threshold, or None when absent or empty."""
    if value is None or value == []:
        return None
    param = "context_management"
    if not isinstance(value, list):
        raise invalid_request(
            f"Invalid type for '{param}': expected an array, but got {json_type(value)}.", param
        )
    if len(value) > 1:
        raise invalid_request(
            f"Invalid value for '{param}': expected one entry of type 'compaction', got "
            f"{len(value)} entries.",
            param,
        )
    entry, path = value[0], f"{param}[0]"
    if not isinstance(entry, dict):
        raise invalid_request(
            f"Invalid type for '{path}': expected an object, but got {json_type(entry)}.", path
        )
    extra = sorted(set(entry) - {"type", "compact_threshold"})
    if extra:
        raise invalid_request(f"Unknown parameter: '{path}.{extra[0]}'.", f"{path}.{extra[0]}")
    if entry.get("type") != "compaction":
        raise invalid_request(
            f"Invalid value for '{path}.type': {entry.get('type')!r}; the only supported "
            "context management type is 'compaction'.",
            f"{path}.type",
        )
    threshold = entry.get("compact_threshold")
    if threshold is None:
        raise invalid_request(
            f"Missing required parameter: '{path}.compact_threshold'.", f"{path}.compact_threshold"
        )
    if type(threshold) is not int or not 1 <= threshold <= MAX_COMPACT_THRESHOLD:
        shown = (
            repr(threshold) if isinstance(threshold, int | float | str) else json_type(threshold)
        )
        raise invalid_request(
            f"Invalid value for '{path}.compact_threshold': {shown}; expected an integer from 1 "
            f"to {MAX_COMPACT_THRESHOLD}.",
            f"{path}.compact_threshold",
        )
    return threshold


def _conversation_id(value: object) -> str | None:
    """``conversation`` is an id string or ``{"id": ...}``."""
    if value is None:
        return None
    if isinstance(value, str) and value:
        return value
    if isinstance(value, dict) and set(value) == {"id"} and isinstance(value["id"], str):
        return value["id"]
    raise invalid_request(
        f"Invalid value for 'conversation': expected a conversation id string or an object "
        f'{{"id": "conv_..."}}, but got {json_type(value)}.',
        "conversation",
    )


_TYPE_TAGS = ("str", "int", "float", "bool", "list", "dict", "none", "constrained")


def _param_from_loc(loc: tuple[int | str, ...]) -> str:
    """Pydantic's error location as a JSON path, without the union-member tags it inserts."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif "[" in part or part.lower() in _TYPE_TAGS or part.startswith("function-"):
            continue
        else:
            path += f".{part}" if path else part
    return path


def validation_error(exc: PydanticValidationError) -> ApiError:
    first = exc.errors()[0]
    param = _param_from_loc(tuple(first["loc"]))
    if first["type"] == "extra_forbidden":
        return invalid_request(f"Unknown parameter: '{param}'.", param)
    value = first.get("input")
    got = json_type(value)
    shown = repr(value) if isinstance(value, int | float | str | bool) else got
    return invalid_request(f"Invalid value for '{param}': {shown} ({first['msg']}).", param)
