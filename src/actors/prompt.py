"""Prompt preparation: a request resolved against its history and rendered (no side effects).

Invariants:
- Everything here can refuse a request (model name, history lookup, render, the context
  window) and nothing here changes state, so a refusal raises ``ApiError`` and leaves no trace.
- ``previous_response_id`` replays the whole chain (decision 9): a stored record keeps the
  history it was generated from. A parent that is still running is refused, not waited for.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .. import formats
from ..model.chat import ChatMessage, to_chat
from ..model.prompt_bounds import PromptTooLong
from ..protocol.errors import ApiError, invalid_request, not_found
from ..protocol.history import input_items, items_from_json
from ..protocol.objects import JsonObject
from ..protocol.prompt_memo import PromptMemo
from ..protocol.request import CreateRequest
from ..protocol.tool_search import discoverable
from ..protocol.tools import FunctionTool, offered_tools
from .model import ModelHandle
from .prompt_limit import too_long_to_tokenize
from .runtime import Actors, RunningResponses


@dataclass(frozen=True, slots=True)
class PreparedPrompt:
    """A request resolved against its history and rendered."""

    history: tuple[JsonObject, ...]  # items replayed before this request's input
    new_items: tuple[JsonObject, ...]  # this request's input, ids assigned
    prompt: tuple[int, ...]
    # The tools offered once the history's tool searches loaded theirs (``history_tools``);
    # None: the request's own ``tools``.
    tools: tuple[FunctionTool, ...] | None = None

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


def context_exceeded(prompt: tuple[int, ...], window: int) -> ApiError:
    return invalid_request(
        f"The input is {len(prompt)} tokens, which does not fit the model's "
        f"context window of {window} tokens.",
        "input",
        code="context_length_exceeded",
    )


def needs_compaction(request: CreateRequest, prompt_tokens: int, window: int) -> bool:
    """Spec 000: the rendered input reaches ``compact_threshold`` or leaves no room."""
    threshold = request.compact_threshold
    return threshold is not None and (prompt_tokens >= threshold or prompt_tokens >= window)


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
    memo: PromptMemo | None = None,
) -> tuple[int, ...]:
    """The token ids of ``items`` rendered as ``request`` renders (instructions, tools); with
    ``max_tokens``, a prompt provably longer is refused before it is tokenized. With ``memo``
    (issue 14), the text the memo's previous render shares is not tokenized again (the same
    ids), and this render is written to the memo."""
    # With tool_choice "none" the model is not told about the tools at all.
    offered = request.tools if request.tool_choice.mode != "none" else ()
    replay = formats.get(actors.model.info.tool_format).replay  # the template's wishes
    tools = replay.template_tools([tool.for_template() for tool in offered]) or None
    # Spec 000: reasoning.effort is echoed, never mapped onto template kwargs; a family's
    # defaults apply and chat_template_kwargs sets its own (docs/models.md names each key).
    kwargs = replay.template_kwargs(None, request.template_kwargs)
    try:
        chat = await render_messages(request, actors, items)
        rendered = None
        if memo is not None:
            rendered = await actors.model.render_continuing(
                chat, tools, kwargs, max_tokens, memo.previous
            )
            memo.rendered = rendered
        if rendered is not None:
            return rendered.ids
        prompt = await actors.model.render(chat, tools, kwargs, max_tokens)
    except PromptTooLong as exc:  # refused untokenized
        raise too_long_to_tokenize(exc, actors.model.info.context_window) from None
    except Exception as exc:  # the template's own error (Jinja, a raise_exception call, ...)
        raise invalid_request(
            f"The model's chat template could not render this input: {exc}",
            "input",
            code="invalid_prompt",
        ) from exc
    return tuple(prompt)


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
    prompt = await render_items(
        request, actors, history + new_items, max_tokens, request.prompt_memo
    )
    return PreparedPrompt(history, new_items, prompt, tools)


def history_tools(
    request: CreateRequest, history: tuple[JsonObject, ...]
) -> tuple[FunctionTool, ...] | None:
    """The tools offered when a ``tool_search_output`` of the history (a chain, a
    conversation) loaded deferred tools, as one in ``input`` does at the edge; None when that
    changes nothing."""
    if not request.declared_tools or not history:
        return None
    items = (*items_from_json(history), *request.input)
    tools = offered_tools(discoverable(request.declared_tools, items), request.tool_choice)
    return None if tools == request.tools else tools
