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

from .base import (
    ArgsText,
    CallStream,
    JsonValue,
    NewIndex,
    ParsedEvent,
    Step,
    is_partial,
    skip_ws,
)
from .regions import ToolRegion, ToolSchemas
from .scan_util import take_until

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


_BETWEEN, _HEADER, _NAME_LINE, _ARGS_WAIT, _ARGS, _AFTER_ARGS = range(6)


class SectionJsonRegion(ToolRegion):
    """After the section marker: calls until the section's close (see the module docstring)."""

    def __init__(
        self, syntax: SectionSyntax, marker: str, new_index: NewIndex, schemas: ToolSchemas | None
    ) -> None:
        super().__init__(marker, new_index, schemas)
        self._syntax = syntax
        self._state = _BETWEEN
        self._parts: list[str] = []
        self._stream: CallStream | None = None
        self._value = JsonValue("object")
        self._args: ArgsText | None = None

    def step(self, buf: str, final: bool) -> Step:
        out: list[ParsedEvent] = []
        s = self._syntax
        pos, n = 0, len(buf)
        while True:
            state = self._state
            if state == _ARGS:
                assert self._args is not None
                assert self._stream is not None
                end = self._value.feed(buf, pos, final)
                self._args.add(buf[pos:end])
                if self._args.streams:
                    self._stream.send(buf[pos:end], out)
                pos = end
                if self._value.complete:
                    self._args.complete = True
                    self._end_call(out)
                    self._state = _AFTER_ARGS
                    continue
                if final:
                    self._end_call(out)
                    return Step(pos, out, done=True)
                return Step(pos, out)
            if state in (_HEADER, _NAME_LINE):
                stops = (s.sep, s.call_close) if state == _HEADER else ("\n", s.call_close)
                text, end, stop = take_until(buf, pos, stops, final)
                self._parts.append(text)
                if not self._started_any:
                    self._note(buf[pos:end])
                pos = end
                header = "".join(self._parts)
                if stop is None:
                    if final or len(header) > _HEADER_MAX:
                        return self._give_up(pos, out)
                    return Step(pos, out)
                if stop == s.call_close:  # a call with no arguments
                    if not self._start(header, out):
                        return self._give_up(pos, out)
                    self._end_call(out)
                    self._state = _BETWEEN
                    continue
                if state == _HEADER and s.kind == "deepseek" and header.strip() == "function":
                    # DeepSeek V3/R1: ``function<sep>NAME\n```json\n{...}\n```<end>``; the name
                    # may also be followed directly by the arguments.
                    self._parts = []
                    self._state = _NAME_LINE
                    continue
                if not self._start(header, out):
                    return self._give_up(pos, out)
                self._state = _ARGS_WAIT
                continue
            pos = skip_ws(buf, pos) if self._started_any else self._skip_noted(buf, pos)
            if pos == n:
                if final:
                    if state == _ARGS_WAIT and self._stream is not None:
                        self._end_call(out)
                    return self._finish(pos, out)
                return Step(pos, out)
            if state == _ARGS_WAIT:
                if not final and is_partial(buf, pos, (_FENCE_JSON,)):
                    return Step(pos, out)
                fence = next((f for f in (_FENCE_JSON, _FENCE) if buf.startswith(f, pos)), "")
                if fence:  # DeepSeek V3's fenced json block
                    pos += len(fence)
                    continue
                value = JsonValue.begin(buf[pos])
                if value is None:  # no arguments value: the call ends with {}
                    self._end_call(out)
                    self._state = _AFTER_ARGS
                    continue
                self._value = value
                self._args = ArgsText(value.kind)
                self._state = _ARGS
                continue
            # _BETWEEN or _AFTER_ARGS
            if buf.startswith(s.call_open, pos):
                if not self._started_any:
                    self._note(s.call_open)
                pos += len(s.call_open)
                self._parts = []
                self._state = _HEADER
            elif buf.startswith(s.section_close, pos):
                pos += len(s.section_close)
                if not self._started_any:
                    return self._give_up(pos, out)
                return Step(pos, out, done=True)
            elif state == _AFTER_ARGS and buf.startswith(s.call_close, pos):
                pos += len(s.call_close)
                self._state = _BETWEEN
            elif not final and is_partial(
                buf, pos, (s.call_open, s.section_close, s.call_close, _FENCE)
            ):
                return Step(pos, out)
            elif not self._started_any:
                return self._give_up(pos, out)
            else:
                pos += 1  # junk after a call, inside the section: dropped

    def _skip_noted(self, buf: str, pos: int) -> int:
        end = skip_ws(buf, pos)
        self._note(buf[pos:end])
        return end

    def _start(self, header: str, out: list[ParsedEvent]) -> bool:
        name = kimi_name(header) if self._syntax.kind == "kimi" else header.strip()
        if not name or any(c.isspace() for c in name):
            return False
        self._stream = CallStream(self._new_index)
        self._stream.start(name, out)
        self._args = None
        self._started_any = True
        self._marker = ""
        self._pending.clear()
        return True

    def _end_call(self, out: list[ParsedEvent]) -> None:
        assert self._stream is not None
        self._stream.end("{}" if self._args is None else self._args.final(), out)
        self._stream = None
        self._args = None

    def _give_up(self, pos: int, out: list[ParsedEvent]) -> Step:
        if self._stream is not None:
            self._end_call(out)
        if self._started_any:
            return Step(pos, out, done=True)
        return self._revert(pos, out)
