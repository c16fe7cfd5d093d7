"""Admission: a prepared prompt becomes a sequence in the model's batch.

Invariants:
- ``constrain`` compiles the grammar a request must follow before anything exists, so an
  invalid schema is a 400 and changes nothing.
- ``admit`` asks the model actor for a sequence; the model actor counts it until the thread
  reports it ended. A refusal (no room in the context window, the batch full, the server
  closing) raises ``ApiError`` and leaves nothing admitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import formats
from ..model.constrain import Grammar, InvalidSchema
from ..model.inbound import GrammarSpec
from ..model.penalties import sampling_adjust
from ..protocol.errors import ApiError, invalid_request
from ..protocol.machine import Compacted
from ..protocol.request import CreateRequest
from ..protocol.tools import call_targets
from .model import (
    GenerationRequest,
    GenerationSequence,
    ModelHandle,
    ModelOverloaded,
    ModelUnavailable,
)
from .output import OutputShaper
from .prompt import PreparedPrompt, context_exceeded

# The temperature OpenAI applies when a request gives none.
DEFAULT_TEMPERATURE = 1.0


@dataclass(frozen=True, slots=True)
class Admission:
    """A response's prompt admitted to the batch: what it generates from."""

    prepared: PreparedPrompt
    sequence: GenerationSequence
    shaper: OutputShaper
    compaction: Compacted | None = None  # the history was compacted first


async def constrain(request: CreateRequest, model: ModelHandle) -> Grammar | None:
    """The grammar a request's decoding must follow: a forced tool call (``tool_choice``
    ``required`` or a named function) or structured output; None when unconstrained.
    Compiled now, so an invalid schema is a 400 before anything exists."""
    choice, fmt = request.tool_choice, request.text_format
    # A custom tool goes as sent (its format constrains its input), under its offered name.
    tools = [
        {"type": "custom", "name": t.name, "format": dict(t.custom_format)}
        if t.custom_format is not None
        else t.to_json()
        for t in request.tools
    ]
    try:
        if choice.mode == "required" and tools:
            tool_format = model.info.tool_format
            return await model.compile(
                lambda c: c.tool_call(tools, name=choice.name, tool_format=tool_format)
            )
        if fmt.kind == "json_schema":
            schema, strict = dict(fmt.schema), fmt.strict
            return await model.compile(lambda c: c.json_schema(schema, strict=strict))
        if fmt.kind == "json_object":
            return await model.compile(lambda c: c.json_object())
    except InvalidSchema as exc:
        param = "text.format.schema" if choice.mode != "required" else "tools"
        raise invalid_request(f"Invalid schema for '{param}': {exc}", param) from exc
    except (NotImplementedError, RuntimeError) as exc:
        param = "tool_choice" if choice.mode == "required" else "text.format"
        raise invalid_request(f"Unsupported '{param}' for this model: {exc}", param) from exc
    return None


def output_shaper(
    request: CreateRequest, model: ModelHandle, prompt: tuple[int, ...]
) -> OutputShaper:
    info = model.info
    calls_allowed = request.tool_choice.mode != "none" and bool(request.tools)
    limits = [n for n in (request.config.max_tool_calls,) if n is not None]
    if not request.config.parallel_tool_calls:
        limits.append(1)
    parser = formats.get(info.tool_format).new_parser(
        formats.ParseOptions(
            tools_enabled=calls_allowed,
            reasoning=info.has_thinking,
            starts_in_reasoning=model.opens_reasoning(prompt),
            tool_schemas={tool.name: dict(tool.parameters) for tool in request.tools},
        )
    )
    return OutputShaper(
        parser,
        max_calls=min(limits) if limits else None,
        targets=call_targets(request.tools),  # namespaced and custom tools
        # What the model may call: the offered tools and those a tool search can load.
        declared=frozenset(
            name
            for tool in request.tools
            for name in (tool.name, *(loaded.name for loaded in tool.catalog))
        ),
    )


def output_budget(request: CreateRequest, prompt_tokens: int, window: int) -> int:
    """Generation is capped at the context left after the prompt (spec 000)."""
    room = window - prompt_tokens
    return min(request.config.max_output_tokens or room, room)


async def admit(
    request: CreateRequest,
    prepared: PreparedPrompt,
    model: ModelHandle,
    grammar: Grammar | None,
    compaction: Compacted | None = None,
) -> Admission:
    """Admit the prompt to the batch; raises ``ApiError`` (no room, server busy or closing)."""
    window = model.info.context_window
    if window - len(prepared.prompt) < 1:
        raise context_exceeded(prepared.prompt, window)
    config = request.config
    temperature = DEFAULT_TEMPERATURE if config.temperature is None else config.temperature
    shaper = output_shaper(request, model, prepared.prompt)
    try:
        sequence = await model.submit(
            GenerationRequest(
                prompt=prepared.prompt,
                max_tokens=output_budget(request, len(prepared.prompt), window),
                temperature=temperature,
                top_p=1.0 if config.top_p is None else config.top_p,
                top_logprobs=request.logprobs,
                seed=request.seed,
                # Built into logits processors on the generation thread, from this data.
                grammar=None if grammar is None else GrammarSpec(grammar.kind, grammar.source),
                adjust=sampling_adjust(request),
                stop_texts=request.stop_sequences,
                owner=request.owner,
                cache_key=config.prompt_cache_key,
            )
        )
    except ModelUnavailable as exc:
        raise ApiError(503, "server_error", str(exc), code="server_shutting_down") from exc
    except ModelOverloaded as exc:
        raise ApiError(503, "server_error", str(exc), code="server_overloaded") from exc
    return Admission(prepared, sequence, shaper, compaction)
