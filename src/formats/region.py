"""The base of every tool region, and the step driver the family regions share.

A region starts where the composite parser saw a tool-call marker and ends where its calls end
(``regions`` holds the tag formats' regions, the family modules theirs). ``ToolRegion.step`` is
one driver for all of them: while a call scanner (``CallScanner``) is open it runs that, else
it runs the region's own ``_advance`` for the state it is in; each returns either the position
it reached (go on) or the ``Step`` to hand back (wait for more text, or the region is over). A
region supplies only its states (``_advance``), what a finished call scanner leads to
(``_call_ended``), and how its open call ends when the region gives up (``_end_open_call``).
Regions that are no state machine (``muse``'s header then a block, ``pythonic``'s whole-block
read) override ``step`` itself.

Invariants (on top of ``base``'s):
- A region that has started no call can always give up: its marker is shown as text and all it
  consumed (``_note``) is read again as ordinary output. A call that has started is never
  taken back.
- Text is consumed only once it is decided: a marker that may still be forming is waited for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from .base import (
    JSON_WS,
    CallStream,
    NewIndex,
    ParsedEvent,
    ScanStatus,
    Step,
    ToolSchemas,
    is_partial,
    skip_ws,
)
from .scan_util import take_until

Advance = int | Step
"""What one state's scan gives the driver: the position reached, or the ``Step`` to return."""


class CallScanner(Protocol):
    """A scanner of one call that a region hands text to (``base.JsonCallScanner``...)."""

    status: ScanStatus

    @property
    def started(self) -> bool: ...

    def step(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> int: ...


class ToolRegion:
    """The text from one tool-call marker to where its calls end (see the module docstring)."""

    def __init__(self, marker: str, new_index: NewIndex, schemas: ToolSchemas | None) -> None:
        self._marker = marker  # held whitespace + marker: shown as text if no call starts
        self._pending: list[str] = []  # consumed since the marker or the last call
        self._new_index = new_index
        self._schemas = schemas
        self._started_any = False
        self._call: CallScanner | None = None  # a call scanner the region hands text to
        self._stream: CallStream | None = None  # a call the region writes itself
        self._parts: list[str] = []  # the name, key or value being read

    def step(self, buf: str, final: bool) -> Step:
        """The shared driver: scan from the buffer's start until a state hands back a Step."""
        out: list[ParsedEvent] = []
        pos = 0
        while True:
            if self._call is not None:
                moved = self._follow_call(buf, pos, final, out)
            else:
                moved = self._advance(buf, pos, final, out)
            if isinstance(moved, Step):
                return moved
            pos = moved

    def _advance(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        """Scan the region's current state from ``pos`` (no call scanner open)."""
        raise NotImplementedError

    def _call_ended(self, status: ScanStatus, pos: int, out: list[ParsedEvent]) -> Advance:
        """A call scanner finished (``done``) or gave up (``error``): by default giving up
        shows the region as text, and a finished call lets the region read on."""
        return self._revert(pos, out) if status == "error" else pos

    def _end_open_call(self, out: list[ParsedEvent]) -> None:
        """End the call the region is writing itself (``_stream``), when it gives up."""

    def _follow_call(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        assert self._call is not None
        end = self._call.step(buf, pos, final, out)
        if self._call.started:
            self._started()
        else:
            self._note(buf[pos:end])
        status = self._call.status
        if status == "running":
            return Step(end, out)
        self._call = None
        return self._call_ended(status, end, out)

    def _note(self, text: str) -> None:
        if text:
            self._pending.append(text)

    def _started(self) -> None:
        """A call has started: the marker and what was read since are no longer taken back."""
        self._started_any = True
        self._marker = ""
        self._pending.clear()

    def _start_call(self, name: str, out: list[ParsedEvent]) -> CallStream:
        self._stream = CallStream(self._new_index)
        self._stream.start(name, out)
        self._started()
        return self._stream

    def _skip_space(self, buf: str, pos: int, chars: str = JSON_WS) -> int:
        """Past whitespace; what is skipped before any call started is noted."""
        end = skip_ws(buf, pos, chars)
        if not self._started_any:
            self._note(buf[pos:end])
        return end

    def _next_marker(
        self,
        buf: str,
        pos: int,
        final: bool,
        wanted: Sequence[str],
        forming: Sequence[str] | None = None,
    ) -> tuple[int, str | None]:
        """Past whitespace, which of ``wanted`` starts there: ``(pos, marker)`` at one (not
        consumed), ``(pos, "")`` at other text, ``(pos, None)`` when the buffer ends there or
        (not ``final``) one of ``forming`` (default: ``wanted``) may still be forming there."""
        pos = self._skip_space(buf, pos)
        if pos == len(buf):
            return pos, None
        if not final and is_partial(buf, pos, wanted if forming is None else forming):
            return pos, None
        return pos, next((m for m in wanted if m and buf.startswith(m, pos)), "")

    def _read_until(
        self, buf: str, pos: int, stops: Sequence[str], final: bool
    ) -> tuple[int, str | None]:
        """Add the text up to the earliest stop to ``_parts`` (noted while no call started):
        ``(pos past the stop, stop)``, or ``(pos, None)`` with no stop yet."""
        text, end, stop = take_until(buf, pos, stops, final)
        self._parts.append(text)
        if not self._started_any:
            self._note(buf[pos:end])
        return end, stop

    def _take_parts(self) -> str:
        text, self._parts = "".join(self._parts), []
        return text

    def _revert(self, pos: int, out: list[ParsedEvent]) -> Step:
        pushback = "".join(self._pending)
        if self._started_any:
            pushback = pushback.lstrip(JSON_WS)
        return Step(pos, out, done=True, revert=self._marker, pushback=pushback)

    def _finish(self, pos: int, out: list[ParsedEvent]) -> Step:
        if self._started_any:
            return Step(pos, out, done=True)
        return self._revert(pos, out)

    def _give_up(self, pos: int, out: list[ParsedEvent]) -> Step:
        """Something unexpected: an open call ends with what it has; a region that started no
        call is shown as text."""
        if self._stream is not None:
            self._end_open_call(out)
        return self._finish(pos, out)


RegionFactory = Callable[[str, NewIndex, ToolSchemas | None], ToolRegion]
"""``(shown_if_reverted, new_index, schemas) -> region``: the region a marker opens."""
