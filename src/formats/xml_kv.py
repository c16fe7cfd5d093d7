"""Tool calls whose arguments are written as key/value markup, one value per parameter:
GLM-4.x (and Laguna), LongCat, MiniMax M2, Muse Spark, MiniCPM 5.

- GLM-4.x: ``<tool_call>NAME<arg_key>k</arg_key><arg_value>v</arg_value>...</tool_call>``, one
  call per ``<tool_call>`` block (LongCat: the same with ``longcat_`` tags).
- MiniMax M2: ``<minimax:tool_call><invoke name="NAME"><parameter name="k">v</parameter>
  </invoke>...</minimax:tool_call>``, several calls per block (Muse Spark: ``atem:`` tags).
- MiniCPM 5: ``<function name="NAME"><param name="k">v</param></function>``, no wrapper; a
  value may be a CDATA block.
- Kimi K3: its XTML markup (``KIMI_K3``), calls and typed arguments in ``<|open|>``/``<|close|>``
  tags, or all of a call's arguments as one JSON object block (``json_open``).

Invariants (on top of ``tool_format_base``'s):
- A call starts once its name is complete; arguments are JSON built from each parameter when it
  completes: ``{`` goes out with the start, ``"key": value`` per parameter, ``}`` at the call's
  close; the final text is exactly what was sent, so it always parses as an object.
- A value is stripped of surrounding whitespace (as mlx-lm reads these formats) and stays a
  string where the tool's schema says string; otherwise it is JSON if it parses as a non-string.
- A region that has started no call gives up on anything unexpected and is shown as text; cut
  short, a started call keeps the parameter being written and closes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .base import (
    CallStream,
    NewIndex,
    ParsedEvent,
    Step,
    is_partial,
    skip_ws,
)
from .regions import ToolRegion, ToolSchemas, xml_param_value
from .scan_util import take_until, unquote

_HEADER_MAX = 300
_KEY_MAX = 300


@dataclass(frozen=True, slots=True)
class KvSyntax:
    """One key/value markup format. ``invoke_open`` empty: the region holds one call whose name
    follows the region marker directly and ends at the first ``key_open`` or ``call_close``;
    otherwise each call's header runs from ``invoke_open`` to ``header_close`` and names the
    function in a ``name=`` attribute. ``region_close`` empty: the region ends with its call."""

    region_open: str
    region_close: str
    invoke_open: str
    header_close: str
    key_open: str
    key_close: str
    value_open: str
    value_close: str
    call_close: str
    key_is_attribute: bool
    name_attr: str = "name"  # the header attribute naming the function
    key_attr: str = "name"  # the parameter header attribute naming the key
    strip: bool = True  # values lose surrounding whitespace (mlx-lm's reading)
    # A block holding all arguments as one JSON object: ``json_open`` + header up to
    # ``key_close``, the object, ``json_close`` (Kimi K3's ``<|open|>json ...``); empty: none.
    json_open: str = ""
    json_close: str = ""


GLM = KvSyntax(
    region_open="<tool_call>",
    region_close="",
    invoke_open="",
    header_close="",
    key_open="<arg_key>",
    key_close="</arg_key>",
    value_open="<arg_value>",
    value_close="</arg_value>",
    call_close="</tool_call>",
    key_is_attribute=False,
)

LONGCAT = KvSyntax(
    region_open="<longcat_tool_call>",
    region_close="",
    invoke_open="",
    header_close="",
    key_open="<longcat_arg_key>",
    key_close="</longcat_arg_key>",
    value_open="<longcat_arg_value>",
    value_close="</longcat_arg_value>",
    call_close="</longcat_tool_call>",
    key_is_attribute=False,
)

MINIMAX_M2 = KvSyntax(
    region_open="<minimax:tool_call>",
    region_close="</minimax:tool_call>",
    invoke_open="<invoke",
    header_close=">",
    key_open="<parameter",
    key_close=">",
    value_open="",
    value_close="</parameter>",
    call_close="</invoke>",
    key_is_attribute=True,
)

MUSE_SPARK = KvSyntax(
    region_open="<atem:function_calls>",
    region_close="</atem:function_calls>",
    invoke_open="<atem:invoke",
    header_close=">",
    key_open="<atem:parameter",
    key_close=">",
    value_open="",
    value_close="</atem:parameter>",
    call_close="</atem:invoke>",
    key_is_attribute=True,
)

MINICPM5 = KvSyntax(
    region_open="<function name=",
    region_close="",
    invoke_open="",
    header_close=">",
    key_open="<param",
    key_close=">",
    value_open="",
    value_close="</param>",
    call_close="</function>",
    key_is_attribute=True,
)

KIMI_K3 = KvSyntax(
    region_open="<|open|>tools<|sep|>",
    region_close="<|close|>tools<|sep|>",
    invoke_open="<|open|>call",
    header_close="<|sep|>",
    key_open="<|open|>argument",
    key_close="<|sep|>",
    value_open="",
    value_close="<|close|>argument<|sep|>",
    call_close="<|close|>call<|sep|>",
    key_is_attribute=True,
    name_attr="tool",
    key_attr="key",
    strip=False,
    json_open="<|open|>json",
    json_close="<|close|>json<|sep|>",
)
"""Kimi K3's XTML: ``<|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|>
<|open|>argument key="k" type="string"<|sep|>v<|close|>argument<|sep|><|close|>call<|sep|>
<|close|>tools<|sep|>``; a value's ``type`` attribute types it (``string`` stays text). A call
may instead carry its arguments as one block, ``<|open|>json type="object"<|sep|>{...}
<|close|>json<|sep|>``: its members become the arguments when it closes (a block that is not a
JSON object adds none, as mlx-lm drops it)."""

_ATTR = re.compile(r"""\b(\w+)\s*=\s*("[^"]*"|'[^']*'|[^\s"'<>]+)""")
_CDATA = re.compile(r"^\s*<!\[CDATA\[(.*?)\]\]>\s*$", re.DOTALL)


def attributes(header: str) -> dict[str, str]:
    """A tag header's attributes (`` name="f" type="string"``), unquoted and unescaped."""
    return {
        k: unquote(v).replace("&quot;", '"').replace("&amp;", "&") for k, v in _ATTR.findall(header)
    }


def attribute_name(header: str, attr: str = "name") -> str:
    """The ``attr`` attribute of a tag's header (`` name="f"``), or the header itself unquoted
    when it is only the value (MiniCPM's marker already holds ``name=``)."""
    found = attributes(header).get(attr)
    return found if found is not None else unquote(header.lstrip().removeprefix("="))


def clean_value(raw: str, strip: bool = True) -> str:
    m = _CDATA.match(raw)
    if m:
        return m.group(1)
    return raw.strip() if strip else raw


_BETWEEN, _HEADER, _BODY, _KEY, _VALUE_WAIT, _VALUE, _JSON_HEAD, _JSON = range(8)


class KvRegion(ToolRegion):
    """After the region marker: calls in key/value markup (see the module docstring)."""

    def __init__(
        self, syntax: KvSyntax, marker: str, new_index: NewIndex, schemas: ToolSchemas | None
    ) -> None:
        super().__init__(marker, new_index, schemas)
        self._syntax = syntax
        self._state = _HEADER if not syntax.invoke_open else _BETWEEN
        self._parts: list[str] = []
        self._key = ""
        self._key_type: str | None = None
        self._params = 0
        self._stream: CallStream | None = None
        self._calls_done = 0

    def step(self, buf: str, final: bool) -> Step:
        out: list[ParsedEvent] = []
        s = self._syntax
        pos, n = 0, len(buf)
        while True:
            state = self._state
            if state == _HEADER:
                if s.header_close:
                    stops: tuple[str, ...] = (s.header_close,)
                else:
                    stops = (s.key_open, s.call_close)
                text, end, stop = take_until(buf, pos, stops, final)
                self._parts.append(text)
                if self._stream is None:
                    self._note(buf[pos:end])
                pos = end
                header = "".join(self._parts)
                if stop is None:
                    if final or len(header) > _HEADER_MAX:
                        return self._give_up(pos, out)
                    return Step(pos, out)
                name = attribute_name(header, s.name_attr) if s.header_close else header.strip()
                if not name or any(c.isspace() for c in name) or "<" in name:
                    return self._give_up(pos, out)
                self._start(name, out)
                self._parts = []
                if stop == s.key_open and not s.header_close:
                    self._state = _KEY
                elif stop == s.call_close and not s.header_close:
                    self._close_call(out)
                    if not s.region_close:
                        return Step(pos, out, done=True)
                    self._state = _BETWEEN
                else:
                    self._state = _BODY
                continue
            if state == _KEY:
                text, end, stop = take_until(buf, pos, (s.key_close, s.call_close), final)
                self._parts.append(text)
                pos = end
                if stop is None:
                    if final or len("".join(self._parts)) > _KEY_MAX:
                        self._close_call(out)
                        return Step(pos, out, done=True)
                    return Step(pos, out)
                if stop == s.call_close:
                    if self._end_of_call(out):
                        return Step(pos, out, done=True)
                    continue
                header = "".join(self._parts)
                self._key = (
                    attribute_name(header, s.key_attr) if s.key_is_attribute else header.strip()
                )
                self._key_type = attributes(header).get("type") if s.key_is_attribute else None
                self._parts = []
                self._state = _VALUE_WAIT if s.value_open else _VALUE
                continue
            if state in (_JSON_HEAD, _JSON):
                done = self._json_block(buf, pos, final, out)
                if isinstance(done, Step):
                    return done
                pos = done
                continue
            if state == _VALUE:
                stops = (s.value_close, s.call_close)
                text, end, stop = take_until(buf, pos, stops, final)
                self._parts.append(text)
                pos = end
                if stop is None:
                    if final:
                        self._emit_param(out)
                        self._close_call(out)
                        return Step(pos, out, done=True)
                    return Step(pos, out)
                self._emit_param(out)
                if stop == s.call_close:
                    if self._end_of_call(out):
                        return Step(pos, out, done=True)
                    continue
                self._state = _BODY
                continue
            # _BETWEEN, _BODY, _VALUE_WAIT: markers separated by whitespace
            end = skip_ws(buf, pos)
            if self._stream is None and not self._started_any:
                self._note(buf[pos:end])
            pos = end
            if pos == n:
                if final:
                    if self._stream is not None:
                        self._close_call(out)
                    return self._finish(pos, out)
                return Step(pos, out)
            if state == _VALUE_WAIT:
                if buf.startswith(s.value_open, pos):
                    pos += len(s.value_open)
                elif not final and is_partial(buf, pos, (s.value_open,)):
                    return Step(pos, out)
                self._parts = []
                self._state = _VALUE  # a forgotten value tag: the value starts here
                continue
            if state == _BODY:
                wanted: tuple[str, ...] = (s.key_open, s.call_close)
                if s.json_open:
                    wanted += (s.json_open,)
            else:
                wanted = tuple(m for m in (s.invoke_open, s.region_close) if m)
            hit = next((m for m in wanted if buf.startswith(m, pos)), "")
            if not hit:
                if not final and is_partial(buf, pos, wanted):
                    return Step(pos, out)
                if not self._started_any:
                    return self._give_up(pos, out)
                if state == _BETWEEN:  # text after the calls, inside the block: dropped
                    pos += 1
                    continue
                pos += 1  # text between parameters: ignored
                continue
            if self._stream is None and not self._started_any:
                self._note(hit)
            pos += len(hit)
            if hit == s.key_open and state == _BODY:
                self._parts = []
                self._state = _KEY
            elif hit == s.call_close and state == _BODY:
                if self._end_of_call(out):
                    return Step(pos, out, done=True)
            elif hit == s.json_open and state == _BODY:
                self._parts = []
                self._state = _JSON_HEAD
            elif hit == s.invoke_open:
                self._parts = []
                self._state = _HEADER
            else:  # region_close
                if not self._started_any:
                    return self._give_up(pos, out)
                return Step(pos, out, done=True)

    def _start(self, name: str, out: list[ParsedEvent]) -> None:
        self._stream = CallStream(self._new_index)
        self._stream.start(name, out)
        self._stream.send("{", out)
        self._params = 0
        self._started_any = True
        self._marker = ""
        self._pending.clear()

    def _end_of_call(self, out: list[ParsedEvent]) -> bool:
        """Close the call; True when that ends the region too."""
        self._close_call(out)
        self._state = _BETWEEN
        return not self._syntax.region_close

    def _json_block(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> int | Step:
        """Inside a JSON arguments block: its header, then the object up to ``json_close``.
        Returns where scanning goes on, or the region's ``Step`` when it stops here."""
        s = self._syntax
        if self._state == _JSON_HEAD:
            text, end, stop = take_until(buf, pos, (s.key_close,), final)
            self._parts.append(text)
            if stop is None:
                if final or len("".join(self._parts)) > _HEADER_MAX:
                    self._close_call(out)
                    return Step(end, out, done=True)
                return Step(end, out)
            self._parts = []
            self._state = _JSON
            return end
        text, end, stop = take_until(buf, pos, (s.json_close, s.call_close), final)
        self._parts.append(text)
        if stop is None and not final:
            return Step(end, out)
        self._emit_object(out)
        if stop is None:  # cut short: the call ends with what was written
            self._close_call(out)
            return Step(end, out, done=True)
        if stop == s.call_close:
            if self._end_of_call(out):
                return Step(end, out, done=True)
            return end
        self._state = _BODY
        return end

    def _emit_object(self, out: list[ParsedEvent]) -> None:
        raw, self._parts = "".join(self._parts), []
        try:
            value = json.loads(raw)
        except ValueError:
            return
        if isinstance(value, dict):
            for key, item in value.items():
                self._send_pair(str(key), item, out)

    def _send_pair(self, key: str, typed: object, out: list[ParsedEvent]) -> None:
        assert self._stream is not None
        pair = json.dumps(key, ensure_ascii=False) + ": " + json.dumps(typed, ensure_ascii=False)
        self._stream.send(pair if self._params == 0 else ", " + pair, out)
        self._params += 1

    def _emit_param(self, out: list[ParsedEvent]) -> None:
        assert self._stream is not None
        value = clean_value("".join(self._parts), self._syntax.strip)
        self._parts = []
        key, self._key = self._key, ""
        if not key:
            return
        params = (self._schemas or {}).get(self._stream.name, {}).get("properties", {})
        schema = params.get(key) if isinstance(params, Mapping) else None
        if self._key_type is not None and not isinstance(schema, Mapping):
            schema = {"type": self._key_type}  # the model's own typing (Kimi K3's type="...")
        typed = xml_param_value(value, schema if isinstance(schema, Mapping) else None)
        self._send_pair(key, typed, out)

    def _close_call(self, out: list[ParsedEvent]) -> None:
        if self._stream is None:
            return
        self._stream.send("}", out)
        self._stream.end("", out)  # arguments = exactly what was sent
        self._stream = None
        self._calls_done += 1

    def _give_up(self, pos: int, out: list[ParsedEvent]) -> Step:
        if self._stream is not None:
            self._close_call(out)
        if self._started_any:
            return Step(pos, out, done=True)
        return self._revert(pos, out)
