"""One response's life as one table, in the style of h11's ``_state.py``: pure, no I/O.

Everything that decides how a response moves is here; ``actors/run.py`` (``ResponseRun``) and
``actors/response_task.py`` only drive it: they tell the table what happened (an ``Input``),
do what the ``Move`` it answers says, and ask it what to do next (``next_action``).

The machines and how they are coupled (each row of ``TRANSITIONS`` says all of it at once):
- The phase (``Phase``): where the response is, from preparation to its closed log.
- The event machine (``machine.py``): a move's ``feeds`` are what it is fed, in order, as the
  phase moves: ``START`` (``Start``, with a compaction item when the history was compacted
  first), then one terminal input (``FINISH``, ``STEER``, ``CANCEL``, ``FAIL``). Every row
  into ``FINISHING`` feeds exactly one terminal input and ``FINISHING`` has no row that
  leaves for anywhere but ``ENDED``, so a response gets exactly one terminal event.
- What ``/status`` shows (``EventLog.status``): a move's ``status``, ``None`` where it stays
  as it was (the log is closed soon after any terminal input).
- The store: a terminal move's ``records`` says whether the final record is written (and the
  turn appended to its conversation) before the terminal event is published; a client that
  hung up leaves nothing. ``STORE_FAILED`` (the write failed, or the store did not answer in
  time) feeds ``FAIL`` to the machine as it was before the terminal input: that event is the
  one published, and the one followers see; the response is then ``FAILING``, where only
  ``STORED`` is open, so a store fails a response once.
- The sequence in the batch: a terminal move's ``release`` says the sequence leaves the batch
  at once (a cancel frees it within one step), rather than having finished by itself.

The route (``Route``) is how a response gets its output; it is chosen once, as the response
exists (``route_of``), and with the phase it decides the next action (``NEXT_ACTION``). The
special lives are rows of the same table, not methods beside it:
- ``GENERATE``: admitted at its open, generates.
- ``WARM_UP`` (``generate: false``): its prompt is prefilled, it ends with no output.
- ``COMPACT_NOW`` (a ``compaction_trigger``): no sequence of its own; its summary is another
  response, and it starts (``WAITING`` -> ``STARTED``) with the compaction item as its output.
- ``ADMIT_LATER`` (a background job that compacts): the summary generates inside the job,
  then the compacted prompt is admitted (``WAITING`` -> ``ADMITTED``), or it ends ``failed``.
- A compaction's summary (``/v1/responses/compact`` or automatic compaction) is a response of
  route ``GENERATE`` whose opener, when it leaves, leaves nothing (``HUNG_UP``).

A server-run tool (``tool_search``, ``web_search``, an ``mcp`` server's tool) does not end the
response; its call and result are items of the same response and the model goes on in a second
sequence:
``DECODING`` -> ``TOOL_CALLED`` -> ``TOOL_RUNNING`` -> ``TOOL_OUTPUT`` -> ``CONTINUING`` ->
``CONTINUATION_ADMITTED`` -> ``DECODING``. ``FINISHED`` in ``CONTINUING`` ends it with the
call and its output when no continuation can be admitted (no budget left, refused).

Cancel reasons map to inputs (``CANCEL_INPUT``): the cancel endpoint and shutdown are
recorded, a steer ends ``incomplete`` / ``steered`` (a successor follows), a hang-up is not
recorded. An input the table does not list for the phase is a bug, raised as
``LifecycleError`` and never silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final, Literal


class Phase(Enum):
    """Where a response is; it only moves on (the continuation's loop aside)."""

    PREPARING = "preparing"  # resolved and rendered; nothing exists, a refusal is the opener's
    WAITING = "waiting for admission"  # the prompt is ready, no sequence is admitted
    PREFILLING = "prefilling"  # a sequence is admitted; a background job is still queued
    DECODING = "decoding"  # in_progress was told; output flows
    TOOL_RUNNING = "running a server tool"  # a server-run tool's call is out, its result due
    CONTINUING = "admitting the continuation"  # the tool's result is out, the next sequence due
    FINISHING = "finishing"  # the terminal input is fed; the records are being written
    FAILING = "finishing failed"  # the records could not be written: it ends failed instead
    ENDED = "ended"  # the terminal event is published and the log closed, or it was refused


class Input(Enum):
    """What happens to a response (the table's inputs)."""

    PREPARED = "prepared"  # rendered, checked, the grammar compiled
    ADMITTED = "admitted"  # its sequence is in the batch
    STARTED = "started"  # in_progress is told (the model reports work; a foreground at once)
    TOOL_CALLED = "a server tool was called"  # the call item is out; the sequence stopped
    TOOL_OUTPUT = "the server tool's result is out"  # its output item is published
    CONTINUATION_ADMITTED = "the continuation is admitted"  # the next sequence is in the batch
    FINISHED = "finished"  # a stop or the length limit (or, continuing, no continuation)
    STEERED = "steered"  # steering input for a successor arrived: incomplete / steered
    CANCELLED = "cancelled"  # the cancel endpoint
    SHUTDOWN = "shutdown"  # the server stops while it runs
    HUNG_UP = "hung up"  # its opener left: a client, or a summary's caller
    FAILED = "failed"  # the model or the server failed, or a later compaction was refused
    REFUSED = "refused"  # refused before it was announced: the opener's error, nothing left
    STORE_FAILED = "store failed"  # the records could not be written: it ends failed instead
    STORED = "stored"  # the records are written and the terminal event published


class Feed(Enum):
    """What the event machine is fed (``actors/run.py`` builds the input with its counts)."""

    START = "Start"
    FINISH = "Finish(stop|length)"
    STEER = "Finish(steered)"
    CANCEL = "Cancel"
    FAIL = "Fail"


class Route(Enum):
    """How a response gets its output; chosen once, as it exists."""

    GENERATE = "generate"
    WARM_UP = "warm-up"
    COMPACT_NOW = "compaction trigger"
    ADMIT_LATER = "compacts, then admitted"


class Action(Enum):
    """What the driver does next (``next_action``); each one moves the phase."""

    GENERATE = "generate"  # receive the sequence's output until the phase leaves decoding
    PREFILL = "prefill only"  # a warm-up: prefill the prompt, finish with no output
    COMPACT_WHOLE = "summarize everything"  # a compaction trigger's summary is its output
    COMPACT_THEN_ADMIT = "compact, then admit"  # a background job's compaction
    RUN_SERVER_TOOL = "run the server tool"  # its result goes out (tool_search: already out)
    ADMIT_CONTINUATION = "admit the continuation"


Status = Literal["queued", "in_progress"]


@dataclass(frozen=True, slots=True)
class Move:
    """One row's consequences: the next phase and what follows from it."""

    phase: Phase
    feeds: tuple[Feed, ...] = ()
    status: Status | None = None  # what /status shows from now on (None: unchanged)
    records: bool = False  # the final record is written before the terminal event
    release: bool = False  # the sequence leaves the batch now

    @property
    def terminal(self) -> bool:
        return self.phase in (Phase.FINISHING, Phase.FAILING) and bool(self.feeds)


class LifecycleError(RuntimeError):
    """An input the table does not allow in the current phase."""


_P = Phase
_I = Input
_F = Feed
# The ends open to a response at each phase, and what the event machine is fed for each. A
# response not yet started is started first when steered: ``incomplete`` needs ``in_progress``.
_ENDS_STARTED: Final[Mapping[Input, Move]] = {
    _I.FINISHED: Move(_P.FINISHING, (_F.FINISH,), records=True),
    _I.STEERED: Move(_P.FINISHING, (_F.STEER,), records=True, release=True),
    _I.CANCELLED: Move(_P.FINISHING, (_F.CANCEL,), records=True, release=True),
    # Failed, as a sequence the stopping model ends is ("The server is shutting down."),
    # whichever comes first: the model's end or the response's own cancellation.
    _I.SHUTDOWN: Move(_P.FINISHING, (_F.FAIL,), records=True, release=True),
    _I.HUNG_UP: Move(_P.FINISHING, (_F.CANCEL,), release=True),
    _I.FAILED: Move(_P.FINISHING, (_F.FAIL,), records=True, release=True),
}
_ENDS_UNSTARTED: Final[Mapping[Input, Move]] = {
    **{happened: move for happened, move in _ENDS_STARTED.items() if happened is not _I.FINISHED},
    _I.STEERED: Move(_P.FINISHING, (_F.START, _F.STEER), "in_progress", records=True, release=True),
}


def _ends(phase: Phase, ends: Mapping[Input, Move]) -> dict[tuple[Phase, Input], Move]:
    return {(phase, happened): move for happened, move in ends.items()}


TRANSITIONS: Final[Mapping[tuple[Phase, Input], Move]] = {
    (_P.PREPARING, _I.PREPARED): Move(_P.WAITING, status="queued"),
    (_P.PREPARING, _I.REFUSED): Move(_P.ENDED),
    (_P.WAITING, _I.ADMITTED): Move(_P.PREFILLING),
    (_P.WAITING, _I.REFUSED): Move(_P.ENDED),
    # No sequence of its own (a compaction trigger, a warm-up with nothing admitted).
    (_P.WAITING, _I.STARTED): Move(_P.DECODING, (_F.START,), "in_progress"),
    # A background job whose compaction was refused, or that was cancelled before admission.
    **_ends(_P.WAITING, _ENDS_UNSTARTED),
    (_P.PREFILLING, _I.STARTED): Move(_P.DECODING, (_F.START,), "in_progress"),
    # Admitted, never announced (the server stopped during its registration): nothing to end.
    (_P.PREFILLING, _I.REFUSED): Move(_P.ENDED, release=True),
    **_ends(_P.PREFILLING, _ENDS_UNSTARTED),
    (_P.DECODING, _I.TOOL_CALLED): Move(_P.TOOL_RUNNING),
    **_ends(_P.DECODING, _ENDS_STARTED),
    (_P.TOOL_RUNNING, _I.TOOL_OUTPUT): Move(_P.CONTINUING),
    **_ends(_P.TOOL_RUNNING, {k: v for k, v in _ENDS_STARTED.items() if k is not _I.FINISHED}),
    (_P.CONTINUING, _I.CONTINUATION_ADMITTED): Move(_P.DECODING),
    **_ends(_P.CONTINUING, _ENDS_STARTED),
    # The machine as it was before the terminal input is fed a failure instead.
    # Once: the failure is the terminal event, and what follows it is only published.
    (_P.FINISHING, _I.STORE_FAILED): Move(_P.FAILING, (_F.FAIL,), records=True),
    (_P.FINISHING, _I.STORED): Move(_P.ENDED),
    (_P.FAILING, _I.STORED): Move(_P.ENDED),
}

NEXT_ACTION: Final[Mapping[tuple[Route, Phase], Action]] = {
    (Route.GENERATE, _P.PREFILLING): Action.GENERATE,
    (Route.WARM_UP, _P.WAITING): Action.PREFILL,
    (Route.WARM_UP, _P.PREFILLING): Action.PREFILL,
    (Route.COMPACT_NOW, _P.WAITING): Action.COMPACT_WHOLE,
    (Route.ADMIT_LATER, _P.WAITING): Action.COMPACT_THEN_ADMIT,
    (Route.ADMIT_LATER, _P.PREFILLING): Action.GENERATE,
    **{(route, _P.DECODING): Action.GENERATE for route in (Route.GENERATE, Route.ADMIT_LATER)},
    **{(route, _P.TOOL_RUNNING): Action.RUN_SERVER_TOOL for route in Route},
    **{(route, _P.CONTINUING): Action.ADMIT_CONTINUATION for route in Route},
}
"""What the driver does in a phase; no row: nothing left to drive (it is finishing, ended,
or a warm-up or compaction trigger that started and ends within its action)."""

CancelReason = Literal["cancel requested", "client disconnected", "shutdown", "steered"]

CANCEL_INPUT: Final[Mapping[CancelReason | None, Input]] = {
    "cancel requested": _I.CANCELLED,
    None: _I.CANCELLED,
    "client disconnected": _I.HUNG_UP,
    "shutdown": _I.SHUTDOWN,
    "steered": _I.STEERED,
}


def advance(phase: Phase, happened: Input) -> Move:
    """The move ``happened`` makes from ``phase``; ``LifecycleError`` if the table has none."""
    try:
        return TRANSITIONS[phase, happened]
    except KeyError:
        raise LifecycleError(f"{happened.value} is not allowed while {phase.value}") from None


def next_action(route: Route, phase: Phase) -> Action | None:
    """What a response on ``route`` does next in ``phase`` (None: nothing left to drive)."""
    return NEXT_ACTION.get((route, phase))


def route_of(*, generate: bool, compact_now: bool, admitted: bool) -> Route:
    """The route of a response as it exists (a warm-up is one even when it would compact)."""
    if not generate:
        return Route.WARM_UP
    if compact_now:
        return Route.COMPACT_NOW
    return Route.GENERATE if admitted else Route.ADMIT_LATER


def announced(phase: Phase) -> bool:
    """Whether ``in_progress`` was told (or the response ended)."""
    return phase not in (Phase.PREPARING, Phase.WAITING, Phase.PREFILLING)
