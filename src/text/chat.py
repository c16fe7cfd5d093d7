"""Input items -> the chat messages a Hugging Face chat template expects (pure).

Invariants:
- ``instructions`` and every system/developer message are merged, in order, into one leading
  system message: many templates accept a single system message, and only at the start.
- An assistant message and the function calls that follow it form one assistant turn
  (``content`` + ``tool_calls``); a reasoning item becomes the reasoning of the assistant turn
  it precedes, under the key the model's format names (``Replay.reasoning_key``:
  ``reasoning_content``, gpt-oss's ``thinking``). So a previous ``output`` replayed as input renders as the turn
  was generated.
- A call's arguments are an object, or their JSON text where the format says ``string``.
- A function call output is a ``tool`` message with its ``tool_call_id``. Where the format
  renames call ids (``Replay.call_id``: Kimi K2's ``functions.NAME:N``), a call and its output
  carry the same new id.
- A call to a function of a namespace tool renders under its qualified name, as the tool was
  offered (``protocol.tools.qualified_name``).
- A message's or a tool output's ``content`` is its ``images.Content``: a string, or its text
  runs and ``ImageRef`` parts in order, which only a vision model's renderer takes
  (``model/vision.py`` writes each image as the template writes one).
- A hosted tool's item renders as ``protocol.items.hosted_turns.model_turns`` says: a
  ``web_search_call`` or an ``mcp_call`` as its function call and its output (call_id: the
  item's id), the MCP listing and approval items as nothing.
- A ``compaction`` item stands in for every earlier item but system/developer messages: its
  summary joins the system message at its place, then its retained items render as turns
  (``protocol.compaction.replay_view``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..formats import Replay
from ..protocol.items.compaction import replay_view
from ..protocol.items.hosted_turns import model_turns
from ..protocol.items.images import Content, join_content
from ..protocol.items.read import (
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    InputMessage,
    Reasoning,
    TurnItem,
)
from ..protocol.tools.offered import qualified_name

ChatMessage = dict[str, Any]


_DEFAULT_REPLAY = Replay()


class _Chat:
    """The chat messages as they grow, item by item (``to_chat``)."""

    def __init__(self, instructions: str | None, replay: Replay) -> None:
        self.replay = replay
        self.system: list[Content] = [instructions] if instructions else []
        self.messages: list[ChatMessage] = []
        self.reasoning: str | None = None  # waits for the assistant turn it precedes
        self.open_assistant = False  # the last message is an assistant turn that may grow
        self.ids: dict[str, str] = {}  # call_id -> the id it renders under (Replay.call_id)

    def add(self, item: TurnItem) -> None:
        match item:
            case InputMessage(role="system" | "developer", text=text):
                self.system.append(text)
            case InputMessage(role="assistant", text=text):
                self.messages.append({"role": "assistant", "content": text})
                self._take_reasoning(self.messages[-1])
                self.open_assistant = True
            case InputMessage(role=role, text=text):
                self.messages.append({"role": role, "content": text})
                self.open_assistant = False
            case Reasoning(text=text):
                self.reasoning = text or None
                self.open_assistant = False
            case FunctionCall():
                self._call(item)
            case FunctionCallOutput(call_id=call_id, output=output):
                call_id = self.ids.get(call_id, call_id)
                self.messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
                self.open_assistant = False

    def _take_reasoning(self, turn: ChatMessage) -> None:
        if self.reasoning:
            turn[self.replay.reasoning_key] = self.reasoning
        self.reasoning = None

    def _call(self, call: FunctionCall) -> None:
        if not self.open_assistant:
            self.messages.append({"role": "assistant", "content": ""})
            self.open_assistant = True
        turn = self.messages[-1]
        self._take_reasoning(turn)
        # A custom tool is offered as one string parameter, `input`.
        args: Any = {"input": call.arguments} if call.custom else json.loads(call.arguments)
        if self.replay.arguments == "string":
            args = json.dumps(args, ensure_ascii=False)
        qualified = qualified_name(call.namespace, call.name)
        call_id = call.call_id
        if self.replay.call_id is not None:
            made = self.replay.call_id(call_id, qualified, len(self.ids))
            call_id = self.ids.setdefault(call_id, made)
        turn.setdefault("tool_calls", []).append(
            {"id": call_id, "type": "function", "function": {"name": qualified, "arguments": args}}
        )

    def finished(self) -> list[ChatMessage]:
        if not self.system:
            return self.messages
        return [{"role": "system", "content": join_content(self.system, "\n\n")}, *self.messages]


def to_chat(
    instructions: str | None, items: Sequence[InputItem], replay: Replay = _DEFAULT_REPLAY
) -> list[ChatMessage]:
    chat = _Chat(instructions, replay)
    for item in replay_view(items):
        for turn in model_turns(item):
            chat.add(turn)
    return chat.finished()
