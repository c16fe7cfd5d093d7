"""The event machine's rules (``machine.py``): its states, the kinds of input, and the
transition table, with each state's response status and terminal event.

Invariants:
- The legal moves are exactly the rows of ``TRANSITIONS``; ``classify`` rejects a malformed
  input (closed Literals the type checker cannot hold) with ``ProtocolError``.
- Legality depends on the input's kind only, never on whether it is empty. A hosted
  ``ToolCallBegin`` (not an approval) is a kind of its own, entering ``IN_HOSTED_CALL``; its
  ``ToolCallEnd`` leads to ``HOSTED_RUNNING``, where only ``HostedResult``, ``Fail``,
  ``Cancel`` and ``Finish(length|steered)`` are legal. An approval request is a call the
  client answers (``IN_TOOL_CALL``). ``WholeItem`` is legal where a call may begin.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

from ..objects import RESPONSE_ERROR_CODES, ResponseStatus, Usage, is_part_logprob
from .inputs import (
    Cancel,
    Compacted,
    Fail,
    Finish,
    HostedCall,
    HostedResult,
    MachineInput,
    ProtocolError,
    ReasoningDelta,
    Start,
    TextDelta,
    ToolCallArgs,
    ToolCallBegin,
    ToolCallEnd,
    WholeItem,
)


class State(enum.Enum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"  # started, no item open
    IN_MESSAGE = "in_message"  # a message item and its output_text part are open
    IN_REASONING = "in_reasoning"  # a reasoning item and its reasoning_text part are open
    IN_TOOL_CALL = "in_tool_call"  # a function_call item is open, its arguments streaming
    # (or another call the client answers: custom, tool search, mcp_approval_request)
    IN_HOSTED_CALL = "in_hosted_call"  # a web_search_call / mcp_call is open, arguments streaming
    HOSTED_RUNNING = "hosted_running"  # that call's arguments are done; the server runs it
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Kind(enum.Enum):
    START = "Start"
    DELTA = "TextDelta"
    EMPTY_DELTA = "TextDelta('')"
    REASONING = "ReasoningDelta"
    EMPTY_REASONING = "ReasoningDelta('')"
    CALL_BEGIN = "ToolCallBegin"
    CALL_ARGS = "ToolCallArgs"
    CALL_END = "ToolCallEnd"
    HOSTED_BEGIN = "ToolCallBegin(hosted)"
    HOSTED_RESULT = "HostedResult"
    WHOLE_ITEM = "WholeItem"
    FINISH_STOP = "Finish(stop)"
    FINISH_LENGTH = "Finish(length)"
    FINISH_STEERED = "Finish(steered)"
    FAIL = "Fail"
    CANCEL = "Cancel"


_S = State
_K = Kind
_BETWEEN_CALLS: Final = (_S.IN_PROGRESS, _S.IN_MESSAGE, _S.IN_REASONING)
_OPEN_STATES: Final = (*_BETWEEN_CALLS, _S.IN_TOOL_CALL, _S.IN_HOSTED_CALL, _S.HOSTED_RUNNING)

TRANSITIONS: Final[Mapping[tuple[State, Kind], State]] = {
    (_S.QUEUED, _K.START): _S.IN_PROGRESS,
    (_S.QUEUED, _K.FAIL): _S.FAILED,
    (_S.QUEUED, _K.CANCEL): _S.CANCELLED,
    **{(s, _K.DELTA): _S.IN_MESSAGE for s in _BETWEEN_CALLS},
    **{(s, _K.EMPTY_DELTA): s for s in _BETWEEN_CALLS},
    **{(s, _K.REASONING): _S.IN_REASONING for s in _BETWEEN_CALLS},
    **{(s, _K.EMPTY_REASONING): s for s in _BETWEEN_CALLS},
    **{(s, _K.CALL_BEGIN): _S.IN_TOOL_CALL for s in _BETWEEN_CALLS},
    **{(s, _K.FINISH_STOP): _S.COMPLETED for s in _BETWEEN_CALLS},
    (_S.IN_TOOL_CALL, _K.CALL_ARGS): _S.IN_TOOL_CALL,
    (_S.IN_TOOL_CALL, _K.CALL_END): _S.IN_PROGRESS,
    **{(s, _K.HOSTED_BEGIN): _S.IN_HOSTED_CALL for s in _BETWEEN_CALLS},
    (_S.IN_HOSTED_CALL, _K.CALL_ARGS): _S.IN_HOSTED_CALL,
    (_S.IN_HOSTED_CALL, _K.CALL_END): _S.HOSTED_RUNNING,
    (_S.HOSTED_RUNNING, _K.HOSTED_RESULT): _S.IN_PROGRESS,
    **{(s, _K.WHOLE_ITEM): _S.IN_PROGRESS for s in _BETWEEN_CALLS},
    **{(s, _K.FINISH_LENGTH): _S.INCOMPLETE for s in _OPEN_STATES},
    **{(s, _K.FINISH_STEERED): _S.INCOMPLETE for s in _OPEN_STATES},
    **{(s, _K.FAIL): _S.FAILED for s in _OPEN_STATES},
    **{(s, _K.CANCEL): _S.CANCELLED for s in _OPEN_STATES},
}

STATUS: Final[Mapping[State, ResponseStatus]] = {
    _S.QUEUED: "queued",
    _S.IN_PROGRESS: "in_progress",
    _S.IN_MESSAGE: "in_progress",
    _S.IN_REASONING: "in_progress",
    _S.IN_TOOL_CALL: "in_progress",
    _S.IN_HOSTED_CALL: "in_progress",
    _S.HOSTED_RUNNING: "in_progress",
    _S.COMPLETED: "completed",
    _S.INCOMPLETE: "incomplete",
    _S.FAILED: "failed",
    _S.CANCELLED: "cancelled",
}

TERMINAL_EVENT: Final[Mapping[State, str]] = {
    _S.COMPLETED: "response.completed",
    _S.INCOMPLETE: "response.incomplete",
    _S.FAILED: "response.failed",
    _S.CANCELLED: "response.cancelled",
}

ZERO_USAGE: Final = Usage(0, 0)


def classify(inp: MachineInput) -> Kind:
    """Classify an input; also rejects values the type checker cannot (closed Literals)."""
    match inp:
        case Start(compaction=compaction) if compaction is None or _is_compacted(compaction):
            return _K.START
        case TextDelta(text=text, logprobs=logprobs) if all(map(is_part_logprob, logprobs)):
            if text:
                return _K.DELTA
            if not logprobs:
                return _K.EMPTY_DELTA
        case ReasoningDelta(text=text):
            return _K.REASONING if text else _K.EMPTY_REASONING
        case ToolCallBegin(name=name, call_id=call_id, hosted=None) if name and call_id != "":
            return _K.CALL_BEGIN
        case ToolCallBegin(hosted=HostedCall() as hosted) if _is_hosted_begin(inp, hosted):
            return _K.CALL_BEGIN if hosted.approval else _K.HOSTED_BEGIN
        case ToolCallArgs():
            return _K.CALL_ARGS
        case ToolCallEnd():
            return _K.CALL_END
        case HostedResult(error=error) if error is None or isinstance(error, str | Mapping):
            return _K.HOSTED_RESULT
        case WholeItem(item=item) if _is_whole_item(item):
            return _K.WHOLE_ITEM
        case Finish(reason="stop"):
            return _K.FINISH_STOP
        case Finish(reason="length"):
            return _K.FINISH_LENGTH
        case Finish(reason="steered"):
            return _K.FINISH_STEERED
        case Fail(code=code) if code in RESPONSE_ERROR_CODES:
            return _K.FAIL
        case Cancel():
            return _K.CANCEL
    raise ProtocolError(f"malformed input {inp!r}")


def _is_compacted(step: Compacted) -> bool:
    item = step.item
    counts = (step.input_tokens_before, step.input_tokens_after)
    return (
        set(item) == {"id", "type", "encrypted_content"}
        and item["type"] == "compaction"
        and all(isinstance(item[key], str) and item[key] for key in ("id", "encrypted_content"))
        and all(type(count) is int and count >= 0 for count in counts)
    )


def _is_hosted_begin(begin: ToolCallBegin, hosted: HostedCall) -> bool:
    """A hosted call is named and plain (no call id, namespace, custom or search); an MCP one
    names its server, a web search none, and only an MCP call asks for approval."""
    plain = begin.call_id is None and begin.namespace is None and not begin.custom
    if not (begin.name and plain and begin.search is None):
        return False
    if hosted.kind == "mcp":
        return bool(hosted.server_label)
    return hosted.kind == "web_search" and not hosted.server_label and not hosted.approval


_WHOLE_TYPES: Final = frozenset({"mcp_list_tools", "mcp_call"})


def _is_whole_item(item: object) -> bool:
    if not isinstance(item, Mapping):
        return False
    item_id = item.get("id")
    return item.get("type") in _WHOLE_TYPES and isinstance(item_id, str) and bool(item_id)
