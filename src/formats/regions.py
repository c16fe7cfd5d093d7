"""The tag formats' tool regions and the call scanners they hand text to.

Each region runs on ``region.ToolRegion``'s step driver: a call scanner (JSON, Qwen3-Coder XML,
Mistral's header) reads one call, and the region's ``_advance`` decides what comes between calls.
A region starts where the composite parser saw a tool-call marker and ends where the calls end:

- ``TagRegion``, after ``<tool_call>`` (Hermes/Qwen, Qwen3-Coder): one or more calls, each a
  JSON object ``{"name": ..., "arguments": {...}}`` or an XML ``<function=f>`` block, until
  ``</tool_call>``.
- ``FunctionRegion``, after a bare ``<function=`` (Qwen3-Coder without the wrapper).
- ``Llama3Region``, at the very start of the visible output, optionally after
  ``<|python_tag|>``: ``{"name": "f", "parameters": {...}}`` objects separated by ``;`` or
  whitespace.
- ``MistralRegion``, after ``[TOOL_CALLS]``: ``f[ARGS]{...}`` (v11+, also ``f[CALL_ID]id[ARGS]``,
  repeated) or the older JSON list ``[{"name": "f", "arguments": {...}}, ...]``.

Invariants (on top of ``base``'s):
- A region that has started no call can always give up: its marker is shown as text and all it
  consumed is read again as ordinary output (so a reasoning or tool marker inside it still
  counts). After a call has started nothing is taken back: a malformed rest inside
  ``<tool_call>...</tool_call>`` is dropped; in the other formats the region ends and the
  rest is ordinary output again.
- Qwen3-Coder XML arguments are built as JSON from each ``<parameter=...>`` value when it
  completes: ``{`` goes out with the start, ``"key": value`` per parameter, ``}`` at
  ``</function>``; the final text is exactly what was sent, so it always parses.
"""

from __future__ import annotations

import re

from .base import (
    JSON_WS,
    CallScannerBase,
    JsonCallScanner,
    JsonValue,
    NewIndex,
    ParsedEvent,
    ScanStatus,
    Step,
    StreamedArgs,
    ToolSchemas,
    is_partial,
)
from .region import Advance, ToolRegion
from .scan_util import close_object, send_member, take_until, typed_param, xml_param_value

__all__ = [
    "FUNCTION_OPEN",
    "MISTRAL_TOOL_CALLS",
    "PYTHON_TAG",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "FunctionRegion",
    "Llama3Region",
    "MistralRegion",
    "TagRegion",
    "ToolRegion",
    "ToolSchemas",
    "xml_param_value",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
FUNCTION_OPEN = "<function="
PYTHON_TAG = "<|python_tag|>"
MISTRAL_TOOL_CALLS = "[TOOL_CALLS]"

# --- Qwen3-Coder XML -------------------------------------------------------------------------

_XML_NAME_END = re.compile(r"[<>\n]")
_XML_BODY_STOPS = ("<parameter=", "</function>", TOOL_CALL_CLOSE)
_XML_VALUE_STOPS = ("</parameter>", "<parameter=", "</function>", TOOL_CALL_CLOSE)
_XML_NAME_MAX = 256
_X_NAME, _X_BODY, _X_PARAM_NAME, _X_PARAM_VALUE = range(4)


class XmlFunctionScanner(CallScannerBase):
    """``f>`` ... ``</function>`` after ``<function=``, parameters as ``<parameter=k>\\nv\\n
    </parameter>``. A parameter also ends at the next ``<parameter=``, ``</function>`` or
    ``</tool_call>`` (models forget the close); text between parameters is ignored; a value
    loses one leading and one trailing newline. Cut short, the call keeps the parameter being
    written with what was generated of it, and closes."""

    def __init__(self, new_index: NewIndex, schemas: ToolSchemas | None) -> None:
        super().__init__(new_index)
        self._schemas = schemas or {}
        self._state = _X_NAME
        self._parts: list[str] = []
        self._key = ""
        self._params = 0

    def step(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> int:
        go_on = True
        while go_on and self.status == "running":
            if self._state in (_X_NAME, _X_PARAM_NAME):
                pos, go_on = self._name(buf, pos, final, out)
            elif self._state == _X_BODY:
                pos, go_on = self._body(buf, pos, final, out)
            else:
                pos, go_on = self._value(buf, pos, final, out)
        return pos

    def _name(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> tuple[int, bool]:
        """The function's name or a parameter's, up to ``>``: ``(pos, read on)``."""
        param = self._state == _X_PARAM_NAME
        m = _XML_NAME_END.search(buf, pos)
        name_end = len(buf) if m is None else m.start()
        self._parts.append(buf[pos:name_end])
        name = "".join(self._parts).strip()
        if m is None:
            if param and final:
                self._close(out)
            elif not param and (final or len(name) > _XML_NAME_MAX):
                self.status = "error"
            return name_end, False
        if m.group() != ">":
            if not param:
                self.status = "error"
                return name_end, False
            self._state = _X_BODY  # a broken parameter tag: skipped
            return name_end, True
        self._parts = []
        if param:
            self._key = name
            self._state = _X_PARAM_VALUE
        elif not name or any(ch.isspace() for ch in name):
            self.status = "error"
        else:
            self._call.start(name, out)
            self._call.send("{", out)
            self._state = _X_BODY
        return name_end + 1, True

    def _body(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> tuple[int, bool]:
        """Between parameters: the next one, or the call's close."""
        _, pos, stop = take_until(buf, pos, _XML_BODY_STOPS, final)
        if stop is None:
            if final:
                self._close(out)
            return pos, False
        if stop == "<parameter=":
            self._state = _X_PARAM_NAME
            self._parts = []
        else:
            self._close(out)
        return pos - len(TOOL_CALL_CLOSE) if stop == TOOL_CALL_CLOSE else pos, True

    def _value(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> tuple[int, bool]:
        text, pos, stop = take_until(buf, pos, _XML_VALUE_STOPS, final)
        self._parts.append(text)
        if stop is None:
            if final:
                self._emit_param(out)
                self._close(out)
            return pos, False
        self._emit_param(out)
        self._state = _X_BODY
        return pos if stop == "</parameter>" else pos - len(stop), True

    def _emit_param(self, out: list[ParsedEvent]) -> None:
        value = "".join(self._parts)
        value = value.removeprefix("\n").removesuffix("\n")
        if not self._key:
            return
        typed = typed_param(self._schemas, self._call.name, self._key, value)
        send_member(self._call, self._params == 0, self._key, typed, out)
        self._params += 1

    def _close(self, out: list[ParsedEvent]) -> None:
        close_object(self._call, out)
        self.status = "done"


# --- Mistral [ARGS] header --------------------------------------------------------------------

_ARGS_TAG = "[ARGS]"
_CALL_ID_TAG = "[CALL_ID]"
_M_NAME, _M_HEADER, _M_CALL_ID, _M_ARGS_WAIT, _M_ARGS = range(5)


def mistral_name_char(c: str) -> bool:
    return c.isalnum() or c in "_-."


class MistralHeaderScanner(CallScannerBase):
    """``f[ARGS]{...}`` or ``f[CALL_ID]abc[ARGS]{...}``: the call starts at the first tag; the
    arguments value streams raw when it is an object. A call id is read and dropped."""

    def __init__(self, new_index: NewIndex) -> None:
        super().__init__(new_index)
        self._state = _M_NAME
        self._name: list[str] = []
        self._reader: StreamedArgs | None = None

    def _scan(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> int | None:
        state = self._state
        if state == _M_NAME:
            end = pos
            while end < len(buf) and mistral_name_char(buf[end]):
                end += 1
            self._name.append(buf[pos:end])
            if end < len(buf):
                self._state = _M_HEADER
            return end
        if state == _M_ARGS:
            assert self._reader is not None
            pos = self._reader.feed(buf, pos, final, self._call, out)
            if self._reader.complete:
                self._end(out)
            return pos
        if buf[pos] in JSON_WS and state != _M_CALL_ID:
            return pos + 1
        if state == _M_ARGS_WAIT:
            self._begin_args(buf[pos], out)
            return pos
        if buf.startswith(_ARGS_TAG, pos) or buf.startswith(_CALL_ID_TAG, pos):
            return self._tag(buf, pos, out)
        if state == _M_CALL_ID and mistral_name_char(buf[pos]):
            return pos + 1
        if not final and is_partial(buf, pos, (_ARGS_TAG, _CALL_ID_TAG)):
            return None
        self._fail(out)
        return pos

    def _begin_args(self, first: str, out: list[ParsedEvent]) -> None:
        value = JsonValue.begin(first)
        if value is None:
            self._end(out)
            return
        self._reader = StreamedArgs(value)
        self._args = self._reader.args
        self._state = _M_ARGS

    def _tag(self, buf: str, pos: int, out: list[ParsedEvent]) -> int:
        """``[ARGS]`` or ``[CALL_ID]``: the first one starts the call."""
        tag = _ARGS_TAG if buf.startswith(_ARGS_TAG, pos) else _CALL_ID_TAG
        if not self._call.started:
            name = "".join(self._name)
            if not name:
                self.status = "error"
                return pos + len(tag)
            self._call.start(name, out)
        self._state = _M_ARGS_WAIT if tag == _ARGS_TAG else _M_CALL_ID
        return pos + len(tag)


# --- Regions ---------------------------------------------------------------------------------


_TAG_BODY_MARKERS = (TOOL_CALL_CLOSE, FUNCTION_OPEN, TOOL_CALL_OPEN)


class TagRegion(ToolRegion):
    """After ``<tool_call>``: JSON or XML calls until ``</tool_call>``. After a call, anything
    else up to ``</tool_call>`` is dropped (a stray brace, say); another ``{`` or
    ``<function=`` is one more call (parallel calls in one block)."""

    def _advance(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        pos = self._skip_space(buf, pos)
        if pos == len(buf):
            return self._finish(pos, out) if final else Step(pos, out)
        if buf[pos] == "{":
            self._call = JsonCallScanner(self._new_index)
            return pos
        if buf.startswith(FUNCTION_OPEN, pos):
            if not self._started_any:
                self._note(FUNCTION_OPEN)
            self._call = XmlFunctionScanner(self._new_index, self._schemas)
            return pos + len(FUNCTION_OPEN)
        if not final and is_partial(buf, pos, _TAG_BODY_MARKERS):
            return Step(pos, out)
        if not self._started_any:
            return self._revert(pos, out)
        if buf.startswith(TOOL_CALL_CLOSE, pos):
            return Step(pos + len(TOOL_CALL_CLOSE), out, done=True)
        if buf.startswith(TOOL_CALL_OPEN, pos):
            return pos + len(TOOL_CALL_OPEN)  # a close was forgotten: keep reading calls
        return pos + 1  # junk after a call, inside the block: dropped

    def _call_ended(self, status: ScanStatus, pos: int, out: list[ParsedEvent]) -> Advance:
        if status == "error" and not self._started_any:
            return self._revert(pos, out)
        self._pending.clear()
        return pos


class FunctionRegion(ToolRegion):
    """After a bare ``<function=`` (Qwen3-Coder): one XML call."""

    def __init__(self, marker: str, new_index: NewIndex, schemas: ToolSchemas | None) -> None:
        super().__init__(marker, new_index, schemas)
        self._call = XmlFunctionScanner(new_index, schemas)

    def _advance(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        return Step(pos, out, done=True)  # the call is over


class Llama3Region(ToolRegion):
    """At the start of the visible output: JSON calls separated by ``;`` or whitespace. An
    object that is not a call (its first key is not ``name``/``parameters``/``arguments``/
    ``type``, or it closes without both name and parameters) is text, like everything
    after the calls."""

    def _advance(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        pos = self._skip_space(buf, pos, JSON_WS + ";")
        if pos == len(buf):
            return self._finish(pos, out) if final else Step(pos, out)
        if buf[pos] != "{":
            return self._finish(pos, out)
        self._call = JsonCallScanner(self._new_index, strict=True)
        return pos


_LIST_START, _LIST_ITEM, _LIST_SEP, _AFTER_HEADER_CALL = range(4)


class MistralRegion(ToolRegion):
    """After ``[TOOL_CALLS]``: a JSON list of calls, or ``name[ARGS]{...}`` calls one after
    another. Whatever follows the calls is ordinary output again (another ``[TOOL_CALLS]``
    opens a new region)."""

    def __init__(self, marker: str, new_index: NewIndex, schemas: ToolSchemas | None) -> None:
        super().__init__(marker, new_index, schemas)
        self._state = _LIST_START

    def _advance(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        pos = self._skip_space(buf, pos)
        if pos == len(buf):
            return self._finish(pos, out) if final else Step(pos, out)
        c = buf[pos]
        state = self._state
        if state == _LIST_START and c == "[":
            self._note(c)
            self._state = _LIST_ITEM
            return pos + 1
        if state in (_LIST_START, _AFTER_HEADER_CALL) and mistral_name_char(c):
            self._call = MistralHeaderScanner(self._new_index)
        elif state == _LIST_ITEM and c == "{":
            self._call = JsonCallScanner(self._new_index)
        elif state == _LIST_SEP and c == ",":
            self._state = _LIST_ITEM
            return pos + 1
        elif state in (_LIST_ITEM, _LIST_SEP) and c == "]" and self._started_any:
            return Step(pos + 1, out, done=True)
        else:
            return self._finish(pos, out)
        return pos

    def _call_ended(self, status: ScanStatus, pos: int, out: list[ParsedEvent]) -> Advance:
        if status == "error":
            return self._revert(pos, out)
        self._state = _LIST_SEP if self._state == _LIST_ITEM else _AFTER_HEADER_CALL
        return pos
