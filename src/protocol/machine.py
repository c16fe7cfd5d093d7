"""The response lifecycle and its SSE event grammar, as a pure table-driven state machine.

One :class:`ResponseMachine` per response. The producer (the response actor) feeds it inputs;
each ``feed`` returns the JSON-ready events to publish, in order, numbered by ``sequence_number``.

Invariants (the rules come first, as in h11's ``_state.py``):
- The legal moves are exactly the rows of ``_TRANSITIONS``. An input without a row raises
  :class:`ProtocolError` *before* anything changes: state, text, ids and the next sequence number
  stay as they were.
- ``sequence_number`` runs 0, 1, 2, ... without gaps across all ``feed`` calls.
- ``response.created`` is the first event; exactly one terminal event (``response.completed``,
  ``response.incomplete``, ``response.failed``, ``response.cancelled``) is the last, after which
  every input is illegal (decision 8).
- Every ``output_item.added`` / ``content_part.added`` that a terminal event reports as output is
  paired with its ``.done`` at the same ``output_index``, ``content_index`` and item id; the item
  id is minted once and is the same in every event and in the snapshot (decision 4).
- The concatenated ``output_text.delta`` of a part equals its ``output_text.done`` text, and the
  final object's ``output`` equals the items sent in ``output_item.done``, in order.

Decisions where OpenAI leaves room:
- An empty ``TextDelta`` emits nothing (and opens no message).
- ``Finish`` without any text completes with ``output: []``: no empty message is invented.
- ``Finish(reason="length")`` ends ``incomplete`` with ``incomplete_details.reason ==
  "max_output_tokens"``; the open message is closed with item status ``incomplete``.
- ``completed_at`` is set only on ``completed`` (the SDK: "only present when the status is
  completed").
- ``Fail`` emits no ``.done`` for an open item: the partial message is abandoned and the failed
  object's ``output`` holds only items already closed (none, with text-only output). A failed
  response's text is not trustworthy, and a ``.done`` would present it as finished.
- ``Cancel`` closes the open message as ``incomplete`` (``.done`` events included), then emits
  ``response.cancelled``: the text streamed so far stays readable in the stored object.
- ``Fail`` and ``Cancel`` are legal before ``Start`` (a queued background job can be cancelled or
  fail to start); the stream is still well formed: ``response.created`` (status ``queued``),
  then the terminal.
- Background (``config.background``): ``Start`` emits ``response.created`` and
  ``response.queued`` with status ``queued`` (as OpenAI's background streams do), then
  ``response.in_progress``. Every non-terminal object of a background response has
  ``output: []`` and all-zero usage, so a poll never exposes partial output (spec 000).
  A foreground non-terminal object has ``usage: null`` and the output produced so far.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from .ids import new_id
from .objects import (
    RESPONSE_ERROR_CODES,
    ItemStatus,
    JsonObject,
    ResponseConfig,
    ResponseErrorCode,
    ResponseStatus,
    Usage,
    message_item,
    output_text_part,
    response_object,
)

__all__ = [
    "TERMINAL_EVENT_TYPES",
    "Cancel",
    "Fail",
    "Finish",
    "MachineInput",
    "ProtocolError",
    "ResponseMachine",
    "Start",
    "State",
    "TextDelta",
]

TERMINAL_EVENT_TYPES: Final = frozenset(
    {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}
)


class ProtocolError(Exception):
    """An input that is illegal in the machine's current state; the machine is unchanged."""


# --- Inputs (sent by the response actor, one per generation milestone) -------------------------


@dataclass(frozen=True, slots=True)
class Start:
    """Generation began (prefill started)."""


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Visible assistant text, already detokenised."""

    text: str


@dataclass(frozen=True, slots=True)
class Finish:
    """The model stopped: on a stop token (``stop``) or at ``max_output_tokens`` (``length``)."""

    reason: Literal["stop", "length"]
    usage: Usage
    completed_at: int


@dataclass(frozen=True, slots=True)
class Fail:
    """Generation failed; ``code`` is one of the SDK's ``ResponseError.code`` values."""

    code: ResponseErrorCode
    message: str
    usage: Usage | None


@dataclass(frozen=True, slots=True)
class Cancel:
    """The response was cancelled (client hang-up or the cancel endpoint)."""

    usage: Usage | None


MachineInput = Start | TextDelta | Finish | Fail | Cancel


# --- The rules ---------------------------------------------------------------------------------


class State(enum.Enum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"  # started, no message open
    IN_MESSAGE = "in_message"  # a message item and its output_text part are open
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"
    CANCELLED = "cancelled"


class _Kind(enum.Enum):
    START = "Start"
    DELTA = "TextDelta"
    EMPTY_DELTA = "TextDelta('')"
    FINISH_STOP = "Finish(stop)"
    FINISH_LENGTH = "Finish(length)"
    FAIL = "Fail"
    CANCEL = "Cancel"


_S = State
_K = _Kind
_OPEN_STATES: Final = (_S.IN_PROGRESS, _S.IN_MESSAGE)

_TRANSITIONS: Final[Mapping[tuple[State, _Kind], State]] = {
    (_S.QUEUED, _K.START): _S.IN_PROGRESS,
    (_S.QUEUED, _K.FAIL): _S.FAILED,
    (_S.QUEUED, _K.CANCEL): _S.CANCELLED,
    (_S.IN_PROGRESS, _K.DELTA): _S.IN_MESSAGE,
    (_S.IN_PROGRESS, _K.EMPTY_DELTA): _S.IN_PROGRESS,
    (_S.IN_MESSAGE, _K.DELTA): _S.IN_MESSAGE,
    (_S.IN_MESSAGE, _K.EMPTY_DELTA): _S.IN_MESSAGE,
    **{(s, _K.FINISH_STOP): _S.COMPLETED for s in _OPEN_STATES},
    **{(s, _K.FINISH_LENGTH): _S.INCOMPLETE for s in _OPEN_STATES},
    **{(s, _K.FAIL): _S.FAILED for s in _OPEN_STATES},
    **{(s, _K.CANCEL): _S.CANCELLED for s in _OPEN_STATES},
}

_STATUS: Final[Mapping[State, ResponseStatus]] = {
    _S.QUEUED: "queued",
    _S.IN_PROGRESS: "in_progress",
    _S.IN_MESSAGE: "in_progress",
    _S.COMPLETED: "completed",
    _S.INCOMPLETE: "incomplete",
    _S.FAILED: "failed",
    _S.CANCELLED: "cancelled",
}

_TERMINAL_EVENT: Final[Mapping[State, str]] = {
    _S.COMPLETED: "response.completed",
    _S.INCOMPLETE: "response.incomplete",
    _S.FAILED: "response.failed",
    _S.CANCELLED: "response.cancelled",
}

_ZERO_USAGE: Final = Usage(0, 0)


def _kind(inp: MachineInput) -> _Kind:
    """Classify an input; also rejects values the type checker cannot (closed Literals)."""
    match inp:
        case Start():
            return _K.START
        case TextDelta(text=text):
            return _K.DELTA if text else _K.EMPTY_DELTA
        case Finish(reason="stop"):
            return _K.FINISH_STOP
        case Finish(reason="length"):
            return _K.FINISH_LENGTH
        case Fail(code=code) if code in RESPONSE_ERROR_CODES:
            return _K.FAIL
        case Cancel():
            return _K.CANCEL
    raise ProtocolError(f"malformed input {inp!r}")


# --- The machine -------------------------------------------------------------------------------


class ResponseMachine:
    """Turns generation milestones into the OpenAI Responses event stream of one response.

    ``id_factory`` mints item ids (``id_factory("msg")``); tests pass a deterministic one.
    """

    def __init__(
        self,
        response_id: str,
        config: ResponseConfig,
        created_at: int,
        *,
        id_factory: Callable[[str], str] = new_id,
    ) -> None:
        self._response_id = response_id
        self._config = config
        self._created_at = created_at
        self._id_factory = id_factory
        self._state = State.QUEUED
        self._seq = 0
        self._done_items: list[JsonObject] = []
        self._msg_id: str | None = None
        self._msg_index = 0
        self._text: list[str] = []
        self._closed_text = ""  # text of messages already closed (for output_text)
        self._usage: Usage | None = None
        self._error: JsonObject | None = None
        self._incomplete_details: JsonObject | None = None
        self._completed_at: int | None = None

    # -- queries --

    @property
    def response_id(self) -> str:
        return self._response_id

    @property
    def config(self) -> ResponseConfig:
        return self._config

    @property
    def state(self) -> State:
        return self._state

    @property
    def status(self) -> ResponseStatus:
        return _STATUS[self._state]

    @property
    def terminal(self) -> bool:
        return self._state in _TERMINAL_EVENT

    @property
    def next_sequence_number(self) -> int:
        """The ``sequence_number`` the next emitted event will carry (= events emitted so far)."""
        return self._seq

    @property
    def output_text(self) -> str:
        """All assistant text produced so far (including an open or abandoned message)."""
        return self._closed_text + "".join(self._text)

    def snapshot(self) -> JsonObject:
        """The Response object as of now; after the terminal event, the final object."""
        return self._response(self.status)

    # -- the one command --

    def feed(self, inp: MachineInput) -> list[JsonObject]:
        """Apply one input; return the events to publish. Raises ProtocolError, changing nothing."""
        kind = _kind(inp)
        target = _TRANSITIONS.get((self._state, kind))
        if target is None:
            raise ProtocolError(f"{kind.value} is illegal in state {self._state.value}")
        # From here on nothing raises: the move is committed while events are built.
        events: list[JsonObject] = []
        match inp:
            case Start():
                events += self._opening(in_progress=True)
            case TextDelta(text=text) if text:
                if self._msg_id is None:
                    events += self._open_message()
                events.append(
                    self._event(
                        "response.output_text.delta", **self._where(), delta=text, logprobs=[]
                    )
                )
                self._text.append(text)
            case Finish(reason=reason, usage=usage, completed_at=completed_at):
                item_status: ItemStatus = "completed" if reason == "stop" else "incomplete"
                events += self._close_message(item_status)
                self._usage = usage
                if reason == "length":
                    self._incomplete_details = {"reason": "max_output_tokens"}
                else:
                    self._completed_at = completed_at
            case Fail(code=code, message=message, usage=usage):
                events += self._opening(in_progress=False)
                self._abandon_message()
                self._error = {"code": code, "message": message}
                self._usage = usage
            case Cancel(usage=usage):
                events += self._opening(in_progress=False)
                events += self._close_message("incomplete")
                self._usage = usage
        self._state = target
        if target in _TERMINAL_EVENT:
            events.append(self._event(_TERMINAL_EVENT[target], response=self.snapshot()))
        return events

    # -- event builders (they mutate; called only after the move is known legal) --

    def _event(self, type_: str, **fields: object) -> JsonObject:
        event: JsonObject = {"type": type_, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def _opening(self, *, in_progress: bool) -> list[JsonObject]:
        """``response.created`` (+ ``queued``) if not yet sent, then ``in_progress`` if asked."""
        events: list[JsonObject] = []
        if self._state is State.QUEUED:
            first: ResponseStatus = (
                "queued" if self._config.background or not in_progress else "in_progress"
            )
            events.append(self._event("response.created", response=self._response(first)))
            if self._config.background:
                events.append(self._event("response.queued", response=self._response("queued")))
        if in_progress:
            events.append(
                self._event("response.in_progress", response=self._response("in_progress"))
            )
        return events

    def _where(self) -> JsonObject:
        assert self._msg_id is not None
        return {"item_id": self._msg_id, "output_index": self._msg_index, "content_index": 0}

    def _open_message(self) -> list[JsonObject]:
        self._msg_id = self._id_factory("msg")
        self._msg_index = len(self._done_items)
        self._text = []
        item = message_item(self._msg_id, "in_progress", [])
        return [
            self._event("response.output_item.added", output_index=self._msg_index, item=item),
            self._event("response.content_part.added", **self._where(), part=output_text_part("")),
        ]

    def _close_message(self, item_status: ItemStatus) -> list[JsonObject]:
        if self._msg_id is None:
            return []
        text = "".join(self._text)
        where = self._where()
        item = message_item(self._msg_id, item_status, [output_text_part(text)])
        events = [
            self._event("response.output_text.done", **where, text=text, logprobs=[]),
            self._event("response.content_part.done", **where, part=output_text_part(text)),
            self._event("response.output_item.done", output_index=self._msg_index, item=item),
        ]
        self._done_items.append(message_item(self._msg_id, item_status, [output_text_part(text)]))
        self._closed_text += text
        self._msg_id = None
        self._text = []
        return events

    def _abandon_message(self) -> None:
        # The text stays in output_text (it was streamed) but never becomes an output item.
        self._closed_text += "".join(self._text)
        self._msg_id = None
        self._text = []

    def _response(self, status: ResponseStatus) -> JsonObject:
        """A Response object with the given status and the machine's current contents."""
        terminal = status not in ("queued", "in_progress")
        background = self._config.background
        output: list[JsonObject]
        if terminal:
            output, usage = copy.deepcopy(self._done_items), self._usage
        elif background:
            output, usage = [], _ZERO_USAGE
        else:
            output, usage = copy.deepcopy(self._done_items), None
            if self._msg_id is not None:
                part = output_text_part("".join(self._text))
                output.append(message_item(self._msg_id, "in_progress", [part]))
        return response_object(
            response_id=self._response_id,
            config=self._config,
            created_at=self._created_at,
            status=status,
            output=output,
            usage=usage,
            error=self._error if terminal else None,
            incomplete_details=self._incomplete_details if terminal else None,
            completed_at=self._completed_at if status == "completed" else None,
        )
