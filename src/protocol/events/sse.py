"""Server-sent events: the encoder the server writes with, and a decoder for tests and benchmarks.

Invariants:
- ``encode_sse`` writes one whole event per call: ``event: <type>\\ndata: <json>\\n\\n``, the JSON
  compact and on one line (JSON escapes CR and LF inside strings, so none can appear raw), UTF-8.
  ``NaN``/``Infinity`` are refused: they are not JSON.
- ``SseDecoder`` follows the WHATWG event-stream parsing rules (LF, CR or CRLF line ends, ``:``
  comments, multi-line ``data``, one optional space after the colon, a leading BOM) and is
  incremental: feeding any split of the same bytes yields the same events. It buffers a partial
  event until its blank line; bytes after the last blank line are never reported.
- Both are pure: no I/O, no clock.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["SseDecoder", "SseError", "encode_sse"]

# One encoder for every event (``json.dumps`` with options builds a new one per call).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class SseError(ValueError):
    """A decoded event whose data is not one JSON object."""


def encode_sse(event: dict[str, Any]) -> bytes:
    """Encode one event; its ``type`` becomes the ``event:`` line."""
    event_type = event["type"]
    if (
        not isinstance(event_type, str)
        or not event_type
        or "\n" in event_type
        or "\r" in event_type
    ):
        raise ValueError(f"event type must be a one-line non-empty string, got {event_type!r}")
    return f"event: {event_type}\ndata: {_ENCODER.encode(event)}\n\n".encode()


class SseDecoder:
    """Incremental decoder: ``feed`` bytes as they arrive, get ``(event_type, data)`` pairs."""

    __slots__ = ("_after_cr", "_buffer", "_data", "_event_type", "_started")

    def __init__(self) -> None:
        self._buffer = b""
        self._event_type = ""
        self._data: list[str] = []
        self._started = False
        self._after_cr = False  # the last line ended in CR: skip an LF that starts the next chunk

    @property
    def at_boundary(self) -> bool:
        """True when no partial line or event is buffered (a clean place for a stream to end)."""
        return not self._buffer and not self._data and not self._event_type

    def feed(self, chunk: bytes) -> list[tuple[str, dict[str, Any]]]:
        """Consume ``chunk``; return the events it completed, in order."""
        buffer = self._buffer + chunk
        if not self._started:
            if len(buffer) < 3 and b"\xef\xbb\xbf".startswith(buffer):
                self._buffer = buffer
                return []  # may still be the start of a BOM
            self._started = True
            buffer = buffer.removeprefix(b"\xef\xbb\xbf")
        events: list[tuple[str, dict[str, Any]]] = []
        start = 0
        if self._after_cr and buffer.startswith(b"\n"):
            start = 1  # the LF of a CRLF split across chunks
        lf = cr = -2  # next LF / CR at or after `start`; -2: not searched yet, -1: none
        while True:
            if lf != -1 and lf < start:
                lf = buffer.find(b"\n", start)
            if cr != -1 and cr < start:
                cr = buffer.find(b"\r", start)
            if cr != -1 and (lf == -1 or cr < lf):
                # A CR ends the line at once (a CR-only stream is never held back); an LF right
                # after it, here or at the start of the next chunk, is part of the same line end.
                end, nxt = cr, cr + 2 if buffer[cr + 1 : cr + 2] == b"\n" else cr + 1
            elif lf != -1:
                end, nxt = lf, lf + 1
            else:
                break
            event = self._line(buffer[start:end].decode("utf-8"))
            if event is not None:
                events.append(event)
            start = nxt
        if buffer:
            self._after_cr = start == len(buffer) and buffer.endswith(b"\r")
        self._buffer = buffer[start:]
        return events

    def _line(self, line: str) -> tuple[str, dict[str, Any]] | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon:
            value = value.removeprefix(" ")
        if name == "event":
            self._event_type = value
        elif name == "data":
            self._data.append(value)
        # `id`, `retry` and unknown fields carry nothing these streams use.
        return None

    def _dispatch(self) -> tuple[str, dict[str, Any]] | None:
        event_type, data = self._event_type or "message", self._data
        self._event_type, self._data = "", []
        if not data:
            return None
        text = "\n".join(data)
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise SseError(f"event {event_type!r}: data is not JSON: {text[:200]!r}") from exc
        if not isinstance(value, dict):
            raise SseError(f"event {event_type!r}: data is not a JSON object: {text[:200]!r}")
        return event_type, value
