"""Generation timings of one response, reported to an observer (``/metrics``).

Invariants:
- The observer is optional (``Actors.timings``); without one nothing is measured.
- Reporting never raises into the response: an observer's exception is logged and dropped.
- Time to first token runs from the response's creation (its prompt prepared) to the first
  generated token; tokens per second is the output tokens after the first over the time
  from the first token to the terminal output (reported only with at least two tokens).
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

log = logging.getLogger(__name__)


class TimingsObserver(Protocol):
    def first_token(self, seconds: float) -> None: ...

    def finished(self, tokens: int, decode_seconds: float) -> None: ...

    def cancelled(self, reason: str) -> None: ...


def report_cancel(observer: TimingsObserver | None, reason: str | None) -> None:
    """A response ended by cancellation (the supervisor's reason; None: its scope ended)."""
    if observer is None:
        return
    try:
        observer.cancelled(reason or "other")
    except Exception:
        log.exception("a timings observer failed")


class RunTimings:
    """Owned by one ``ResponseRun`` (its task); ``saw`` is called with each model output."""

    __slots__ = ("_first", "_observer", "_started", "_tokens")

    def __init__(self, observer: TimingsObserver | None) -> None:
        self._observer = observer
        self._started = time.monotonic()
        self._first: float | None = None
        self._tokens = 0

    def saw(self, new_tokens: int, final: bool) -> None:
        observer = self._observer
        if observer is None:
            return
        try:
            now = time.monotonic()
            if new_tokens > 0 and self._first is None:
                self._first = now
                observer.first_token(now - self._started)
            self._tokens += new_tokens
            if final and self._first is not None and self._tokens >= 2 and now > self._first:
                observer.finished(self._tokens - 1, now - self._first)
        except Exception:
            log.exception("a timings observer failed")
