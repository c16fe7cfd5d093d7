"""The internal create-request and the pure parsing of ``input`` into items.

Invariants:
- ``CreateRequest`` is what the HTTP edge hands to the response actor: fully validated, frozen,
  a value with no back-channel (what a transport needs back, the cache report and the rendered
  prompt, it reads from the response's ``EventLog``).
- ``parse_input`` accepts a string or an array of input items (see ``items.parse_item``) and
  refuses everything else with an ``ApiError`` whose ``param`` is the JSON path of the
  offending value, so a client can find its mistake.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import invalid_request
from .items.read import InputItem, InputMessage, json_type, parse_item
from .objects import JsonObject, ResponseConfig
from .prompt_memo import RenderedPrompt
from .text_format import TEXT, TextFormat
from .tools.hosted import HostedChoice, McpSpec
from .tools.offered import FunctionTool, ToolChoice

__all__ = [
    "CompactRequest",
    "CreateRequest",
    "InputItem",
    "InputMessage",
    "json_type",
    "parse_input",
]


AUTO = ToolChoice("auto")


def _no_kwargs() -> Mapping[str, Any]:
    return {}


@dataclass(frozen=True, slots=True)
class CreateRequest:
    config: ResponseConfig
    input: tuple[InputItem, ...]
    stream: bool
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = AUTO
    # Extension: keyword arguments for the chat template, e.g. enable_thinking.
    template_kwargs: Mapping[str, Any] = field(default_factory=_no_kwargs)
    # Alternatives per token when include asks for output_text logprobs; None: not asked.
    logprobs: int | None = None
    # Extension: a seed makes sampling reproducible.
    seed: int | None = None
    text_format: TextFormat = TEXT
    # The tenant: set by the HTTP edge from the API key; "" when the server is open.
    owner: str = ""
    # context_management's compact_threshold: compact the history before generating
    # when the rendered input reaches it or leaves no room for output; None: never.
    compact_threshold: int | None = None
    # The input ended with a ``compaction_trigger``: the response compacts the
    # history (everything but system and developer messages) into one ``compaction`` item and
    # generates nothing else.
    compact_now: bool = False
    # Text that ends generation when produced (the Anthropic encoding's ``stop_sequences``).
    stop_sequences: tuple[str, ...] = ()
    # The history of ``previous_response_id`` when the transport holds it (a WebSocket
    # connection's latest response, store: false included); None: from the response store.
    replay: tuple[JsonObject, ...] | None = None
    # False: a warm-up (the WebSocket mode's ``generate: false``): validate and render, answer
    # a chainable response with no output, generate nothing.
    generate: bool = True
    # Anthropic's top_k: keep the k most likely tokens; 0: off.
    top_k: int = 0
    # include "reasoning.encrypted_content": seals a reasoning item's text.
    seal: Callable[[str], str] | None = None
    # A WebSocket connection's previous render (a hint: a continuation tokenizes
    # only what is new). With ``keep_render``, this turn's render is kept on the response's
    # log (``EventLog.rendered``) for the next turn.
    previous_render: RenderedPrompt | None = field(default=None, compare=False)
    keep_render: bool = False
    # Tool discovery: the tools as declared, deferred ones included, when any is
    # deferred; a ``tool_search_output`` in the history (``previous_response_id``,
    # ``conversation``) loads from them as one in ``input`` does. (): nothing deferred.
    declared_tools: tuple[FunctionTool, ...] = ()
    # Remote MCP servers (``mcp`` tools): their tools are listed, or found listed in the
    # history, before the prompt is rendered (``actors/hosted_prep.py``) and join ``tools``.
    mcp_servers: tuple[McpSpec, ...] = ()
    # A ``tool_choice`` naming an MCP server's tool: resolved once its tools are listed.
    mcp_choice: HostedChoice | None = None

    def output_budget(self, prompt_tokens: int, window: int) -> int:
        """The most tokens it may generate after a prompt of ``prompt_tokens``: generation is
        capped at the context left after the prompt; below 1, it does not fit."""
        room = window - prompt_tokens
        return min(self.config.max_output_tokens or room, room)


@dataclass(frozen=True, slots=True)
class CompactRequest:
    """``POST /v1/responses/compact``: the history (``create.input`` after the
    ``previous_response_id`` chain, if any), and the compaction's own settings."""

    create: CreateRequest
    keep_tokens: int | None  # None: 1/16 of the context window, at most 8192
    max_output_tokens: int  # the summary's budget


def parse_input(raw: object) -> tuple[InputItem, ...]:
    """``input`` as a string or an item array -> items, or a 400 naming the bad path."""
    if isinstance(raw, str):
        if not raw:
            raise invalid_request("Invalid 'input': the string must not be empty.", "input")
        return (InputMessage("user", raw),)
    if not isinstance(raw, list):
        raise invalid_request(
            f"Invalid type for 'input': expected a string or an array of input items, "
            f"but got {json_type(raw)}.",
            "input",
        )
    if not raw:
        raise invalid_request("Invalid 'input': the array must not be empty.", "input")
    return tuple(parse_item(item, f"input[{i}]") for i, item in enumerate(raw))
