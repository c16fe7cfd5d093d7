"""One incremental parser per tool-call format, as regions the composite parser hands text to.

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
  ``</function>``; the final text is ``json.dumps`` of the object, so it always parses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Protocol

from .base import (
    JSON_WS,
    ArgsText,
    CallStream,
    JsonCallScanner,
    JsonValue,
    NewIndex,
    ParsedEvent,
    ScanStatus,
    Step,
    find_first,
    is_partial,
    partial_suffix,
    skip_ws,
)

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
FUNCTION_OPEN = "<function="
PYTHON_TAG = "<|python_tag|>"
MISTRAL_TOOL_CALLS = "[TOOL_CALLS]"

ToolSchemas = Mapping[str, Mapping[str, Any]]
"""Function name -> the JSON Schema of its parameters (only used to type XML values)."""


class CallScanner(Protocol):
    status: ScanStatus

    @property
    def started(self) -> bool: ...

    def step(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> int: ...


# --- Qwen3-Coder XML -------------------------------------------------------------------------

_XML_NAME_END = re.compile(r"[<>\n]")
_XML_BODY_STOPS = ("<parameter=", "</function>", TOOL_CALL_CLOSE)
_XML_VALUE_STOPS = ("</parameter>", "<parameter=", "</function>", TOOL_CALL_CLOSE)
_XML_NAME_MAX = 256
_X_NAME, _X_BODY, _X_PARAM_NAME, _X_PARAM_VALUE = range(4)


def xml_param_value(text: str, schema: Mapping[str, Any] | None = None) -> object:
    """The JSON value of one XML parameter.

    A value stays a string unless it parses as JSON that is not a string (a number, a bool,
    ``null``, an object or an array). Where the tool's schema says the parameter is a string,
    it always stays a string.
    """
    kind = schema.get("type") if schema else None
    stripped = text.strip()
    if kind == "string" or (isinstance(kind, list) and "string" in kind and stripped != "null"):
        return text
    if kind == "boolean" and stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    try:
        value = json.loads(stripped)
        json.dumps(value, allow_nan=False)  # 1e999 parses as inf, which is not JSON
    except ValueError:
        return text
    return text if isinstance(value, str) else value


class XmlFunctionScanner:
    """``f>`` ... ``</function>`` after ``<function=``, parameters as ``<parameter=k>\\nv\\n
    </parameter>``. A parameter also ends at the next ``<parameter=``, ``</function>`` or
    ``</tool_call>`` (models forget the close); text between parameters is ignored; a value
    loses one leading and one trailing newline. Cut short, the call keeps the parameter being
    written with what was generated of it, and closes."""

    def __init__(self, new_index: NewIndex, schemas: ToolSchemas | None) -> None:
        self.status: ScanStatus = "running"
        self._call = CallStream(new_index)
        self._schemas = schemas or {}
        self._state = _X_NAME
        self._parts: list[str] = []
        self._key = ""
        self._params = 0

    @property
    def started(self) -> bool:
        return self._call.started

    def step(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> int:
        n = len(buf)
        while self.status == "running":
            state = self._state
            if state in (_X_NAME, _X_PARAM_NAME):
                m = _XML_NAME_END.search(buf, pos)
                name_end = n if m is None else m.start()
                self._parts.append(buf[pos:name_end])
                pos = name_end
                name = "".join(self._parts).strip()
                if m is None:
                    if state == _X_PARAM_NAME and final:
                        self._close(out)
                    elif state == _X_NAME and (final or len(name) > _XML_NAME_MAX):
                        self.status = "error"
                    break
                if m.group() != ">":
                    if state == _X_NAME:
                        self.status = "error"
                        break
                    self._state = _X_BODY  # a broken parameter tag: skipped
                    continue
                pos += 1
                self._parts = []
                if state == _X_PARAM_NAME:
                    self._key = name
                    self._state = _X_PARAM_VALUE
                elif not name or any(ch.isspace() for ch in name):
                    self.status = "error"
                else:
                    self._call.start(name, out)
                    self._call.send("{", out)
                    self._state = _X_BODY
            elif state == _X_BODY:
                i, stop = find_first(buf, pos, _XML_BODY_STOPS)
                if i < 0:
                    pos = n if final else n - partial_suffix(buf, pos, _XML_BODY_STOPS)
                    if final:
                        self._close(out)
                    break
                pos = i if stop == TOOL_CALL_CLOSE else i + len(stop)
                if stop == "<parameter=":
                    self._state = _X_PARAM_NAME
                    self._parts = []
                else:
                    self._close(out)
            else:
                i, stop = find_first(buf, pos, _XML_VALUE_STOPS)
                if i < 0:
                    end = n if final else n - partial_suffix(buf, pos, _XML_VALUE_STOPS)
                    self._parts.append(buf[pos:end])
                    pos = end
                    if final:
                        self._emit_param(out)
                        self._close(out)
                    break
                self._parts.append(buf[pos:i])
                pos = i + len(stop) if stop == "</parameter>" else i
                self._emit_param(out)
                self._state = _X_BODY
        return pos

    def _emit_param(self, out: list[ParsedEvent]) -> None:
        value = "".join(self._parts)
        value = value.removeprefix("\n").removesuffix("\n")
        if not self._key:
            return
        params = self._schemas.get(self._call.name, {}).get("properties", {})
        schema = params.get(self._key) if isinstance(params, Mapping) else None
        typed = xml_param_value(value, schema if isinstance(schema, Mapping) else None)
        pair = (
            json.dumps(self._key, ensure_ascii=False) + ": " + json.dumps(typed, ensure_ascii=False)
        )
        self._call.send(pair if self._params == 0 else ", " + pair, out)
        self._params += 1

    def _close(self, out: list[ParsedEvent]) -> None:
        self._call.send("}", out)
        self._call.end("", out)  # arguments = exactly what was sent
        self.status = "done"


# --- Mistral [ARGS] header --------------------------------------------------------------------

_ARGS_TAG = "[ARGS]"
_CALL_ID_TAG = "[CALL_ID]"
_M_NAME, _M_HEADER, _M_CALL_ID, _M_ARGS_WAIT, _M_ARGS = range(5)


def mistral_name_char(c: str) -> bool:
    return c.isalnum() or c in "_-."


class MistralHeaderScanner:
    """``f[ARGS]{...}`` or ``f[CALL_ID]abc[ARGS]{...}``: the call starts at the first tag; the
    arguments value streams raw when it is an object. A call id is read and dropped."""

    def __init__(self, new_index: NewIndex) -> None:
        self.status: ScanStatus = "running"
        self._call = CallStream(new_index)
        self._state = _M_NAME
        self._name: list[str] = []
        self._value = JsonValue("object")
        self._args: ArgsText | None = None

    @property
    def started(self) -> bool:
        return self._call.started

    def step(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> int:
        n = len(buf)
        while self.status == "running" and pos < n:
            state = self._state
            if state == _M_NAME:
                end = pos
                while end < n and mistral_name_char(buf[end]):
                    end += 1
                self._name.append(buf[pos:end])
                pos = end
                if pos < n:
                    self._state = _M_HEADER
            elif state == _M_ARGS:
                assert self._args is not None
                end = self._value.feed(buf, pos, final)
                self._args.add(buf[pos:end])
                if self._args.streams:
                    self._call.send(buf[pos:end], out)
                pos = end
                if self._value.complete:
                    self._args.complete = True
                    self._end(out)
            elif buf[pos] in JSON_WS and state != _M_CALL_ID:
                pos += 1
            elif state == _M_ARGS_WAIT:
                value = JsonValue.begin(buf[pos])
                if value is None:
                    self._end(out)
                else:
                    self._value = value
                    self._args = ArgsText(value.kind)
                    self._state = _M_ARGS
            elif buf.startswith(_ARGS_TAG, pos) or buf.startswith(_CALL_ID_TAG, pos):
                tag = _ARGS_TAG if buf.startswith(_ARGS_TAG, pos) else _CALL_ID_TAG
                pos += len(tag)
                if not self._call.started:
                    name = "".join(self._name)
                    if not name:
                        self.status = "error"
                        break
                    self._call.start(name, out)
                self._state = _M_ARGS_WAIT if tag == _ARGS_TAG else _M_CALL_ID
            elif state == _M_CALL_ID and mistral_name_char(buf[pos]):
                pos += 1
            elif not final and is_partial(buf, pos, (_ARGS_TAG, _CALL_ID_TAG)):
                break
            else:
                self._fail(out)
        if final and self.status == "running":
            self._fail(out)
        return pos

    def _fail(self, out: list[ParsedEvent]) -> None:
        if self._call.started:
            self._end(out)
        else:
            self.status = "error"

    def _end(self, out: list[ParsedEvent]) -> None:
        self._call.end("{}" if self._args is None else self._args.final(), out)
        self.status = "done"


# --- Regions ---------------------------------------------------------------------------------


class ToolRegion:
    """The text from one tool-call marker to where its calls end (see the module docstring)."""

    def __init__(self, marker: str, new_index: NewIndex, schemas: ToolSchemas | None) -> None:
        self._marker = marker  # held whitespace + marker: shown as text if no call starts
        self._pending: list[str] = []  # consumed since the marker or the last call
        self._new_index = new_index
        self._schemas = schemas
        self._started_any = False
        self._call: CallScanner | None = None

    def step(self, buf: str, final: bool) -> Step:
        raise NotImplementedError

    def _note(self, text: str) -> None:
        if text:
            self._pending.append(text)

    def _drive(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> int:
        """Run the current call scanner from ``pos``; its ``status`` tells how it went."""
        assert self._call is not None
        end = self._call.step(buf, pos, final, out)
        if self._call.started:
            self._started_any = True
            self._marker = ""
            self._pending.clear()
        else:
            self._note(buf[pos:end])
        return end

    def _revert(self, pos: int, out: list[ParsedEvent]) -> Step:
        pushback = "".join(self._pending)
        if self._started_any:
            pushback = pushback.lstrip(JSON_WS)
        return Step(pos, out, done=True, revert=self._marker, pushback=pushback)

    def _finish(self, pos: int, out: list[ParsedEvent]) -> Step:
        if self._started_any:
            return Step(pos, out, done=True)
        return self._revert(pos, out)


_TAG_BODY_MARKERS = (TOOL_CALL_CLOSE, FUNCTION_OPEN, TOOL_CALL_OPEN)


class TagRegion(ToolRegion):
    """After ``<tool_call>``: JSON or XML calls until ``</tool_call>``. After a call, anything
    else up to ``</tool_call>`` is dropped (a stray brace, say); another ``{`` or
    ``<function=`` is one more call (parallel calls in one block)."""

    def step(self, buf: str, final: bool) -> Step:
        out: list[ParsedEvent] = []
        pos, n = 0, len(buf)
        while True:
            if self._call is not None:
                pos = self._drive(buf, pos, final, out)
                status = self._call.status
                if status == "running":
                    return Step(pos, out)
                self._call = None
                if status == "error" and not self._started_any:
                    return self._revert(pos, out)
                self._pending.clear()
                continue
            end = skip_ws(buf, pos)
            if not self._started_any:
                self._note(buf[pos:end])
            pos = end
            if pos == n:
                return self._finish(pos, out) if final else Step(pos, out)
            if buf[pos] == "{":
                self._call = JsonCallScanner(self._new_index)
            elif buf.startswith(FUNCTION_OPEN, pos):
                if not self._started_any:
                    self._note(FUNCTION_OPEN)
                pos += len(FUNCTION_OPEN)
                self._call = XmlFunctionScanner(self._new_index, self._schemas)
            elif not self._started_any:
                if not final and is_partial(buf, pos, _TAG_BODY_MARKERS):
                    return Step(pos, out)
                return self._revert(pos, out)
            elif buf.startswith(TOOL_CALL_CLOSE, pos):
                return Step(pos + len(TOOL_CALL_CLOSE), out, done=True)
            elif buf.startswith(TOOL_CALL_OPEN, pos):
                pos += len(TOOL_CALL_OPEN)  # a close was forgotten: keep reading calls
            elif not final and is_partial(buf, pos, _TAG_BODY_MARKERS):
                return Step(pos, out)
            else:
                pos += 1  # junk after a call, inside the block: dropped


class FunctionRegion(ToolRegion):
    """After a bare ``<function=`` (Qwen3-Coder): one XML call."""

    def step(self, buf: str, final: bool) -> Step:
        out: list[ParsedEvent] = []
        if self._call is None:
            self._call = XmlFunctionScanner(self._new_index, self._schemas)
        pos = self._drive(buf, 0, final, out)
        if self._call.status == "running":
            return Step(pos, out)
        if self._call.status == "error":
            return self._revert(pos, out)
        return Step(pos, out, done=True)


class Llama3Region(ToolRegion):
    """At the start of the visible output: JSON calls separated by ``;`` or whitespace. An
    object that is not a call (its first key is not ``name``/``parameters``/``arguments``/
    ``type``, or it closes without both name and parameters) is text, like everything
    after the calls."""

    def step(self, buf: str, final: bool) -> Step:
        out: list[ParsedEvent] = []
        pos, n = 0, len(buf)
        while True:
            if self._call is not None:
                pos = self._drive(buf, pos, final, out)
                status = self._call.status
                if status == "running":
                    return Step(pos, out)
                self._call = None
                if status == "error":
                    return self._revert(pos, out)
                continue
            end = skip_ws(buf, pos, JSON_WS + ";")
            if not self._started_any:
                self._note(buf[pos:end])
            pos = end
            if pos == n:
                return self._finish(pos, out) if final else Step(pos, out)
            if buf[pos] != "{":
                return self._finish(pos, out)
            self._call = JsonCallScanner(self._new_index, strict=True)


_LIST_START, _LIST_ITEM, _LIST_SEP, _AFTER_HEADER_CALL = range(4)


class MistralRegion(ToolRegion):
    """After ``[TOOL_CALLS]``: a JSON list of calls, or ``name[ARGS]{...}`` calls one after
    another. Whatever follows the calls is ordinary output again (another ``[TOOL_CALLS]``
    opens a new region)."""

    def __init__(self, marker: str, new_index: NewIndex, schemas: ToolSchemas | None) -> None:
        super().__init__(marker, new_index, schemas)
        self._state = _LIST_START

    def step(self, buf: str, final: bool) -> Step:
        out: list[ParsedEvent] = []
        pos, n = 0, len(buf)
        while True:
            if self._call is not None:
                pos = self._drive(buf, pos, final, out)
                status = self._call.status
                if status == "running":
                    return Step(pos, out)
                self._call = None
                if status == "error":
                    return self._revert(pos, out)
                self._state = _LIST_SEP if self._state == _LIST_ITEM else _AFTER_HEADER_CALL
                continue
            end = skip_ws(buf, pos)
            if not self._started_any:
                self._note(buf[pos:end])
            pos = end
            if pos == n:
                return self._finish(pos, out) if final else Step(pos, out)
            c = buf[pos]
            state = self._state
            if state == _LIST_START and c == "[":
                self._note(c)
                pos += 1
                self._state = _LIST_ITEM
            elif state in (_LIST_START, _AFTER_HEADER_CALL) and mistral_name_char(c):
                self._call = MistralHeaderScanner(self._new_index)
            elif state == _LIST_ITEM and c == "{":
                self._call = JsonCallScanner(self._new_index)
            elif state == _LIST_SEP and c == ",":
                pos += 1
                self._state = _LIST_ITEM
            elif state in (_LIST_ITEM, _LIST_SEP) and c == "]" and self._started_any:
                return Step(pos + 1, out, done=True)
            else:
                return self._finish(pos, out)
