"""Preparation: a request resolved against its history, rendered and checked (no side effects).

Invariants:
- Everything here can refuse a request (model name, history lookup, render, the context
  window, a compaction that cannot be done, the grammar) and nothing here changes state, so a
  refusal raises ``ApiError`` and leaves no trace.
- ``prepare_response`` is a response task's one call here, first on its way down: its
  ``ReadyPrompt`` is a finished value that admission and the run only read.
- ``previous_response_id`` replays the whole chain (decision 9): a stored record keeps the
  history it was generated from. A parent that is still running is refused, not waited for.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import trio

from .. import formats
from ..model.chat import ChatMessage, to_chat
from ..model.constrain import Grammar, InvalidSchema
from ..model.prompt_bounds import PromptTooLong
from ..protocol.compaction import (
    NothingToSummarize,
    Split,
    item_text,
    split_everything,
    split_history,
)
from ..protocol.errors import ApiError, invalid_request, not_found
from ..protocol.history import history_tools, input_items, items_from_json
from ..protocol.items import TurnItem
from ..protocol.objects import JsonObject
from ..protocol.prompt_memo import RenderedPrompt
from ..protocol.request import CreateRequest
from ..protocol.tools import FunctionTool
from .model import ModelHandle
from .prompt_limit import context_exceeded, output_budget, prompt_limit, too_long_to_tokenize
from .runtime import Actors, RunningResponses

# The store bytes a background job is assumed to need per token of its output budget.
BYTES_PER_TOKEN = 16
# Role markers and separators an item adds to its text when rendered (an estimate: the
# compaction's split only needs costs that grow with the item).
ITEM_OVERHEAD_TOKENS = 4


@dataclass(frozen=True, slots=True)
class PreparedPrompt:
    """A request resolved against its history and rendered."""

    history: tuple[JsonObject, ...]  # items replayed before this request's input
    new_items: tuple[JsonObject, ...]  # this request's input, ids assigned
    prompt: tuple[int, ...]
    # The tools offered once the history's tool searches loaded theirs (``history_tools``);
    # None: the request's own ``tools``.
    tools: tuple[FunctionTool, ...] | None = None
    # This render, kept for the next turn when the request asked (``keep_render``).
    rendered: RenderedPrompt | None = None

    @property
    def all_items(self) -> tuple[JsonObject, ...]:
        return self.history + self.new_items


def check_model(request: CreateRequest, model: ModelHandle) -> None:
    info = model.info
    if request.config.model not in (info.alias, info.path):
        raise not_found(
            f"The model '{request.config.model}' does not exist; this server serves "
            f"'{info.alias}'.",
            param="model",
            code="model_not_found",
        )


def persistence_disabled(what: str) -> ApiError:
    return invalid_request(
        f"{what} is not available: response persistence is disabled on this server "
        "(--responses-store-max-entries 0).",
        None,
    )


async def load_history(
    request: CreateRequest, actors: Actors, running: RunningResponses | None
) -> tuple[JsonObject, ...]:
    """The items a ``previous_response_id`` or ``conversation`` replays (decision 9)."""
    config = request.config
    if request.replay is not None:
        return request.replay
    if config.previous_response_id is not None:
        previous_id = config.previous_response_id
        if not actors.store.enabled:
            raise persistence_disabled("previous_response_id")
        record = await actors.store.get(previous_id, request.owner)
        if record is None and running is not None:
            log = await running.find(previous_id, request.owner)
            if log is not None and not log.closed:
                status = log.snapshot()["status"]
                raise invalid_request(
                    f"previous response '{previous_id}' has not finished (status: {status})",
                    "previous_response_id",
                )
        if record is None:
            raise invalid_request(
                f"Previous response with id '{previous_id}' not found. It may have been "
                "created with store: false, deleted, or evicted from the store.",
                "previous_response_id",
                code="previous_response_not_found",
            )
        return record.input_items + tuple(record.response.get("output", ()))
    if config.conversation_id is not None:
        conversation_id = config.conversation_id
        if not actors.conversations.enabled:
            raise invalid_request(
                "conversation is not available: the conversation store is disabled on this "
                "server (--conversation-store-max-entries 0).",
                "conversation",
            )
        conversation = await actors.conversations.get(conversation_id, request.owner)
        if conversation is None:
            raise not_found(
                f"Conversation with id '{conversation_id}' not found.",
                param="conversation",
                code="conversation_not_found",
            )
        return conversation.items
    return ()


async def render_messages(
    request: CreateRequest, actors: Actors, items: tuple[JsonObject, ...]
) -> list[ChatMessage]:
    """``instructions`` first (merged into the system message), then the items, with the
    reasoning of earlier plain replies echoed back where a replay dropped it."""
    parsed = items_from_json(items)
    if actors.echo is not None:
        parsed = await actors.echo.restore(request.owner, parsed)
    replay = formats.get(actors.model.info.tool_format).replay
    return to_chat(request.config.instructions, parsed, replay)


async def render_items(
    request: CreateRequest,
    actors: Actors,
    items: tuple[JsonObject, ...],
    max_tokens: int | None = None,
) -> tuple[int, ...]:
    """The token ids of ``items`` rendered as ``request`` renders (instructions, tools); with
    ``max_tokens``, a prompt provably longer is refused before it is tokenized."""
    return (await _render(request, actors, items, max_tokens))[0]


async def _render(
    request: CreateRequest,
    actors: Actors,
    items: tuple[JsonObject, ...],
    max_tokens: int | None = None,
) -> tuple[tuple[int, ...], RenderedPrompt | None]:
    """``render_items``; with ``keep_render`` (issue 14), the text the request's previous render
    shares is not tokenized again (the same ids), and this render comes back too."""
    # With tool_choice "none" the model is not told about the tools at all.
    offered = request.tools if request.tool_choice.mode != "none" else ()
    replay = formats.get(actors.model.info.tool_format).replay  # the template's wishes
    tools = replay.template_tools([tool.for_template() for tool in offered]) or None
    # Spec 000: reasoning.effort is echoed, never mapped onto template kwargs; a family's
    # defaults apply and chat_template_kwargs sets its own (docs/models.md names each key).
    kwargs = replay.template_kwargs(None, request.template_kwargs)
    try:
        chat = await render_messages(request, actors, items)
        if request.keep_render:
            rendered = await actors.model.render_continuing(
                chat, tools, kwargs, max_tokens, request.previous_render
            )
            if rendered is not None:
                return rendered.ids, rendered
        prompt = await actors.model.render(chat, tools, kwargs, max_tokens)
    except PromptTooLong as exc:  # refused untokenized
        raise too_long_to_tokenize(exc, actors.model.info.context_window) from None
    except Exception as exc:  # the template's own error (Jinja, a raise_exception call, ...)
        raise invalid_request(
            f"The model's chat template could not render this input: {exc}",
            "input",
            code="invalid_prompt",
        ) from exc
    return tuple(prompt), None


async def prepare_prompt(
    request: CreateRequest,
    actors: Actors,
    running: RunningResponses | None = None,
    max_tokens: int | None = None,
) -> PreparedPrompt:
    """Resolve history and render; raises ``ApiError`` and changes nothing. With
    ``max_tokens`` (``prompt_limit``), a prompt provably longer is refused untokenized."""
    check_model(request, actors.model)
    history = await load_history(request, actors, running)
    new_items = input_items(request.input)
    tools = history_tools(request, history)
    if tools is not None:
        request = dataclasses.replace(request, tools=tools)
    prompt, rendered = await _render(request, actors, history + new_items, max_tokens)
    return PreparedPrompt(history, new_items, prompt, tools, rendered)


@dataclass(frozen=True, slots=True)
class ReadyPrompt:
    """A create request prepared for its response: refused now if it ever will be."""

    request: CreateRequest  # with the tools its history loaded
    prepared: PreparedPrompt
    grammar: Grammar | None  # what decoding must follow (compiled: an invalid schema is a 400)
    compacting: bool  # the history is compacted before generating (``context_management``)
    job_bytes: int = 0  # a background job's share of the store's byte budget (an estimate)


async def prepare_response(
    request: CreateRequest, actors: Actors, running: RunningResponses | None
) -> ReadyPrompt:
    """Everything a create asks before anything exists, in one pass: the early length
    refusal, history, render, the tools a search in the history loaded (issue 13), the
    context-window check unless the history is to be compacted (spec 000: the rendered input
    reaches ``compact_threshold`` or leaves no room), a ``compaction_trigger``'s plan
    (issue 28), then the grammar."""
    model = actors.model
    window = model.info.context_window
    prepared = await prepare_prompt(request, actors, running, prompt_limit(request, model))
    if prepared.tools is not None:
        request = dataclasses.replace(request, tools=prepared.tools)
    tokens, threshold = len(prepared.prompt), request.compact_threshold
    reached = threshold is not None and (tokens >= threshold or tokens >= window)
    compacting = request.compact_now or reached
    if not compacting and tokens >= window:
        raise context_exceeded(prepared.prompt, window)
    if request.compact_now:  # refused now when it cannot be done at all
        await plan(prepared, actors, None)
    grammar = None if request.compact_now else await constrain(request, model)
    job_bytes = 0
    if request.config.background:
        # Its input, and its output budget's tokens in its object and events (approximate).
        budget = max(output_budget(request, tokens, window), 0)
        job_bytes = 2048 + len(json.dumps(prepared.all_items)) + BYTES_PER_TOKEN * budget
    return ReadyPrompt(request, prepared, grammar, compacting, job_bytes)


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
    items = items_from_json(prepared.all_items)

    def cost(item: TurnItem) -> int:
        return model.count_tokens(item_text(item)) + ITEM_OVERHEAD_TOKENS

    try:
        if keep_tokens is None:
            return split_everything(items)
        # Tokenizing a long history is real work: off the Trio thread.
        return await trio.to_thread.run_sync(split_history, items, cost, keep_tokens)
    except NothingToSummarize as exc:
        raise cannot_compact(
            f"The summary could not shorten the context of {before} tokens: {exc}."
        ) from None
