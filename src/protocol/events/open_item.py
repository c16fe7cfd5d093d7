"""The event machine's open output item (``machine.py``): the one item being streamed, its
text or arguments so far, and the per-type event names, id prefixes and machine states.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

from ..objects import (
    ItemStatus,
    JsonObject,
    custom_tool_call_item,
    function_call_item,
    message_item,
    output_text_part,
    reasoning_item,
    reasoning_text_part,
    tool_search_call_item,
)
from .table import State

_S = State

ItemType = Literal["message", "reasoning", "function_call", "custom_tool_call", "tool_search_call"]
CALLS: Final = ("function_call", "custom_tool_call", "tool_search_call")


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

    @property
    def text(self) -> str:
        return "".join(self.chunks)

    def part(self) -> JsonObject:
        if self.type == "message":
            return output_text_part(self.text, self.logprobs)
        return reasoning_text_part(self.text)

    def item(self, status: ItemStatus) -> JsonObject:
        """A fresh JSON copy of the item as it stands, with ``status``."""
        if self.type == "tool_search_call":
            return tool_search_call_item(
                self.id,
                call_id=self.call_id,
                execution=self.execution,
                arguments=self.text if status != "in_progress" else "",
                status=status,
            )
        if self.type == "custom_tool_call":
            return custom_tool_call_item(
                self.id,
                call_id=self.call_id,
                name=self.name,
                text=self.text,
                namespace=self.namespace,
            )
        if self.type == "function_call":
            return function_call_item(
                self.id,
                call_id=self.call_id,
                name=self.name,
                arguments=self.text,
                status=status,
                namespace=self.namespace,
            )
        builder = message_item if self.type == "message" else reasoning_item
        return builder(self.id, status, [self.part()])

    def where(self) -> JsonObject:
        where: JsonObject = {"item_id": self.id, "output_index": self.index}
        if self.type not in CALLS:
            where["content_index"] = 0
        return where


DELTA_EVENT: Final = {
    "message": "response.output_text.delta",
    "reasoning": "response.reasoning_text.delta",
    "function_call": "response.function_call_arguments.delta",
    "custom_tool_call": "response.custom_tool_call_input.delta",
}
ID_PREFIX: Final = {
    "message": "msg",
    "reasoning": "rs",
    "function_call": "fc",
    "custom_tool_call": "ctc",
    "tool_search_call": "tsc",
}
ITEM_STATE: Final = {
    "message": _S.IN_MESSAGE,
    "reasoning": _S.IN_REASONING,
    "function_call": _S.IN_TOOL_CALL,
    "custom_tool_call": _S.IN_TOOL_CALL,
    "tool_search_call": _S.IN_TOOL_CALL,
}
