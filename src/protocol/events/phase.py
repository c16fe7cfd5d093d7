"""One response's lifecycle as a table (issue 25), in the style of ``machine.py``: pure, no I/O.

A response task (``actors/response_task.py``) is always in exactly one ``Phase`` and moves only
by the ``TRANSITIONS`` table; an input the table does not list for the current phase is a bug,
raised as ``PhaseError`` and never silently ignored.

Phases, in order:
- ``PREPARING``: the request is resolved against its history and rendered; nothing exists, so
  a refusal is the opener's error and leaves nothing.
- ``WAITING``: the prompt is ready, the sequence is not admitted (on its way to the batch, or
  a background job's compaction admits it later, inside the job).
- ``PREFILLING``: a sequence is admitted and the model works on the prompt; a background job
  is still ``queued`` here.
- ``DECODING``: ``in_progress`` was told; output flows.
- ``FINISHING``: the terminal input went into the event machine; the records are being
  written and the terminal event is held until they are.
- ``ENDED``: the terminal event is published and the log closed (or the request was refused
  before the response existed). Nothing leaves it.

A foreground response is ``in_progress`` from its start, so it goes from ``PREFILLING`` to
``DECODING`` as generation begins, not when the model reports work.
"""

from __future__ import annotations

from enum import Enum


class Phase(Enum):
    PREPARING = "preparing"
    WAITING = "waiting for admission"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    FINISHING = "finishing"
    ENDED = "ended"


class Step(Enum):
    """What happens to a response (the inputs of the table)."""

    PREPARED = "prepared"  # rendered, checked, the grammar compiled
    ADMITTED = "admitted"  # a sequence is in the batch
    STARTED = "started"  # in_progress is told
    TERMINAL = "terminal"  # a terminal input was fed: finished, failed, cancelled, steered
    CLOSED = "closed"  # the records are written, the terminal event published
    REFUSED = "refused"  # refused before the response existed: the opener's error


class PhaseError(RuntimeError):
    """A step the table does not allow in the current phase."""


TRANSITIONS: dict[tuple[Phase, Step], Phase] = {
    (Phase.PREPARING, Step.PREPARED): Phase.WAITING,
    (Phase.PREPARING, Step.REFUSED): Phase.ENDED,
    (Phase.WAITING, Step.ADMITTED): Phase.PREFILLING,
    (Phase.WAITING, Step.REFUSED): Phase.ENDED,
    # A background job whose compaction (inside the job) was refused, or that was cancelled
    # before its admission.
    (Phase.WAITING, Step.TERMINAL): Phase.FINISHING,
    # A compaction_trigger's response (issue 28) has no sequence of its own: its summary is
    # another response; it is told in_progress when the summary is done, its item the output.
    (Phase.WAITING, Step.STARTED): Phase.DECODING,
    (Phase.PREFILLING, Step.STARTED): Phase.DECODING,
    (Phase.PREFILLING, Step.TERMINAL): Phase.FINISHING,  # cancelled or failed while queued
    # Admitted, but never announced (shutdown during its registration): nothing to end.
    (Phase.PREFILLING, Step.REFUSED): Phase.ENDED,
    # A server tool search's continuation is a second sequence of the same response.
    (Phase.DECODING, Step.ADMITTED): Phase.DECODING,
    (Phase.DECODING, Step.TERMINAL): Phase.FINISHING,
    (Phase.FINISHING, Step.CLOSED): Phase.ENDED,
}


def advance(phase: Phase, happened: Step) -> Phase:
    """The phase after ``happened``; ``PhaseError`` if the table does not allow it."""
    try:
        return TRANSITIONS[phase, happened]
    except KeyError:
        raise PhaseError(f"{happened.value} is not allowed while {phase.value}") from None


def announced(phase: Phase) -> bool:
    """Whether ``in_progress`` was told (or the response ended)."""
    return phase in (Phase.DECODING, Phase.FINISHING, Phase.ENDED)
