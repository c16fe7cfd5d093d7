"""Parsed-output events and the pieces every tool-call format shares.

Every format's parser produces these events; they live here so that the per-format parsers
(``regions``, ``harmony``...) can build them without importing one another.

Invariants:
- A scanner reads a buffer from a position and returns how far it consumed. It decides each
  character from the text before it only, so where the generated text was cut into chunks never
  changes what it emits; it stops before text that could still mean two things and waits.
- A call's ``ToolCallArgs`` deltas always join to the ``arguments`` of its ``ToolCallEnd``:
  ``CallStream.end`` only ever appends to what was sent, never contradicts it.
- A scanner that has not emitted ``ToolCallStart`` may give up (``ERROR``); one that has
  started always ends its call (``DONE``), whatever follows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

# Function name -> JSON Schema of its parameters.
ToolSchemas = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class ParseOptions:
    """One generation's parsing settings."""

    tools_enabled: bool  # tool calls are parsed (else every marker is text)
    reasoning: bool  # the model writes ``<think>`` reasoning (mlx-lm's ``has_thinking``)
    starts_in_reasoning: bool = False  # the prompt already opened the reasoning
    # Function name -> JSON Schema of its parameters (types XML parameter values).
    tool_schemas: ToolSchemas | None = None


@dataclass(frozen=True, slots=True)
class TextChunk:
    """Visible assistant text."""

    text: str


@dataclass(frozen=True, slots=True)
class ReasoningChunk:
    """Text inside ``<think>...</think>`` (the tags themselves never appear)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A call's name is known; ``index`` counts calls in this response from 0."""

    index: int
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArgs:
    """A fragment of the call's arguments JSON text."""

    index: int
    delta: str


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    """The call is complete; ``arguments`` equals the join of its ``ToolCallArgs`` deltas."""

    index: int
    name: str
    arguments: str


ParsedEvent: TypeAlias = TextChunk | ReasoningChunk | ToolCallStart | ToolCallArgs | ToolCallEnd

NewIndex: TypeAlias = Callable[[], int]
ScanStatus = Literal["running", "done", "error"]

JSON_WS = " \t\r\n"


@dataclass(slots=True)
class Step:
    """What a tool region did with the buffer it was given.

    ``consumed`` characters of the buffer are used up; the rest stays buffered. When ``done``,
    the region is over: ``revert`` is shown as text (the marker of a region that produced no
    call) and ``pushback`` is read again as ordinary output, ahead of the unconsumed rest.
    """

    consumed: int
    events: list[ParsedEvent] = field(default_factory=list)
    done: bool = False
    revert: str = ""
    pushback: str = ""


def skip_ws(buf: str, pos: int, chars: str = JSON_WS) -> int:
    while pos < len(buf) and buf[pos] in chars:
        pos += 1
    return pos


def partial_suffix(buf: str, start: int, markers: Iterable[str]) -> int:
    """Length of the longest tail of ``buf[start:]`` that is a proper prefix of a marker."""
    markers = tuple(markers)
    longest = min(len(buf) - start, max((len(m) for m in markers), default=1) - 1)
    for k in range(longest, 0, -1):
        tail = buf[len(buf) - k :]
        if any(len(m) > k and m.startswith(tail) for m in markers):
            return k
    return 0


def is_partial(buf: str, pos: int, markers: Iterable[str]) -> bool:
    """True when ``buf[pos:]`` is non-empty and could still grow into one of ``markers``."""
    rest = buf[pos:]
    return bool(rest) and any(len(m) > len(rest) and m.startswith(rest) for m in markers)


def find_first(buf: str, pos: int, markers: Iterable[str]) -> tuple[int, str]:
    """The earliest full occurrence of any marker at or after ``pos``: (index, marker) or (-1, "")."""
    best, found = -1, ""
    for marker in markers:
        i = buf.find(marker, pos)
        if i >= 0 and (best < 0 or i < best):
            best, found = i, marker
    return best, found


class CallStream:
    """One call as the consumer sees it: its index once started, and the argument text sent."""

    __slots__ = ("_new_index", "_sent", "index", "name", "started")

    def __init__(self, new_index: NewIndex) -> None:
        self._new_index = new_index
        self._sent: list[str] = []
        self.index = -1
        self.name = ""
        self.started = False

    def start(self, name: str, out: list[ParsedEvent]) -> None:
        self.index = self._new_index()
        self.name = name
        self.started = True
        out.append(ToolCallStart(self.index, name))

    def send(self, delta: str, out: list[ParsedEvent]) -> None:
        if delta:
            self._sent.append(delta)
            out.append(ToolCallArgs(self.index, delta))

    def end(self, arguments: str, out: list[ParsedEvent]) -> None:
        """Send the unsent rest of ``arguments``, then the end; what was sent always stands."""
        sent = "".join(self._sent)
        if not arguments.startswith(sent):
            arguments = sent
        self.send(arguments[len(sent) :], out)
        out.append(ToolCallEnd(self.index, self.name, arguments))


_STRING_STOP = re.compile(r'["\\]')
_NESTED_STOP = re.compile(r'[\[\]{}"\\]')
_SCALAR_END = re.compile(r"[^0-9A-Za-z+\-.]")

ValueKind = Literal["object", "array", "string", "scalar"]


class JsonValue:
    """Consumes exactly one JSON value's text, leniently: strings and nesting are tracked so
    the end is found, but the content is not validated (``json.loads`` does that later)."""

    __slots__ = ("_depth", "_escape", "_in_string", "complete", "kind")

    def __init__(self, kind: ValueKind) -> None:
        self.kind: ValueKind = kind
        self._depth = 0
        self._in_string = False
        self._escape = False
        self.complete = False

    @staticmethod
    def begin(first: str) -> JsonValue | None:
        """The scanner for a value whose first character is ``first``, or None if none can."""
        if first == "{":
            return JsonValue("object")
        if first == "[":
            return JsonValue("array")
        if first == '"':
            return JsonValue("string")
        if first == "-" or (first.isascii() and first.isalnum()):
            return JsonValue("scalar")
        return None

    def feed(self, buf: str, pos: int, final: bool) -> int:
        n = len(buf)
        while pos < n and not self.complete:
            if self._escape:
                self._escape = False
                pos += 1
            elif self._in_string:
                m = _STRING_STOP.search(buf, pos)
                if m is None:
                    return n
                pos = m.end()
                if m.group() == "\\":
                    self._escape = True
                else:
                    self._in_string = False
                    self.complete = self._depth == 0
            elif self.kind == "scalar":
                m = _SCALAR_END.search(buf, pos)
                if m is None:
                    pos = n
                    break
                self.complete = True
                return m.start()
            else:
                m = _NESTED_STOP.search(buf, pos)
                if m is None:
                    return n
                pos = m.end()
                c = m.group()
                if c == '"':
                    self._in_string = True
                elif c in "[{":
                    self._depth += 1
                elif c in "]}":
                    self._depth -= 1
                    self.complete = self._depth <= 0
        if final and self.kind == "scalar":
            self.complete = True
        return pos


def decode_string(raw: str) -> str | None:
    try:
        value = json.loads(raw, strict=False)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


class ArgsText:
    """The raw text of a call's arguments value, as generated.

    Only an object is streamed (raw, as it is generated); its final text is that same raw text.
    Any other value is held and turned into the final text at the end: a string holding a JSON
    object gives that object's text, ``null`` gives ``{}``, anything else stays as written.
    """

    __slots__ = ("_parts", "complete", "kind")

    def __init__(self, kind: ValueKind) -> None:
        self.kind = kind
        self._parts: list[str] = []
        self.complete = False

    @property
    def streams(self) -> bool:
        return self.kind == "object"

    def add(self, chunk: str) -> None:
        self._parts.append(chunk)

    def text(self) -> str:
        return "".join(self._parts)

    def final(self) -> str:
        raw = self.text()
        if self.streams:
            return raw
        raw = raw.strip()
        if not self.complete:
            return raw
        try:
            value = json.loads(raw)
        except ValueError:
            return raw
        if value is None:
            return "{}"
        if isinstance(value, str):
            inner = value.strip()
            try:
                decoded = json.loads(inner)
            except ValueError:
                return raw
            if isinstance(decoded, dict):
                return inner
        return raw


class StreamedArgs:
    """A call's arguments value read as it is generated: kept whole (``args``) and sent raw
    while it is an object."""

    __slots__ = ("_value", "args")

    def __init__(self, value: JsonValue) -> None:
        self._value = value
        self.args = ArgsText(value.kind)

    def feed(
        self, buf: str, pos: int, final: bool, call: CallStream, out: list[ParsedEvent]
    ) -> int:
        end = self._value.feed(buf, pos, final)
        self.args.add(buf[pos:end])
        if self.args.streams:
            call.send(buf[pos:end], out)
        if self._value.complete:
            self.args.complete = True
        return end

    @property
    def complete(self) -> bool:
        return self.args.complete


class CallScannerBase:
    """What the call scanners share: one call as sent, the scan's status, and how it ends."""

    def __init__(self, new_index: NewIndex) -> None:
        self.status: ScanStatus = "running"
        self._call = CallStream(new_index)
        self._args: ArgsText | None = None

    @property
    def started(self) -> bool:
        return self._call.started

    def step(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> int:
        """The shared driver: ``_scan`` from ``pos`` while the call runs and text is left; at
        the end of the generation a call still running fails (``_fail``)."""
        while self.status == "running" and pos < len(buf):
            moved = self._scan(buf, pos, final, out)
            if moved is None:  # a marker may still be forming: wait for more text
                break
            pos = moved
        if final and self.status == "running":
            self._fail(out)
        return pos

    def _scan(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> int | None:
        """One decision at ``pos`` (text is left there): where scanning goes on, or None to
        wait for more text."""
        raise NotImplementedError

    def _fail(self, out: list[ParsedEvent]) -> None:
        """Malformed or cut short: a started call ends with what it has; else give up."""
        if self._call.started:
            self._end(out)
        else:
            self.status = "error"

    def _end(self, out: list[ParsedEvent]) -> None:
        self._call.end("{}" if self._args is None else self._args.final(), out)
        self.status = "done"


_ARGS_KEYS = ("arguments", "parameters")
_STRICT_KEYS = frozenset(("name", "type", *_ARGS_KEYS))

_OPEN, _KEY_OR_END, _KEY, _COLON, _VALUE_START, _VALUE, _AFTER_VALUE = range(7)
_SKIP, _NAME, _ARGS = range(3)


class JsonCallScanner(CallScannerBase):
    """One call written as a JSON object, ``{"name": "f", "arguments": {...}}``, keys in any
    order (``parameters`` is accepted for ``arguments``; other keys are skipped).

    ``ToolCallStart`` goes out as soon as the name is known, and the arguments object streams
    raw as it is generated (what came before the name is sent with the start). With
    ``strict`` (Llama 3 JSON, where a plain JSON answer must stay text) only the keys a call
    has are allowed before the start, the arguments must be an object, and the call starts
    only once both the name and the arguments key have been seen.
    """

    def __init__(self, new_index: NewIndex, *, strict: bool = False) -> None:
        super().__init__(new_index)
        self._strict = strict
        self._state = _OPEN
        self._value = JsonValue("string")
        self._role = _SKIP
        self._parts: list[str] = []
        self._key = ""
        self._name: str | None = None

    def _scan(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> int | None:
        state = self._state
        if state in (_KEY, _VALUE):
            return self._read_value(buf, pos, final, out)
        c = buf[pos]
        if c in JSON_WS:
            return pos + 1
        if state == _OPEN and c == "{":
            self._state = _KEY_OR_END
        elif state == _KEY_OR_END and c == '"':
            self._value = JsonValue("string")
            self._parts = []
            self._state = _KEY
            return pos
        elif state in (_KEY_OR_END, _AFTER_VALUE) and c == "}":
            self._close(out)
        elif state == _AFTER_VALUE and c == ",":
            self._state = _KEY_OR_END
        elif state == _COLON and c == ":":
            self._state = _VALUE_START
        elif state == _VALUE_START:
            self._begin_value(c, out)
            return pos
        else:
            self._fail(out)
            return pos
        return pos + 1

    def _read_value(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> int:
        end = self._value.feed(buf, pos, final)
        chunk = buf[pos:end]
        args = self._args if self._state == _VALUE and self._role == _ARGS else None
        if args is not None:
            args.add(chunk)
            if self._call.started and args.streams:
                self._call.send(chunk, out)
        elif self._state == _KEY or self._role == _NAME:
            self._parts.append(chunk)
        if not self._value.complete:
            return end
        if self._state == _KEY:
            key = decode_string("".join(self._parts))
            if key is None or (self._strict and not self.started and key not in _STRICT_KEYS):
                self._fail(out)
                return end
            self._key = key
            self._state = _COLON
            return end
        if self._role == _NAME:
            name = decode_string("".join(self._parts))
            if not name or "\n" in name:
                self._fail(out)
                return end
            self._name = name
            self._maybe_start(out)
        elif args is not None:
            args.complete = True
        self._state = _AFTER_VALUE
        return end

    def _begin_value(self, first: str, out: list[ParsedEvent]) -> None:
        value = JsonValue.begin(first)
        if value is None:
            self._fail(out)
            return
        role = _SKIP
        if self._key == "name" and self._name is None:
            if value.kind != "string":
                self._fail(out)
                return
            role = _NAME
            self._parts = []
        elif self._key in _ARGS_KEYS and self._args is None:
            if self._strict and value.kind != "object":
                self._fail(out)
                return
            role = _ARGS
            self._args = ArgsText(value.kind)
            self._maybe_start(out)
        self._value = value
        self._role = role
        self._state = _VALUE

    def _maybe_start(self, out: list[ParsedEvent]) -> None:
        if self._call.started or self._name is None:
            return
        if self._strict and self._args is None:
            return
        self._call.start(self._name, out)
        if self._args is not None and self._args.streams:
            self._call.send(self._args.text(), out)

    def _close(self, out: list[ParsedEvent]) -> None:
        self._maybe_start(out)
        self._fail(out)  # the call ends if it started, else the object was no call
