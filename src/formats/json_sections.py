"""Tool calls in a marked section, each a header naming the function and a JSON arguments value:
Kimi K2 and DeepSeek V3.x.

- Kimi K2: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
  <|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>``; the header
  is the call id, the name is what lies between ``functions.`` and ``:IDX``.
- DeepSeek V3.1+: ``<[tool calls begin]><[tool call begin]>NAME<[tool sep]>{...}
  <[tool call end]>...<[tool calls end]>`` (written here with ``[]`` for DeepSeek's fullwidth
  bars U+FF5C and spaces for its U+2581); DeepSeek V3/R1 writes ``function<[tool sep]>NAME``
  then the arguments in a fenced json block, which is read too.

Invariants (on top of ``tool_format_base``'s): the region starts after the section marker; a
call starts once its name is known and its arguments object streams raw as generated (its final
text is that raw text, like Hermes); a region that has started no call gives up on anything
unexpected and is shown as text; after a call, text up to the section's end is dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum, auto

from .base import JsonValue, NewIndex, ParsedEvent, Step, StreamedArgs, ToolSchemas
from .region import Advance, ToolRegion

_HEADER_MAX = 300
_FENCE = "```"
_FENCE_JSON = "```json"


@dataclass(frozen=True, slots=True)
class SectionSyntax:
    section_open: str
    section_close: str
    call_open: str
    sep: str
    call_close: str
    kind: str  # "kimi" or "deepseek": how a header names the function


KIMI_K2 = SectionSyntax(
    section_open="<|tool_calls_section_begin|>",
    section_close="<|tool_calls_section_end|>",
    call_open="<|tool_call_begin|>",
    sep="<|tool_call_argument_begin|>",
    call_close="<|tool_call_end|>",
    kind="kimi",
)


def deepseek_marker(words: str) -> str:
    """DeepSeek's marker spelling: ``tool calls begin`` -> ``<\uff5ctool\u2581calls...\uff5c>``."""
    return "<\uff5c" + words.replace(" ", "\u2581") + "\uff5c>"


DEEPSEEK_V3 = SectionSyntax(
    section_open=deepseek_marker("tool calls begin"),
    section_close=deepseek_marker("tool calls end"),
    call_open=deepseek_marker("tool call begin"),
    sep=deepseek_marker("tool sep"),
    call_close=deepseek_marker("tool call end"),
    kind="deepseek",
)

_KIMI_ID = re.compile(r"^(?:functions\.)?(.+?)(?::\d+)?$", re.DOTALL)


def kimi_name(header: str) -> str:
    """``functions.get_weather:0`` -> ``get_weather`` (namespaced names keep their dots)."""
    m = _KIMI_ID.match(header.strip())
    return m.group(1) if m else header.strip()


class _S(Enum):
    BETWEEN = auto()  # between calls
    HEADER = auto()  # a call's header, up to the separator
    NAME_LINE = auto()  # DeepSeek V3/R1's name line after ``function<sep>``
    ARGS_WAIT = auto()  # before the arguments value (or its fence)
    ARGS = auto()
    AFTER_ARGS = auto()  # before the call's close


class SectionJsonRegion(ToolRegion):
    """After the section marker: calls until the section's close (see the module docstring)."""

    def __init__(
        self, syntax: SectionSyntax, marker: str, new_index: NewIndex, schemas: ToolSchemas | None
    ) -> None:
        super().__init__(marker, new_index, schemas)
        self._syntax = syntax
        self._state = _S.BETWEEN
        self._args: StreamedArgs | None = None

    def _advance(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        match self._state:
            case _S.ARGS:
                return self._arguments(buf, pos, final, out)
            case _S.HEADER | _S.NAME_LINE:
                return self._header(buf, pos, final, out)
            case _S.ARGS_WAIT:
                return self._arguments_start(buf, pos, final, out)
            case _S.BETWEEN | _S.AFTER_ARGS:
                return self._markers(buf, pos, final, out)

    def _arguments(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        assert self._args is not None
        assert self._stream is not None
        pos = self._args.feed(buf, pos, final, self._stream, out)
        if self._args.complete:
            self._end_call(out)
            self._state = _S.AFTER_ARGS
            return pos
        if final:
            self._end_call(out)
            return Step(pos, out, done=True)
        return Step(pos, out)

    def _header(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        s = self._syntax
        name_line = self._state == _S.NAME_LINE
        stops = ("\n", s.call_close) if name_line else (s.sep, s.call_close)
        pos, stop = self._read_until(buf, pos, stops, final)
        if stop is None:
            if final or len("".join(self._parts)) > _HEADER_MAX:
                return self._give_up(pos, out)
            return Step(pos, out)
        header = self._take_parts()
        if stop != s.call_close and not name_line and s.kind == "deepseek":
            if header.strip() == "function":
                # DeepSeek V3/R1: ``function<sep>NAME\n```json\n{...}\n```<end>``; the name
                # may also be followed directly by the arguments.
                self._state = _S.NAME_LINE
                return pos
        if not self._start(header, out):
            return self._give_up(pos, out)
        if stop == s.call_close:  # a call with no arguments
            self._end_call(out)
            self._state = _S.BETWEEN
        else:
            self._state = _S.ARGS_WAIT
        return pos

    def _arguments_start(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        """Before the arguments: a fence to skip, the value, or none (the call ends with {})."""
        pos, fence = self._next_marker(buf, pos, final, (_FENCE_JSON, _FENCE), (_FENCE_JSON,))
        if fence is None:
            return self._give_up(pos, out) if final else Step(pos, out)
        if fence:  # DeepSeek V3's fenced json block
            return pos + len(fence)
        value = JsonValue.begin(buf[pos])
        if value is None:
            self._end_call(out)
            self._state = _S.AFTER_ARGS
            return pos
        self._args = StreamedArgs(value)
        self._state = _S.ARGS
        return pos

    def _markers(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        """Between calls, or after a call's arguments: the next marker."""
        s = self._syntax
        after_args = self._state == _S.AFTER_ARGS
        wanted = (s.call_open, s.section_close) + ((s.call_close,) if after_args else ())
        forming = (s.call_open, s.section_close, s.call_close, _FENCE)
        pos, hit = self._next_marker(buf, pos, final, wanted, forming)
        if hit is None:
            return self._give_up(pos, out) if final else Step(pos, out)
        if hit == s.call_open:
            if not self._started_any:
                self._note(s.call_open)
            self._parts = []
            self._state = _S.HEADER
        elif hit == s.section_close:
            return self._finish(pos + len(hit), out)
        elif hit:  # the call's close
            self._state = _S.BETWEEN
        elif not self._started_any:
            return self._give_up(pos, out)
        else:
            return pos + 1  # junk after a call, inside the section: dropped
        return pos + len(hit)

    def _start(self, header: str, out: list[ParsedEvent]) -> bool:
        name = kimi_name(header) if self._syntax.kind == "kimi" else header.strip()
        if not name or any(c.isspace() for c in name):
            return False
        self._start_call(name, out)
        self._args = None
        return True

    def _end_call(self, out: list[ParsedEvent]) -> None:
        assert self._stream is not None
        self._stream.end("{}" if self._args is None else self._args.args.final(), out)
        self._stream = None
        self._args = None

    def _end_open_call(self, out: list[ParsedEvent]) -> None:
        self._end_call(out)
