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
from dataclasses import dataclass
from enum import Enum, auto

from .base import NewIndex, ParsedEvent, Step, ToolSchemas
from .region import Advance, ToolRegion
from .scan_util import close_object, send_member, typed_param, unquote

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


def _arg_key_syntax(prefix: str) -> KvSyntax:
    """GLM's markup, its tags named with ``prefix`` (LongCat's ``longcat_``)."""
    return KvSyntax(
        region_open=f"<{prefix}tool_call>",
        region_close="",
        invoke_open="",
        header_close="",
        key_open=f"<{prefix}arg_key>",
        key_close=f"</{prefix}arg_key>",
        value_open=f"<{prefix}arg_value>",
        value_close=f"</{prefix}arg_value>",
        call_close=f"</{prefix}tool_call>",
        key_is_attribute=False,
    )


def _invoke_syntax(block: str, ns: str) -> KvSyntax:
    """MiniMax's markup: ``block`` around ``invoke`` calls, its tags in namespace ``ns``."""
    return KvSyntax(
        region_open=f"<{block}>",
        region_close=f"</{block}>",
        invoke_open=f"<{ns}invoke",
        header_close=">",
        key_open=f"<{ns}parameter",
        key_close=">",
        value_open="",
        value_close=f"</{ns}parameter>",
        call_close=f"</{ns}invoke>",
        key_is_attribute=True,
    )


GLM = _arg_key_syntax("")
LONGCAT = _arg_key_syntax("longcat_")
MINIMAX_M2 = _invoke_syntax("minimax:tool_call", "")
MUSE_SPARK = _invoke_syntax("atem:function_calls", "atem:")

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


class _S(Enum):
    BETWEEN = auto()  # between calls
    HEADER = auto()  # a call's header, naming the function
    BODY = auto()  # between parameters
    KEY = auto()  # a parameter's key (or its header)
    VALUE_WAIT = auto()  # before a value's opening tag
    VALUE = auto()
    JSON_HEAD = auto()  # a JSON arguments block's header
    JSON = auto()  # the block's object


class KvRegion(ToolRegion):
    """After the region marker: calls in key/value markup (see the module docstring)."""

    def __init__(
        self, syntax: KvSyntax, marker: str, new_index: NewIndex, schemas: ToolSchemas | None
    ) -> None:
        super().__init__(marker, new_index, schemas)
        self._syntax = syntax
        self._state = _S.HEADER if not syntax.invoke_open else _S.BETWEEN
        self._key = ""
        self._key_type: str | None = None
        self._params = 0

    def _advance(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        match self._state:
            case _S.HEADER:
                return self._header(buf, pos, final, out)
            case _S.KEY:
                return self._key_header(buf, pos, final, out)
            case _S.VALUE:
                return self._value(buf, pos, final, out)
            case _S.JSON_HEAD | _S.JSON:
                return self._json_block(buf, pos, final, out)
            case _S.VALUE_WAIT:
                return self._value_wait(buf, pos, final, out)
            case _S.BETWEEN | _S.BODY:  # markers separated by whitespace
                return self._markers(buf, pos, final, out)

    def _header(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        """A call's header, up to ``header_close`` (or its first key or its close)."""
        s = self._syntax
        stops = (s.header_close,) if s.header_close else (s.key_open, s.call_close)
        pos, stop = self._read_until(buf, pos, stops, final)
        if stop is None:
            if final or len("".join(self._parts)) > _HEADER_MAX:
                return self._give_up(pos, out)
            return Step(pos, out)
        header = self._take_parts()
        name = attribute_name(header, s.name_attr) if s.header_close else header.strip()
        if not name or any(c.isspace() for c in name) or "<" in name:
            return self._give_up(pos, out)
        self._start_call(name, out).send("{", out)
        self._params = 0
        if s.header_close:
            self._state = _S.BODY
        elif stop == s.key_open:
            self._state = _S.KEY
        else:
            return self._call_closed(pos, out)
        return pos

    def _key_header(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        """A parameter's key, or its header naming the key, up to ``key_close``."""
        s = self._syntax
        pos, stop = self._read_until(buf, pos, (s.key_close, s.call_close), final)
        if stop is None:
            if final or len("".join(self._parts)) > _KEY_MAX:
                self._close_call(out)
                return Step(pos, out, done=True)
            return Step(pos, out)
        header = self._take_parts()
        if stop == s.call_close:
            return self._call_closed(pos, out)
        if s.key_is_attribute:
            self._key = attribute_name(header, s.key_attr)
            self._key_type = attributes(header).get("type")
        else:
            self._key, self._key_type = header.strip(), None
        self._state = _S.VALUE_WAIT if s.value_open else _S.VALUE
        return pos

    def _value(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        s = self._syntax
        pos, stop = self._read_until(buf, pos, (s.value_close, s.call_close), final)
        if stop is None:
            if final:
                self._emit_param(out)
                self._close_call(out)
                return Step(pos, out, done=True)
            return Step(pos, out)
        self._emit_param(out)
        if stop == s.call_close:
            return self._call_closed(pos, out)
        self._state = _S.BODY
        return pos

    def _value_wait(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        """Before a value: its opening tag, or a forgotten one (the value starts here)."""
        value_open = self._syntax.value_open
        pos, hit = self._next_marker(buf, pos, final, (value_open,))
        if hit is None:
            return self._give_up(pos, out) if final else Step(pos, out)
        self._parts = []
        self._state = _S.VALUE
        return pos + len(hit)

    def _markers(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        """Between calls (``BETWEEN``) or parameters (``BODY``): the next marker."""
        s = self._syntax
        body = self._state == _S.BODY
        if body:
            wanted = (s.key_open, s.call_close) + ((s.json_open,) if s.json_open else ())
        else:
            wanted = tuple(m for m in (s.invoke_open, s.region_close) if m)
        pos, hit = self._next_marker(buf, pos, final, wanted)
        if hit is None:
            return self._give_up(pos, out) if final else Step(pos, out)
        if not hit:
            if not self._started_any:
                return self._give_up(pos, out)
            return pos + 1  # text between calls or parameters, inside the block: dropped
        if not self._started_any:
            self._note(hit)
        pos += len(hit)
        if body and hit == s.call_close:
            return self._call_closed(pos, out)
        if hit == s.region_close and not body:
            return self._finish(pos, out)
        self._parts = []
        if not body:
            self._state = _S.HEADER
        else:
            self._state = _S.KEY if hit == s.key_open else _S.JSON_HEAD
        return pos

    def _call_closed(self, pos: int, out: list[ParsedEvent]) -> Advance:
        """The call's close marker: the call ends, and with it the region where the region
        has no close of its own."""
        self._close_call(out)
        self._state = _S.BETWEEN
        return pos if self._syntax.region_close else Step(pos, out, done=True)

    def _json_block(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        """Inside a JSON arguments block: its header, then the object up to ``json_close``."""
        s = self._syntax
        if self._state == _S.JSON_HEAD:
            pos, stop = self._read_until(buf, pos, (s.key_close,), final)
            if stop is None:
                if final or len("".join(self._parts)) > _HEADER_MAX:
                    self._close_call(out)
                    return Step(pos, out, done=True)
                return Step(pos, out)
            self._parts = []
            self._state = _S.JSON
            return pos
        pos, stop = self._read_until(buf, pos, (s.json_close, s.call_close), final)
        if stop is None and not final:
            return Step(pos, out)
        self._emit_object(out)
        if stop is None:  # cut short: the call ends with what was written
            self._close_call(out)
            return Step(pos, out, done=True)
        if stop == s.call_close:
            return self._call_closed(pos, out)
        self._state = _S.BODY
        return pos

    def _emit_object(self, out: list[ParsedEvent]) -> None:
        try:
            value = json.loads(self._take_parts())
        except ValueError:
            return
        if isinstance(value, dict):
            for key, item in value.items():
                self._send_pair(str(key), item, out)

    def _send_pair(self, key: str, typed: object, out: list[ParsedEvent]) -> None:
        assert self._stream is not None
        send_member(self._stream, self._params == 0, key, typed, out)
        self._params += 1

    def _emit_param(self, out: list[ParsedEvent]) -> None:
        assert self._stream is not None
        value = clean_value(self._take_parts(), self._syntax.strip)
        key, self._key = self._key, ""
        if not key:
            return
        typed = typed_param(self._schemas, self._stream.name, key, value, self._key_type)
        self._send_pair(key, typed, out)

    def _close_call(self, out: list[ParsedEvent]) -> None:
        if self._stream is None:
            return
        close_object(self._stream, out)
        self._stream = None

    def _end_open_call(self, out: list[ParsedEvent]) -> None:
        self._close_call(out)
