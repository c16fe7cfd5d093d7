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
- A ``compaction`` item stands in for every earlier item but system/developer messages: its
  summary joins the system message at its place, then its retained items render as turns
  (``protocol.compaction.replay_view``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..formats import Replay
from ..protocol.compaction import replay_view
from ..protocol.items import FunctionCall, FunctionCallOutput, InputItem, InputMessage, Reasoning
from ..protocol.tools import qualified_name

ChatMessage = dict[str, Any]


def _assistant(turn: list[ChatMessage]) -> ChatMessage:
    if not turn or turn[-1]["role"] != "assistant":
        turn.append({"role": "assistant", "content": ""})
    return turn[-1]


_DEFAULT_REPLAY = Replay()


def to_chat(
    instructions: str | None, items: Sequence[InputItem], replay: Replay = _DEFAULT_REPLAY
) -> list[ChatMessage]:
    reasoning_key = replay.reasoning_key
    system: list[str] = [instructions] if instructions else []
    chat: list[ChatMessage] = []
    pending_reasoning: str | None = None
    open_assistant = False  # the last chat message is an assistant turn that may grow
    ids: dict[str, str] = {}  # call_id -> the id it renders under (Replay.call_id)
    for item in replay_view(items):
        match item:
            case InputMessage(role="system" | "developer", text=text):
                system.append(text)
            case InputMessage(role="assistant", text=text):
                message: ChatMessage = {"role": "assistant", "content": text}
                if pending_reasoning:
                    message[reasoning_key] = pending_reasoning
                pending_reasoning = None
                chat.append(message)
                open_assistant = True
            case InputMessage(role=role, text=text):
                chat.append({"role": role, "content": text})
                open_assistant = False
            case Reasoning(text=text):
                pending_reasoning = text or None
                open_assistant = False
            case FunctionCall(
                call_id=call_id, name=name, arguments=arguments, namespace=namespace, custom=custom
            ):
                if not open_assistant:
                    chat.append({"role": "assistant", "content": ""})
                    open_assistant = True
                turn = chat[-1]
                if pending_reasoning:
                    turn[reasoning_key] = pending_reasoning
                    pending_reasoning = None
                # A custom tool is offered as one string parameter, `input`.
                args: Any = {"input": arguments} if custom else json.loads(arguments)
                if replay.arguments == "string":
                    args = json.dumps(args, ensure_ascii=False)
                qualified = qualified_name(namespace, name)
                if replay.call_id is not None:
                    call_id = ids.setdefault(call_id, replay.call_id(call_id, qualified, len(ids)))
                turn.setdefault("tool_calls", []).append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": qualified,
                            "arguments": args,
                        },
                    }
                )
            case FunctionCallOutput(call_id=call_id, output=output):
                chat.append(
                    {"role": "tool", "tool_call_id": ids.get(call_id, call_id), "content": output}
                )
                open_assistant = False
    if system:
        chat.insert(0, {"role": "system", "content": "\n\n".join(system)})
    return chat
