"""Compaction, the actor side: the summary generation and the checks around it.

Invariants:
- Four routes share one summary (``compact``: plan, summarize, render): a
  ``compaction_trigger`` (``compact_now``: checked with ``plan`` before anything exists, its
  summary is its response's output), automatic compaction (``compacted``: a foreground
  response's summary generates before it exists, a background job's inside the job; the
  compacted prompt comes back ready, a ``ReadyPrompt``, and is admitted as a plain one is), and
  ``/v1/responses/compact`` (``compact_history``). Which route a response takes is the
  lifecycle table's (``protocol/lifecycle.py``), not this module's.
- A summary is registered one way (``on_summary`` hears of its log as soon as it exists) and
  ends one way (its run's ``end(HUNG_UP)`` in a ``finally``: it leaves the batch, nothing is
  recorded).
- Nothing here stores or changes anything. ``compact`` counts, splits the history
  (``protocol.compaction.split_history``), generates one summary as an internal non-streaming
  response (``store: false``, temperature 0, no tools) on the same path as ``/v1/responses``
  (``admit`` then a ``ResponseRun``), in the caller's task (a response task: the supervisor's),
  and returns the compacted context. ``on_summary`` hears of the summary's log as soon as it
  exists: the compaction route's task registers it, so it is listed, cancellable and awaited.
- Refusals are 400 ``context_length_exceeded`` with ``param: "input"``, one message per case:
  the history is longer than one context window; the summary request does not fit in it; the
  compacted context is not shorter than the history (nothing older than the kept turns to
  summarize is one such case, found before generating).
- The summary's sequence never outlives the call: a cancelled caller (a cancelled background
  job, a hang-up) ends it in a ``finally``, which frees the batch.
- Token counts are rendered prompts, as ``/v1/responses/input_tokens`` counts them, with the
  request's instructions and tools: before is the history; after is the history with the
  compaction item appended (it stands in for what precedes it, ``replay_view``), which is the
  prompt a compacted response generates from and what its next ``previous_response_id`` hop
  replays.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from ..protocol.errors import ApiError, invalid_request
from ..protocol.events.machine import Compacted
from ..protocol.ids import new_id
from ..protocol.items.compaction import (
    NothingToSummarize,
    Split,
    auto_summary_tokens,
    default_keep_tokens,
    item_text,
    split_everything,
    split_history,
    transcript,
)
from ..protocol.items.read import Compaction, InputMessage, TurnItem
from ..protocol.items.write import item_json
from ..protocol.lifecycle import Input
from ..protocol.objects import JsonObject, ResponseConfig, Usage
from ..protocol.request import CompactRequest, CreateRequest
from .admission import admit
from .event_log import EventLog
from .prompt import PreparedPrompt, ReadyPrompt, prepare_prompt, render_items
from .run import ResponseRun
from .runtime import Actors, RunningResponses

SUMMARY_INSTRUCTIONS = (
    "You compact conversations. The user sends the transcript of a conversation between a user "
    "and an assistant. Write a summary that can replace it: keep the facts, names, numbers, "
    "decisions, tool results and open tasks; leave out pleasantries. Answer with the summary only."
)
# Role markers and separators an item adds to its text when rendered (an estimate: the
# compaction's split only needs costs that grow with the item).
ITEM_OVERHEAD_TOKENS = 4
# Told the summary's log once it exists (``None``: nobody listens).
OnSummary = Callable[[EventLog], Awaitable[None]] | None


@dataclass(frozen=True, slots=True)
class CompactionResult:
    kept: tuple[InputMessage, ...]  # system and developer messages, in order
    retained: tuple[TurnItem, ...]
    item: JsonObject  # the compaction item, with its cmp_ id
    prompt: tuple[int, ...]  # the compacted context, rendered
    opens_reasoning: bool  # the compacted prompt opened a reasoning block
    tokens_before: int
    usage: Usage  # the summary generation's

    @property
    def tokens_after(self) -> int:
        return len(self.prompt)


async def compact(
    request: CreateRequest,
    prepared: PreparedPrompt,
    actors: Actors,
    *,
    keep_tokens: int | None,
    summary_tokens: int,
    on_summary: OnSummary = None,
) -> CompactionResult:
    """Compact ``prepared`` (the request's history and input, rendered); raises ``ApiError``.
    ``keep_tokens`` None: summarize every turn (a ``compaction_trigger``); the client
    asked for exactly one compaction item then, so a summary that does not shorten the history
    is not refused (the rule that it must shorten is for ``/v1/responses/compact`` and automatic
    compaction)."""
    split = await plan(prepared, actors, keep_tokens)
    before = len(prepared.prompt)
    summary, usage = await _summarize(
        request,
        transcript(split.prior_summary, split.summarized),
        actors,
        summary_tokens,
        on_summary,
    )
    compaction = Compaction(summary, split.retained)
    item = item_json(compaction)
    parsed = (*prepared.items, compaction)  # the turn as read at preparation, not again
    compacted = await render_items(request, actors, (*prepared.all_items, item), parsed=parsed)
    prompt = compacted.prompt
    if keep_tokens is not None and len(prompt) >= before:
        raise cannot_compact(
            f"The summary does not shorten the context: the history is {before} tokens, "
            f"compacted it would be {len(prompt)} tokens."
        )
    return CompactionResult(
        split.kept, split.retained, item, prompt, compacted.opens_reasoning, before, usage
    )


async def compact_now(
    request: CreateRequest, prepared: PreparedPrompt, actors: Actors
) -> tuple[Compacted, Usage]:
    """A ``compaction_trigger``: the whole history as one compaction item (the
    machine input that makes it the response's output), and the summary's usage."""
    window = actors.model.info.context_window
    result = await compact(
        request, prepared, actors, keep_tokens=None, summary_tokens=auto_summary_tokens(window)
    )
    return Compacted(result.item, result.tokens_before, result.tokens_after), result.usage


async def _summarize(
    request: CreateRequest, text: str, actors: Actors, max_tokens: int, on_summary: OnSummary
) -> tuple[str, Usage]:
    """One non-streaming generation of the summary of ``text`` (a transcript)."""
    config = ResponseConfig(
        model=actors.model.info.alias,
        instructions=SUMMARY_INSTRUCTIONS,
        max_output_tokens=max_tokens,
        temperature=0.0,
        store=False,
    )
    summary_request = CreateRequest(
        config=config,
        input=(InputMessage("user", text),),
        stream=False,
        template_kwargs=request.template_kwargs,
        owner=request.owner,
    )
    try:
        prepared = await prepare_prompt(summary_request, actors)
        admission = await admit(summary_request, prepared, actors.model)
    except ApiError as error:
        if error.code != "context_length_exceeded":
            raise
        raise cannot_compact(
            f"The summary does not fit in the context window: {error.message}"
        ) from None
    run = ResponseRun(summary_request, prepared, actors, admission=admission)
    try:
        if on_summary is not None:
            await on_summary(run.log)
        await run.drive()
    finally:
        # Its caller left (cancelled, hung up): it leaves the batch and nothing is recorded.
        await run.end(Input.HUNG_UP)
    final = run.snapshot()
    if final["status"] not in ("completed", "incomplete"):
        why = (final.get("error") or {}).get("message") or f"it ended {final['status']}"
        raise ApiError(500, "server_error", f"The summary could not be generated: {why}")
    summary = "".join(
        part["text"]
        for item in final["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )
    counted = final["usage"]
    usage = Usage(
        input_tokens=counted["input_tokens"],
        cached_tokens=counted["input_tokens_details"]["cached_tokens"],
        output_tokens=counted["output_tokens"],
        reasoning_tokens=counted["output_tokens_details"]["reasoning_tokens"],
    )
    return summary.strip(), usage


async def compacted(
    request: CreateRequest,
    prepared: PreparedPrompt,
    actors: Actors,
    on_summary: OnSummary = None,
) -> ReadyPrompt:
    """Automatic compaction (``context_management``): the summary generates; the compacted
    prompt is ready to admit (with the request's grammar), with the machine input that puts
    the compaction item first in the output; raises ``ApiError``."""
    window = actors.model.info.context_window
    result = await compact(
        request,
        prepared,
        actors,
        keep_tokens=default_keep_tokens(window),
        summary_tokens=auto_summary_tokens(window),
        on_summary=on_summary,
    )
    compacted_prompt = PreparedPrompt(
        prepared.history,
        prepared.new_items,
        prepared.items,
        result.prompt,
        prepared.tools,
        grammar=prepared.grammar,
        opens_reasoning=result.opens_reasoning,
    )
    step = Compacted(result.item, result.tokens_before, result.tokens_after)
    budget = request.output_budget(len(result.prompt), window)
    return ReadyPrompt(request, compacted_prompt, False, budget, compaction=step)


async def compact_history(
    compact_request: CompactRequest,
    actors: Actors,
    running: RunningResponses | None = None,
    on_summary: OnSummary = None,
) -> JsonObject:
    """``POST /v1/responses/compact``: the ``response.compaction`` object. Stores nothing."""
    create = compact_request.create
    prepared = await prepare_prompt(create, actors, running)
    window = actors.model.info.context_window
    result = await compact(
        create,
        prepared,
        actors,
        keep_tokens=compact_request.keep_tokens or default_keep_tokens(window),
        summary_tokens=compact_request.max_output_tokens,
        on_summary=on_summary,
    )
    output = [item_json(item) for item in (*result.kept, *result.retained)]
    return {
        "id": new_id("cmpt"),
        "object": "response.compaction",
        "created_at": int(time.time()),
        "model": create.config.model,
        "output": [*output, result.item],
        "usage": result.usage.to_json(),
    }


def cannot_compact(message: str) -> ApiError:
    return invalid_request(message, "input", code="context_length_exceeded")


async def plan(prepared: PreparedPrompt, actors: Actors, keep_tokens: int | None) -> Split:
    """What a compaction would summarize and keep; a 400 ``context_length_exceeded`` when it
    cannot (the history is over one window, or has nothing to summarize): found before any
    generation."""
    model = actors.model
    window = model.info.context_window
    before = len(prepared.prompt)
    if before > window:
        raise cannot_compact(
            f"The history is {before} tokens, longer than the context window of {window} "
            "tokens; compaction needs it to fit in one window."
        )
    items = list(prepared.items)  # read once, at preparation

    def cost(item: TurnItem) -> int:
        return model.prompts.count_tokens(item_text(item)) + ITEM_OVERHEAD_TOKENS

    try:
        if keep_tokens is None:
            return split_everything(items)
        # Tokenizing a long history is real work: off the Trio thread.
        return await trio.to_thread.run_sync(split_history, items, cost, keep_tokens)
    except NothingToSummarize as exc:
        raise cannot_compact(
            f"The summary could not shorten the context of {before} tokens: {exc}."
        ) from None
