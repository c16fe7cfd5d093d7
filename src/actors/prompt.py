"""Preparation: a request resolved against its history, rendered and checked (no side effects).

Invariants:
- Everything here can refuse a request (model name, history lookup, render, the context
  window, the grammar) and nothing here changes state, so a refusal raises ``ApiError`` and
  leaves no trace.
- ``prepare_response`` is a response task's one call here, first on its way down, and one
  pass: the model check and the history (here), the turn read once (``protocol/history``),
  the decoding rule (``protocol/decoding``), the chat messages (``model/chat``), one call of
  the model's text side that renders and compiles (``PromptMaker.make_prompt``), then the
  limits. Its ``ReadyPrompt`` is a finished value that admission and the run only read.
- The limits a prompt meets: a request whose over-long input is compacted rather than refused
  (``compact_threshold`` set) has no early limit (it must be tokenized to be compacted);
  otherwise the limit is ``context_window - 1`` tokens, so the early refusal
  (``model/prompt_bounds``) refuses exactly what the exact check would, only sooner.
- ``previous_response_id`` replays the whole chain: a stored record keeps the history it was
  generated from, so a chained turn renders exactly what the model saw. A parent that is still running is refused, not waited for.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass

from .. import formats
from ..engine.port import CannotConstrain, Grammar
from ..protocol.decoding import decoding_for
from ..protocol.errors import ApiError, context_exceeded, invalid_request, not_found
from ..protocol.events.machine import Compacted
from ..protocol.items.history import Turn, items_from_json, resolve
from ..protocol.items.read import InputItem
from ..protocol.objects import JsonObject
from ..protocol.prompt_memo import RenderedPrompt
from ..protocol.request import CreateRequest
from ..protocol.tools.offered import FunctionTool, ToolChoice
from ..text.prompt_maker import PromptTooLong, to_chat
from .hosted_prep import prepare_hosted
from .model import ModelHandle
from .runtime import Actors, RunningResponses

# The store bytes a background job is assumed to need per token of its output budget.
BYTES_PER_TOKEN = 16


@dataclass(frozen=True, slots=True)
class PreparedPrompt:
    """A request resolved against its history and rendered."""

    history: tuple[JsonObject, ...]  # items replayed before this request's input
    new_items: tuple[JsonObject, ...]  # this request's input, ids assigned
    # Both as parsed, once (``history.resolve``): what renders, before the reasoning echo.
    items: tuple[InputItem, ...]
    prompt: tuple[int, ...]
    # The tools offered once the history's tool searches loaded theirs; None: the
    # request's own ``tools``.
    tools: tuple[FunctionTool, ...] | None = None
    # This render, kept for the next turn when the request asked (``keep_render``).
    rendered: RenderedPrompt | None = None
    # What decoding must follow (compiled when asked: an invalid schema is a 400); None: free.
    grammar: Grammar | None = None
    opens_reasoning: bool = False  # the prompt already opened a reasoning block
    # Whole items shown first in the output (``hosted_prep.py``: MCP listings, approved
    # calls); rendered after the input.
    hosted_items: tuple[JsonObject, ...] = ()
    # The tool choice once an MCP server's tools are listed (None: the request's own).
    tool_choice: ToolChoice | None = None

    @property
    def all_items(self) -> tuple[JsonObject, ...]:
        return self.history + self.new_items


@dataclass(frozen=True, slots=True)
class ReadyPrompt:
    """A create request prepared for its response: refused now if it ever will be."""

    request: CreateRequest  # with the tools its history loaded
    prepared: PreparedPrompt
    # The history is compacted before generating (``context_management``, a
    # ``compaction_trigger``): the response takes compaction's route (``compaction.py``).
    compacting: bool
    budget: int  # the most tokens it may generate (``CreateRequest.output_budget``)
    job_bytes: int = 0  # a background job's share of the store's byte budget (an estimate)
    # Compacted first (``compaction.compacted``): the machine input that puts the compaction
    # item first in the output; ``prepared`` is then the compacted prompt.
    compaction: Compacted | None = None


async def prepare_response(
    request: CreateRequest, actors: Actors, running: RunningResponses | None
) -> ReadyPrompt:
    """Everything a create asks before anything exists, in one pass: the early length
    refusal, history, render, the tools a search in the history loaded, the grammar (not for
    a ``compaction_trigger``, which generates none), then the context-window check unless
    the history is to be compacted (the Responses spec: the rendered input
    reaches ``compact_threshold`` or leaves no room) and a background job's byte estimate."""
    model = actors.model
    window = model.info.context_window
    limit = prompt_limit(request, model)
    prepared = await prepare_prompt(
        request, actors, running, limit, constrain=not request.compact_now
    )
    if prepared.tools is not None:
        request = dataclasses.replace(request, tools=prepared.tools)
    if prepared.tool_choice is not None:
        request = dataclasses.replace(request, tool_choice=prepared.tool_choice, mcp_choice=None)
    tokens, threshold = len(prepared.prompt), request.compact_threshold
    reached = threshold is not None and (tokens >= threshold or tokens >= window)
    # A warm-up (``generate: false``) never compacts: it is admitted as it is, or refused.
    compacting = request.generate and (request.compact_now or reached)
    if not compacting and tokens >= window:
        raise context_exceeded(tokens, window)
    budget = request.output_budget(tokens, window)
    job_bytes = 0
    if request.config.background:
        # Its input, and its output budget's tokens in its object and events (approximate).
        job_bytes = 2048 + len(json.dumps(prepared.all_items)) + BYTES_PER_TOKEN * max(budget, 0)
    return ReadyPrompt(request, prepared, compacting, budget, job_bytes)


def prompt_limit(request: CreateRequest, model: ModelHandle) -> int | None:
    """The most tokens ``request``'s prompt may have, or ``None`` when it must be tokenized."""
    if request.compact_threshold is not None:
        return None
    return model.info.context_window - 1


async def prepare_prompt(
    request: CreateRequest,
    actors: Actors,
    running: RunningResponses | None = None,
    max_tokens: int | None = None,
    *,
    constrain: bool = False,
    run_approved: bool = True,
) -> PreparedPrompt:
    """Resolve history, prepare the MCP servers (``hosted_prep.py``; ``run_approved``: run
    the calls the input approves) and render; raises ``ApiError`` and changes nothing but
    an approved call's effect. With ``max_tokens`` (``prompt_limit``), a prompt provably
    longer is refused untokenized; with ``constrain``, the request's grammar is compiled."""
    check_model(request, actors.model)
    history = await load_history(request, actors, running)
    hosted = await prepare_hosted(request, history, actors.hosted, run_approved=run_approved)
    prepared = await _render(
        hosted.request, actors, history, max_tokens, constrain, None, hosted.items
    )
    if hosted.request is request:
        return prepared
    return dataclasses.replace(
        prepared,
        tools=prepared.tools or hosted.request.tools,
        tool_choice=hosted.request.tool_choice,
    )


async def render_items(
    request: CreateRequest,
    actors: Actors,
    items: tuple[JsonObject, ...],
    *,
    constrain: bool = False,
    parsed: tuple[InputItem, ...] | None = None,
) -> PreparedPrompt:
    """``items`` (stored items, the input among them) rendered as ``request`` renders
    (instructions, its tools as they are): a compacted history, or a response's items so far
    (a server tool search's continuation). ``parsed``: ``items`` as read already (a compacted
    history: the turn's items and the compaction item), not read again."""
    settled = dataclasses.replace(request, input=(), declared_tools=())
    return await _render(settled, actors, items, None, constrain, parsed)


async def _render(
    request: CreateRequest,
    actors: Actors,
    history: tuple[JsonObject, ...],
    max_tokens: int | None,
    constrain: bool,
    parsed: tuple[InputItem, ...] | None = None,
    hosted_items: tuple[JsonObject, ...] = (),
) -> PreparedPrompt:
    """``request`` over ``history``: its turn read once (unless ``parsed`` is that reading),
    the reasoning of earlier plain replies echoed back, then one call of the text side (the
    render, incremental with ``keep_render``; the grammar)."""
    turn = resolve(request, history) if parsed is None else Turn((), parsed, None)
    if turn.tools is not None:
        request = dataclasses.replace(request, tools=turn.tools)
    choice = request.tool_choice
    decoding = decoding_for(choice, request.text_format, request.tools) if constrain else None
    # With tool_choice "none" the model is not told about the tools at all.
    offered = request.tools if request.tool_choice.mode != "none" else ()
    model = actors.model
    replay = formats.get(model.info.tool_format).replay  # the template's wishes
    items: Sequence[InputItem] = turn.items + tuple(items_from_json(hosted_items))
    try:
        if actors.echo is not None:
            items = await actors.echo.restore(request.owner, items)
        made = await model.prompts.make_prompt(
            to_chat(request.config.instructions, items, replay),
            replay.template_tools([tool.for_template() for tool in offered]) or None,
            # The Responses spec echoes reasoning.effort and never maps it onto template
            # kwargs; a family's defaults apply and chat_template_kwargs sets its own.
            replay.template_kwargs(None, request.template_kwargs),
            max_tokens,
            keep=request.keep_render,
            known=request.previous_render,
            decoding=decoding,
        )
    except PromptTooLong as exc:  # refused untokenized
        raise context_exceeded(exc.at_least, model.info.context_window, at_least=True) from None
    except CannotConstrain as exc:
        assert decoding is not None
        param = decoding.schema_param if exc.invalid_schema else decoding.param
        why = "Invalid schema for" if exc.invalid_schema else "Unsupported"
        raise invalid_request(
            f"{why} '{param}'{'' if exc.invalid_schema else ' for this model'}: {exc}", param
        ) from exc
    except Exception as exc:  # the template's own error (Jinja, a raise_exception call, ...)
        raise invalid_request(
            f"The model's chat template could not render this input: {exc}",
            "input",
            code="invalid_prompt",
        ) from exc
    return PreparedPrompt(
        history,
        turn.new_items,
        turn.items,
        made.ids,
        turn.tools,
        made.rendered,
        made.grammar,
        made.opens_reasoning,
        hosted_items,
    )


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
    """The items a ``previous_response_id`` (its whole chain) or ``conversation`` replays."""
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
