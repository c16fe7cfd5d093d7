"""``POST /v1/responses/compact``'s body at the HTTP edge and its conversion to the frozen
``CompactRequest`` (the create's schema, ``schemas.py``, shares its cache options and its
validation)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from ..protocol.errors import invalid_request
from ..protocol.items.compaction import DEFAULT_SUMMARY_TOKENS, MAX_SUMMARY_TOKENS
from ..protocol.objects import ResponseConfig
from ..protocol.request import CompactRequest, CreateRequest, parse_input
from .schemas import PromptCacheOptions, PromptCacheRetention, validate_body


class CompactBody(BaseModel):
    """``POST /v1/responses/compact``: the SDK's ``ResponseCompactParams`` plus our extensions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: StrictStr | None = None
    input: Any = None
    instructions: StrictStr | None = None
    previous_response_id: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    prompt_cache_retention: PromptCacheRetention | None = None
    service_tier: StrictStr | None = None
    image: Any = None
    # Extensions (docs/compaction.md).
    keep_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    max_output_tokens: Annotated[StrictInt, Field(ge=1, le=MAX_SUMMARY_TOKENS)] | None = None
    chat_template_kwargs: dict[StrictStr, Any] | None = None
    # Refused when given (compaction is unary; a conversation is sent as input), accepted as
    # keys so the refusal names them.
    stream: StrictBool | None = None
    conversation: Any = None


def parse_compact_request(data: object, *, owner: str = "") -> CompactRequest:
    """A decoded JSON body -> ``CompactRequest``, or an ``ApiError`` naming the bad field."""
    body, model = validate_body(CompactBody, data)
    if body.stream:
        raise invalid_request(
            "Invalid value for 'stream': compaction is unary, 'stream' must not be true.", "stream"
        )
    if body.conversation is not None:
        raise invalid_request(
            "Unsupported parameter: 'conversation' cannot be compacted; send the history as "
            "'input' or name its last response with 'previous_response_id'.",
            "conversation",
        )
    if body.input is None and body.previous_response_id is None:
        raise invalid_request(
            "Missing required parameter: 'input' (or 'previous_response_id').", "input"
        )
    if body.service_tier not in (None, "auto", "default"):
        raise invalid_request(
            f"Invalid value for 'service_tier': {body.service_tier!r}; this server has only "
            "the 'default' tier.",
            "service_tier",
        )
    config = ResponseConfig(
        model=model,
        instructions=body.instructions,
        store=False,
        previous_response_id=body.previous_response_id,
        prompt_cache_key=body.prompt_cache_key,
    )
    create = CreateRequest(
        config=config,
        input=() if body.input is None else parse_input(body.input),
        stream=False,
        template_kwargs=body.chat_template_kwargs or {},
        owner=owner,
    )
    return CompactRequest(
        create, body.keep_tokens, body.max_output_tokens or DEFAULT_SUMMARY_TOKENS
    )
