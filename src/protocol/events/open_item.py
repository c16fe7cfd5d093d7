"""The event machine's open output item (``machine.py``): the one item being streamed, its
text or arguments so far, and the per-type event names, id prefixes and machine states.

Invariants:
- ``OpenItem.item(status)`` is a fresh JSON copy of the item as it stands; a hosted item
  (``web_search_call``, ``mcp_call``) carries what its result set (action, sources, output,
  error), an ``mcp_approval_request`` its arguments.
- A draft is an event without its ``sequence_number`` (the machine numbers it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ..objects import (
    HostedStatus,
    JsonObject,
    custom_tool_call_item,
    event_logprob,
    function_call_item,
    json_copy,
    mcp_approval_request_item,
    mcp_call_item,
    message_item,
    output_text_part,
    reasoning_item,
    reasoning_text_part,
    tool_search_call_item,
    web_search_call_item,
)
from .table import State

_S = State

ItemType = Literal[
    "message",
    "reasoning",
    "function_call",
    "custom_tool_call",
    "tool_search_call",
    "web_search_call",
    "mcp_call",
    "mcp_approval_request",
]
CALLS: Final = ("function_call", "custom_tool_call", "tool_search_call")
"""Calls the client sees through (``has_tool_calls``)."""
HOSTED: Final = ("web_search_call", "mcp_call")
"""Calls the server runs: open through ``IN_HOSTED_CALL`` and ``HOSTED_RUNNING``."""
PARTLESS: Final = (*CALLS, *HOSTED, "mcp_approval_request")
"""Items without content parts (their events have no ``content_index``)."""

Draft = tuple[str, JsonObject]
"""An event's ``type`` and fields, before the machine numbers it."""


@dataclass(slots=True)
class OpenItem:
    """The one output item being streamed; ``chunks`` are its text or arguments so far."""

    type: ItemType
    id: str
    index: int
    chunks: list[str] = field(default_factory=list)
    logprobs: list[JsonObject] = field(default_factory=list)  # part-shaped (messages only)
    call_id: str = ""
    name: str = ""
    namespace: str | None = None
    execution: Literal["server", "client"] = "server"  # a tool_search_call's
    server_label: str = ""  # an MCP item's
    ended: bool = False  # a hosted call's ToolCallEnd came (its server run began)
    action: JsonObject | None = None  # a web_search_call's, from its arguments
    output: str | None = None  # an mcp_call's result
    error: JsonObject | None = None
    annotations: list[JsonObject] = field(default_factory=list)  # a message's citations

    @property
    def text(self) -> str:
        return "".join(self.chunks)

    def part(self) -> JsonObject:
        if self.type == "message":
            part = output_text_part(self.text, self.logprobs)
            part["annotations"] = json_copy(self.annotations)
            return part
        return reasoning_text_part(self.text)

    def item(self, status: HostedStatus) -> JsonObject:
        """A fresh JSON copy of the item as it stands, with ``status`` (``failed`` only for a
        hosted call)."""
        if self.type in PARTLESS:
            return self._call_item(status)
        builder = message_item if self.type == "message" else reasoning_item
        assert status != "failed"
        return builder(self.id, status, [self.part()])

    def _call_item(self, status: HostedStatus) -> JsonObject:
        match self.type:
            case "web_search_call":
                action = self.action if self.action is not None else {"type": "search"}
                return web_search_call_item(self.id, status=status, action=action)
            case "mcp_call":
                return mcp_call_item(
                    self.id,
                    server_label=self.server_label,
                    name=self.name,
                    arguments=self.text,
                    status=status,
                    output=self.output,
                    error=self.error,
                )
            case "mcp_approval_request":
                return mcp_approval_request_item(
                    self.id, server_label=self.server_label, name=self.name, arguments=self.text
                )
            case "tool_search_call":
                return tool_search_call_item(
                    self.id,
                    call_id=self.call_id,
                    execution=self.execution,
                    arguments=self.text if status != "in_progress" else "",
                    status=status,
                )
            case "custom_tool_call":
                return custom_tool_call_item(
                    self.id,
                    call_id=self.call_id,
                    name=self.name,
                    text=self.text,
                    namespace=self.namespace,
                )
        assert status != "failed"
        return function_call_item(
            self.id,
            call_id=self.call_id,
            name=self.name,
            arguments=self.text,
            status=status,
            namespace=self.namespace,
        )

    def where(self) -> JsonObject:
        where: JsonObject = {"item_id": self.id, "output_index": self.index}
        if self.type not in PARTLESS:
            where["content_index"] = 0
        return where

    def closing(self) -> list[Draft]:
        """The drafts that end its text or arguments, before its part and item are done."""
        where, text = self.where(), self.text
        match self.type:
            case "message":
                logprobs: list[Any] = [event_logprob(entry) for entry in self.logprobs]
                return [
                    ("response.output_text.done", {**where, "text": text, "logprobs": logprobs})
                ]
            case "reasoning":
                return [("response.reasoning_text.done", {**where, "text": text})]
            case "function_call":
                return [("response.function_call_arguments.done", {**where, "arguments": text})]
            case "custom_tool_call":
                return [("response.custom_tool_call_input.done", {**where, "input": text})]
            case "mcp_call" if not self.ended:
                return [("response.mcp_call_arguments.done", {**where, "arguments": text})]
        return []


DELTA_EVENT: Final = {
    "message": "response.output_text.delta",
    "reasoning": "response.reasoning_text.delta",
    "function_call": "response.function_call_arguments.delta",
    "custom_tool_call": "response.custom_tool_call_input.delta",
    "mcp_call": "response.mcp_call_arguments.delta",
}
"""Item type -> its delta event; the others stream nothing (no SDK type for their deltas)."""
ID_PREFIX: Final = {
    "message": "msg",
    "reasoning": "rs",
    "function_call": "fc",
    "custom_tool_call": "ctc",
    "tool_search_call": "tsc",
    "web_search_call": "ws",
    "mcp_call": "mcp",
    "mcp_approval_request": "mcpr",
    "mcp_list_tools": "mcpl",  # minted by the run for a WholeItem, not by the machine
}
ITEM_STATES: Final[dict[str, tuple[State, ...]]] = {
    "message": (_S.IN_MESSAGE,),
    "reasoning": (_S.IN_REASONING,),
    "function_call": (_S.IN_TOOL_CALL,),
    "custom_tool_call": (_S.IN_TOOL_CALL,),
    "tool_search_call": (_S.IN_TOOL_CALL,),
    "mcp_approval_request": (_S.IN_TOOL_CALL,),
    "web_search_call": (_S.IN_HOSTED_CALL, _S.HOSTED_RUNNING),
    "mcp_call": (_S.IN_HOSTED_CALL, _S.HOSTED_RUNNING),
}
"""Item type -> the states in which it may be the open item."""
