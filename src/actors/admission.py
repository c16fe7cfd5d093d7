"""Admission: a prepared prompt becomes a sequence in the model's batch.

Invariants:
- Admission only reads finished values (``prompt.ReadyPrompt``: the grammar is compiled
  there, before anything exists, so an invalid schema is a 400 and changes nothing).
- ``admit`` asks the model actor for a sequence; the model actor counts it until the thread
  reports it ended. A refusal (no room in the context window, the batch full, the server
  closing) raises ``ApiError`` and leaves nothing admitted.
- ``admit_ready`` is a response task's one call here; ``admit_continuation`` is a run's, after
  a server tool search (issue 13): render, grammar and admission of the next sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.constrain import Grammar
from ..model.inbound import GrammarSpec
from ..model.penalties import sampling_adjust
from ..protocol.errors import ApiError
from ..protocol.machine import Compacted
from ..protocol.objects import JsonObject
from ..protocol.request import CreateRequest
from .model import (
    GenerationRequest,
    GenerationSequence,
    ModelHandle,
    ModelOverloaded,
    ModelUnavailable,
)
from .output import OutputShaper, shaper_for
from .prompt import PreparedPrompt, ReadyPrompt, constrain, render_items
from .prompt_limit import context_exceeded, output_budget
from .runtime import Actors

# The temperature OpenAI applies when a request gives none.
DEFAULT_TEMPERATURE = 1.0


@dataclass(frozen=True, slots=True)
class Admission:
    """A response's prompt admitted to the batch: what it generates from."""

    prepared: PreparedPrompt
    sequence: GenerationSequence
    shaper: OutputShaper
    compaction: Compacted | None = None  # the history was compacted first


async def admit(
    request: CreateRequest,
    prepared: PreparedPrompt,
    model: ModelHandle,
    grammar: Grammar | None,
    compaction: Compacted | None = None,
    *,
    max_tokens: int | None = None,
) -> Admission:
    """Admit the prompt to the batch; raises ``ApiError`` (no room, server busy or closing).
    ``max_tokens`` caps the output below the request's own budget (a warm-up's one token)."""
    window = model.info.context_window
    if window - len(prepared.prompt) < 1:
        raise context_exceeded(prepared.prompt, window)
    config = request.config
    budget = output_budget(request, len(prepared.prompt), window)
    temperature = DEFAULT_TEMPERATURE if config.temperature is None else config.temperature
    info = model.info
    shaper = shaper_for(
        request, info.tool_format, info.has_thinking, model.opens_reasoning(prepared.prompt)
    )
    try:
        sequence = await model.submit(
            GenerationRequest(
                prompt=prepared.prompt,
                max_tokens=budget if max_tokens is None else min(budget, max_tokens),
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


async def admit_ready(ready: ReadyPrompt, model: ModelHandle) -> Admission | None:
    """A prepared response's sequence; None when its history is compacted first (the
    response task admits it after the summary, ``compaction.compact_and_admit``). A warm-up
    (``generate: false``) prefills its prompt and generates one token, which is not output."""
    request = ready.request
    if not request.generate:
        return await admit(request, ready.prepared, model, None, max_tokens=1)
    if ready.compacting:
        return None
    return await admit(request, ready.prepared, model, ready.grammar)


async def admit_continuation(
    request: CreateRequest, prepared: PreparedPrompt, output: tuple[JsonObject, ...], actors: Actors
) -> Admission:
    """After a server tool search: ``request`` (with the tools it loaded) over the items so
    far and ``output``, rendered, constrained and admitted; raises ``ApiError``."""
    prompt = await render_items(request, actors, prepared.all_items + output)
    grammar = await constrain(request, actors.model)
    following = PreparedPrompt(prepared.history, prepared.new_items, prompt)
    return await admit(request, following, actors.model, grammar)
