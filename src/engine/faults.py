"""One sequence's fault, kept to itself on the generation thread: what its own code raised
(a logits processor, a seeded sampler) is recorded, a harmless value stands in for the rest of
the step, and the batch removes the sequence after it (``batch.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Fault:
    """The first exception one sequence's own code raised on this thread, if any; the first one
    is also added to ``raised`` (the batch's list of faults to act on after the step)."""

    __slots__ = ("_raised", "error")

    def __init__(self, raised: list[Fault] | None = None) -> None:
        self.error: BaseException | None = None
        self._raised = raised

    def record(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
            if self._raised is not None:
                self._raised.append(self)


def guard(function: Callable[..., Any], fault: Fault, fallback: Callable[..., Any]) -> Any:
    """``function`` for one sequence, recording its exception instead of raising it into the
    batch step (``fallback`` gives a harmless value; the sequence is removed after the step)."""

    def guarded(*args: Any) -> Any:
        if fault.error is None:
            try:
                return function(*args)
            except Exception as exc:
                fault.record(exc)
        return fallback(*args)

    return guarded
