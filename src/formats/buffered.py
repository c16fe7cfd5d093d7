"""The feed/finish shell every incremental parser shares (``stream.StreamParser``,
``harmony.HarmonyParser``).

Invariants: text is appended to one buffer as it is fed and the subclass's ``_run`` turns what
it can decide into events; ``finish`` runs it once more with ``final`` (flush everything, end any
open call) and a second ``finish`` returns nothing; ``feed`` after ``finish`` is an error. Calls
get indices 0, 1, 2... from ``_new_index``, and ``tool_calls`` counts them.
"""

from __future__ import annotations

from .base import ParsedEvent


class BufferedParser:
    """One generation's text -> events (see ``format.Parser``); subclasses supply ``_run``."""

    def __init__(self) -> None:
        self._buf = ""
        self._calls = 0
        self._finished = False

    @property
    def tool_calls(self) -> int:
        """How many calls have started so far."""
        return self._calls

    def feed(self, text: str) -> list[ParsedEvent]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buf += text
        return self._run(final=False)

    def finish(self) -> list[ParsedEvent]:
        """End of generation: flush what was held back and end any open call."""
        if self._finished:
            return []
        self._finished = True
        return self._run(final=True)

    def _new_index(self) -> int:
        self._calls += 1
        return self._calls - 1

    def _run(self, *, final: bool) -> list[ParsedEvent]:
        raise NotImplementedError
