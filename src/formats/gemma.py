"""Gemma's tool calls: Gemma 4 ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>`` and
FunctionGemma ``<start_function_call>call:NAME{key:<escape>text<escape>}<end_function_call>``.

The arguments are an object in Gemma's own notation: bare keys, strings between a delimiter
token (``<|"|>`` or ``<escape>``) with no escaping inside, numbers, ``true``/``false``/``null``,
nested ``{...}`` and ``[...]``. ``GemmaArgs`` translates that notation into JSON as it is
generated, so the arguments stream.

Invariants (on top of ``tool_format_base``'s):
- One call per marked block; the call starts when its name is complete (at the ``{``).
- The translation of a prefix never changes as more text arrives: keys and bare scalars are
  held until they end, strings stream character by character (JSON-escaped), and a delimiter
  is waited for while it could still be one. A bare word that is not a JSON literal becomes a
  JSON string. The final arguments are exactly the streamed text.
- A block that does not start with ``call:NAME{`` is shown as text; cut short, the call ends
  with the JSON written so far (which may then not parse, as with any format).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .base import (
    CallStream,
    NewIndex,
    ParsedEvent,
    Step,
    is_partial,
    skip_ws,
)
from .region import ToolRegion, ToolSchemas
from .scan_util import take_until


@dataclass(frozen=True, slots=True)
class GemmaSyntax:
    open: str
    close: str
    quote: str  # the string delimiter token


GEMMA4 = GemmaSyntax(open="<|tool_call>", close="<tool_call|>", quote='<|"|>')
FUNCTION_GEMMA = GemmaSyntax(
    open="<start_function_call>", close="<end_function_call>", quote="<escape>"
)

_CALL = "call:"
_NAME_CHARS = re.compile(r"[\w.\-]*")
_NAME_MAX = 256
_SCALAR_STOP = ",}]"


def _scalar_json(token: str) -> str:
    try:
        value = json.loads(token)
    except ValueError:
        return json.dumps(token, ensure_ascii=False)
    if isinstance(value, (dict, list, str)):
        return json.dumps(token, ensure_ascii=False)
    return token


class GemmaArgs:
    """Gemma's object notation -> JSON text, incrementally (module docstring)."""

    __slots__ = ("_expect_key", "_held", "_in_json_string", "_in_string", "_quote", "_stack")

    def __init__(self, quote: str) -> None:
        self._quote = quote
        self._stack: list[str] = []
        self._expect_key = False
        self._in_string = False  # between delimiter tokens
        self._in_json_string = False  # a "..." string some models write instead
        self._held: list[str] = []  # a key or bare scalar being read

    @property
    def complete(self) -> bool:
        return not self._stack and not self._in_string

    def feed(self, buf: str, pos: int, final: bool, out: list[str]) -> int:
        """Translate from ``pos``; returns how far it consumed. Stops once the object closes."""
        n, q = len(buf), self._quote
        while pos < n:
            if self._in_string:
                text, pos, stop = take_until(buf, pos, (q,), final)
                out.append(json.dumps(text, ensure_ascii=False)[1:-1])
                if stop is None:
                    return pos
                out.append('"')
                self._in_string = False
                if self._expect_key:  # a quoted key
                    self._expect_key = False
                    out.append(": ")
                    pos = self._skip_colon(buf, pos)
                continue
            if self._in_json_string:
                i = pos
                while i < n and buf[i] != '"':
                    i += 2 if buf[i] == "\\" and i + 1 < n else 1
                if i >= n:
                    end = n - 1 if buf[n - 1] == "\\" and (n - pos) % 2 else n
                    out.append(buf[pos:end])
                    return end
                out.append(buf[pos : i + 1])
                self._in_json_string = False
                pos = i + 1
                if self._expect_key:  # a JSON-quoted key (``%json`` writes nested objects so)
                    self._expect_key = False
                    out.append(": ")
                    pos = self._skip_colon(buf, pos)
                continue
            c = buf[pos]
            if self._held:
                if self._expect_key and c == ":":
                    out.append(json.dumps("".join(self._held).strip(), ensure_ascii=False))
                    out.append(": ")
                    self._held = []
                    self._expect_key = False
                    pos += 1
                    continue
                if not self._expect_key and c in _SCALAR_STOP:
                    out.append(_scalar_json("".join(self._held).strip()))
                    self._held = []
                    continue
                self._held.append(c)
                pos += 1
                continue
            if c == "<":
                if buf.startswith(q, pos):
                    out.append('"')
                    self._in_string = True
                    pos += len(q)
                    continue
                if not final and is_partial(buf, pos, (q,)):
                    return pos
            if c in " \t\r\n":
                pos += 1
            elif c in "{[":
                self._stack.append(c)
                self._expect_key = c == "{"
                out.append(c)
                pos += 1
            elif c in "}]":
                if self._stack:
                    self._stack.pop()
                self._expect_key = False
                out.append(c)
                pos += 1
                if not self._stack:
                    return pos
            elif c == ",":
                out.append(", ")
                self._expect_key = bool(self._stack) and self._stack[-1] == "{"
                pos += 1
            elif c == '"':
                out.append(c)
                self._in_json_string = True
                pos += 1
            elif c == ":" and not self._expect_key:
                pos += 1  # stray: the key already carried its colon
            else:
                self._held.append(c)
                pos += 1
        if final and self._held:
            held = "".join(self._held)
            out.append(json.dumps(held) if self._expect_key else _scalar_json(held.strip()))
            self._held = []
        return pos

    def _skip_colon(self, buf: str, pos: int) -> int:
        end = skip_ws(buf, pos)
        return end + 1 if end < len(buf) and buf[end] == ":" else pos


_CALL_WAIT, _NAME, _ARGS, _CLOSE = range(4)


class GemmaRegion(ToolRegion):
    """After the block's marker: ``call:NAME{...}`` then the close (module docstring)."""

    def __init__(
        self, syntax: GemmaSyntax, marker: str, new_index: NewIndex, schemas: ToolSchemas | None
    ) -> None:
        super().__init__(marker, new_index, schemas)
        self._syntax = syntax
        self._state = _CALL_WAIT
        self._name: list[str] = []
        self._stream: CallStream | None = None
        self._args = GemmaArgs(syntax.quote)

    def step(self, buf: str, final: bool) -> Step:
        out: list[ParsedEvent] = []
        pos, n = 0, len(buf)
        while True:
            state = self._state
            if state == _CALL_WAIT:
                end = skip_ws(buf, pos)
                self._note(buf[pos:end])
                pos = end
                if buf.startswith(_CALL, pos):
                    self._note(_CALL)
                    pos += len(_CALL)
                    self._state = _NAME
                    continue
                if not final and (pos == n or is_partial(buf, pos, (_CALL,))):
                    return Step(pos, out)
                return self._revert(pos, out)
            if state == _NAME:
                m = _NAME_CHARS.match(buf, pos)
                assert m is not None
                self._name.append(m.group())
                self._note(m.group())
                pos = m.end()
                name = "".join(self._name)
                if pos == n:
                    if final or len(name) > _NAME_MAX:
                        return self._revert(pos, out)
                    return Step(pos, out)
                if buf[pos] != "{" or not name:
                    return self._revert(pos, out)
                self._stream = CallStream(self._new_index)
                self._stream.start(name, out)
                self._started_any = True
                self._marker = ""
                self._pending.clear()
                self._state = _ARGS
                continue
            if state == _ARGS:
                assert self._stream is not None
                pieces: list[str] = []
                pos = self._args.feed(buf, pos, final, pieces)
                self._stream.send("".join(pieces), out)
                if self._args.complete:
                    self._stream.end("", out)
                    self._state = _CLOSE
                    continue
                if final:
                    self._stream.end("", out)
                    return Step(pos, out, done=True)
                return Step(pos, out)
            # _CLOSE: the block's end marker, if the model wrote it
            end = skip_ws(buf, pos)
            close = self._syntax.close
            if buf.startswith(close, end):
                return Step(end + len(close), out, done=True)
            if not final and (end == n or is_partial(buf, end, (close,))):
                return Step(pos, out)
            return Step(pos, out, done=True)
