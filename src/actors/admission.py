"""Admission: a prepared prompt becomes a sequence in the model's batch.

Invariants:
- Admission only reads finished values (``prompt.ReadyPrompt``: the grammar is compiled
  there, before anything exists, so an invalid schema is a 400 and changes nothing; the output
  budget is computed there).
- ``admit`` asks the model actor for a sequence; the model actor counts it until the thread
  reports it ended. A refusal (no room in the context window, the batch full, the server
  closing) raises ``ApiError`` and leaves nothing admitted.
- ``admit_ready`` is a create's one call here (its prompt compacted first or not, the
  compacted one ready from ``compaction.compacted``); ``admit_continuation`` is a run's,
  after a server tool's call: render, grammar and admission of the next sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.port import GrammarSpec, sampling_adjust
from ..protocol.errors import ApiError, context_exceeded
from ..protocol.events.machine import Compacted
from ..protocol.objects import JsonObject
from ..protocol.request import CreateRequest
from .model import (
    Arrival,
    GenerationRequest,
    GenerationSequence,
    ModelHandle,
    ModelOverloaded,
    ModelUnavailable,
)
from .output import OutputShaper, shaper_for
from .prompt import PreparedPrompt, ReadyPrompt, render_items
from .runtime import Actors

# The temperature OpenAI applies when a request gives none.
DEFAULT_TEMPERATURE = 1.0


@dataclass(frozen=True, slots=True)
class Admission:
    """A response's prompt admitted to the batch: what it generates from."""

    sequence: GenerationSequence
    shaper: OutputShaper
    compaction: Compacted | None = None  # the history was compacted first


async def admit_ready(
    ready: ReadyPrompt, model: ModelHandle, arrival: Arrival | None = None
) -> Admission:
    """A prepared response's sequence, with the machine input of its history's compaction if
    it was compacted first (``ready.compaction``). A warm-up (``generate: false``) prefills
    its prompt and generates one token, which is not output, with no grammar."""
    request, prepared, budget = ready.request, ready.prepared, ready.budget
    window = model.info.context_window
    if budget < 1:
        raise context_exceeded(len(prepared.prompt), window)
    info = model.info
    shaper = shaper_for(request, info.tool_format, info.has_thinking, prepared.opens_reasoning)
    config = request.config
    temperature = DEFAULT_TEMPERATURE if config.temperature is None else config.temperature
    grammar = prepared.grammar if request.generate else None
    try:
        sequence = await model.submit(
            GenerationRequest(
                prompt=prepared.prompt,
                max_tokens=budget if request.generate else min(budget, 1),
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
            ),
            arrival,
        )
    except ModelUnavailable as exc:
        raise ApiError(503, "server_error", str(exc), code="server_shutting_down") from exc
    except ModelOverloaded as exc:
        raise ApiError(503, "server_error", str(exc), code="server_overloaded") from exc
    return Admission(sequence, shaper, ready.compaction)


async def admit(request: CreateRequest, prepared: PreparedPrompt, model: ModelHandle) -> Admission:
    """``prepared`` (a summary's prompt, a continuation) admitted for ``request``; raises
    ``ApiError``."""
    budget = request.output_budget(len(prepared.prompt), model.info.context_window)
    return await admit_ready(ReadyPrompt(request, prepared, False, budget), model)


async def admit_continuation(
    request: CreateRequest, prepared: PreparedPrompt, output: tuple[JsonObject, ...], actors: Actors
) -> Admission:
    """After a server tool search: ``request`` (with the tools it loaded) over the items so
    far and ``output``, rendered, constrained and admitted; raises ``ApiError``."""
    following = await render_items(request, actors, prepared.all_items + output, constrain=True)
    return await admit(request, following, actors.model)
