"""Parsed model output -> event-machine inputs, applying the request's tool-call limits (pure).

Invariants:
- Everything the parser reports reaches the machine in order, except tool calls beyond the
  request's limit (``parallel_tool_calls: false`` allows one, ``max_tool_calls`` caps the
  total), which are dropped whole: no begin, no arguments, no end.
- Logprobs belong to visible text: the logprobs of one batch of tokens go on the first text
  delta of that batch; a batch that produced no visible text (reasoning, a tool call, text
  still held back by the parser) contributes none.
- A call to a namespaced function (its qualified name) begins an item with ``name`` and
  ``namespace`` apart.
- A call to ``tool_search`` begins a ``tool_search_call``; with server execution its end
  carries the tools the server's search loaded (``protocol.tool_search.search``).
- ``reasoning_text`` is all reasoning seen, for ``usage.output_tokens_details``.
- A call to a name no offered tool declares (``declared``) is never a call (OpenAI's API
  never returns one; the Agents SDK raises on it): it becomes output text, the call written
  as ``{"name": ..., "arguments": ...}`` when it ends, and counts toward no call limit
  (docs/api.md, "Calls to undeclared tools"). The same in every format: it is decided here,
  after parsing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .. import formats
from ..formats import (
    ParsedEvent,
    Parser,
    ReasoningChunk,
    TextChunk,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
)
from ..formats.grammars import CUSTOM_HEAD, CUSTOM_TAIL
from ..protocol.events import machine as m
from ..protocol.request import CreateRequest
from ..protocol.tools.offered import CUSTOM_INPUT
from ..protocol.tools.search import search
from ..protocol.tools.spec import FunctionTool


@dataclass(frozen=True, slots=True)
class CallTarget:
    """What a call the model makes under a tool's offered name becomes as an output item."""

    name: str  # the item's ``name``
    namespace: str | None
    custom: bool  # a ``custom_tool_call`` whose ``input`` is the call's ``input`` argument
    # A ``tool_search_call``: its execution, and the deferred tools a server search
    # looks through.
    search: Literal["server", "client"] | None = None
    catalog: tuple[FunctionTool, ...] = ()
    tool: FunctionTool | None = None  # a tool the server runs (``tool.hosted``)


@dataclass(frozen=True, slots=True)
class HostedCallMade:
    """A call of a tool the server runs, as the model made it: the tool and its arguments."""

    tool: FunctionTool
    arguments: str


def call_targets(tools: tuple[FunctionTool, ...]) -> dict[str, CallTarget]:
    """Offered name -> call target, for every namespaced or custom tool."""
    return {
        t.name: CallTarget(
            t.call_name,
            t.namespace,
            t.is_custom,
            t.search,
            t.catalog,
            t if t.hosted is not None else None,
        )
        for t in tools
        if t.namespace is not None or t.is_custom or t.search is not None or t.hosted is not None
    }


def custom_input(arguments: str) -> str:
    """A custom tool's freeform input from the call's JSON arguments (``{"input": ...}``); a
    forced Lark call's raw text between ``{"input": "`` and ``"}`` where it is not valid JSON
    (``formats.grammars``: a grammar's output is not JSON-escaped); else the arguments text
    itself."""
    try:
        parsed = json.loads(arguments, strict=False)
    except ValueError:
        if arguments.startswith(CUSTOM_HEAD) and arguments.endswith(CUSTOM_TAIL):
            return arguments[len(CUSTOM_HEAD) : len(arguments) - len(CUSTOM_TAIL)]
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get(CUSTOM_INPUT), str):
        return str(parsed[CUSTOM_INPUT])
    return arguments


def as_text(name: str, arguments: str) -> str:
    """An undeclared call as output text: ``{"name": ..., "arguments": ...}``."""
    try:
        json.loads(arguments)
        body = arguments.strip() or "{}"
    except ValueError:
        body = json.dumps(arguments, ensure_ascii=False)
    return '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ' + body + "}"


def shaper_for(
    request: CreateRequest, tool_format: str, reasoning: bool, starts_in_reasoning: bool
) -> OutputShaper:
    """The shaper of ``request``'s output: its format's parser and its tool-call limits."""
    calls_allowed = request.tool_choice.mode != "none" and bool(request.tools)
    limits = [n for n in (request.config.max_tool_calls,) if n is not None]
    if not request.config.parallel_tool_calls:
        limits.append(1)
    parser = formats.get(tool_format).new_parser(
        formats.ParseOptions(
            tools_enabled=calls_allowed,
            reasoning=reasoning,
            starts_in_reasoning=starts_in_reasoning,
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


class OutputShaper:
    def __init__(
        self,
        parser: Parser,
        *,
        max_calls: int | None,
        targets: Mapping[str, CallTarget] | None = None,
        declared: frozenset[str] | None = None,
    ) -> None:
        """``declared``: the names the model may call (None: any name is a call)."""
        self._parser = parser
        self._max_calls = max_calls
        self._declared = declared
        self._undeclared: set[int] = set()  # parser indices of calls that are text instead
        self._calls = 0  # declared calls begun: the ones the limits count
        # Offered name -> target: a namespaced call's item carries name and namespace apart; a
        # custom tool's call is a custom_tool_call whose input is the `input` argument.
        self._targets = targets or {}
        self._custom_open = False
        self._search_open: CallTarget | None = None  # the open call is a tool search
        self._hosted_open: FunctionTool | None = None  # the open call is the server's to run
        # The call of a tool the server runs that ended this sequence's output: what follows
        # it is not shown (the server runs it, then a continuation goes on).
        self.hosted_call: HostedCallMade | None = None
        self._reasoning: list[str] = []
        self._numbers: set[int] = set()  # parser indices of calls accepted as calls

    @property
    def reasoning_text(self) -> str:
        return "".join(self._reasoning)

    def feed(self, text: str, logprobs: Sequence[dict[str, Any]] = ()) -> list[m.MachineInput]:
        return self._shape(self._parser.feed(text) if text else [], logprobs)

    def finish(self) -> list[m.MachineInput]:
        return self._shape(self._parser.finish(), ())

    def _accepted(self, index: int) -> bool:
        return index not in self._undeclared and index in self._numbers

    def _begin(self, index: int, name: str) -> bool:
        """Whether the call the parser began at ``index`` is one (module docstring)."""
        if self._declared is not None and name not in self._declared:
            self._undeclared.add(index)
            return False
        if self._max_calls is not None and self._calls >= self._max_calls:
            return False
        self._numbers.add(index)
        self._calls += 1
        return True

    def _shape(
        self, events: list[ParsedEvent], logprobs: Sequence[dict[str, Any]]
    ) -> list[m.MachineInput]:
        inputs: list[m.MachineInput] = []
        pending = list(logprobs)
        for event in events:
            if self.hosted_call is not None:
                break  # after a call the server runs, nothing of this sequence is shown
            match event:
                case TextChunk(text=text) if text:
                    inputs.append(m.TextDelta(text, logprobs=pending))
                    pending = []
                case ReasoningChunk(text=text) if text:
                    self._reasoning.append(text)
                    inputs.append(m.ReasoningDelta(text))
                case ToolCallStart(index=index, name=name) if self._begin(index, name):
                    target = self._targets.get(name)
                    self._custom_open = target is not None and target.custom
                    self._search_open = target if target and target.search else None
                    self._hosted_open = target.tool if target is not None else None
                    if self._hosted_open is not None and self._hosted_open.hosted is not None:
                        inputs.append(self._hosted_begin(self._hosted_open))
                    elif target is not None and target.search is not None:
                        inputs.append(m.ToolCallBegin(target.name, search=target.search))
                    elif target is not None:
                        inputs.append(
                            m.ToolCallBegin(
                                target.name, namespace=target.namespace, custom=target.custom
                            )
                        )
                    else:
                        inputs.append(m.ToolCallBegin(name))
                case ToolCallArgs(index=index, delta=delta) if self._accepted(index) and delta:
                    if not self._custom_open:  # a custom input is sent whole at the end
                        inputs.append(m.ToolCallArgs(delta))
                case ToolCallEnd(index=index, name=name, arguments=arguments) if (
                    index in self._undeclared
                ):
                    inputs.append(m.TextDelta(as_text(name, arguments), logprobs=pending))
                    pending = []
                case ToolCallEnd(index=index, arguments=arguments) if self._accepted(index):
                    if self._custom_open:
                        arguments = custom_input(arguments)
                        self._custom_open = False
                    searched = self._search_open
                    self._search_open = None
                    if self._hosted_open is not None:
                        hosted = self._hosted_open.hosted
                        if hosted is not None and not hosted.approval:  # the server runs it
                            self.hosted_call = HostedCallMade(self._hosted_open, arguments)
                        self._hosted_open = None
                        inputs.append(m.ToolCallEnd(arguments))
                    elif searched is not None and searched.search == "server":
                        loaded = tuple(search(searched.catalog, arguments))
                        inputs.append(m.ToolCallEnd(arguments, loaded=loaded))
                    else:
                        inputs.append(m.ToolCallEnd(arguments))
        return inputs

    @staticmethod
    def _hosted_begin(tool: FunctionTool) -> m.ToolCallBegin:
        hosted = tool.hosted
        assert hosted is not None
        call = m.HostedCall(hosted.kind, server_label=hosted.server_label, approval=hosted.approval)
        return m.ToolCallBegin(tool.call_name, hosted=call)
