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
from enum import Enum, auto

from .base import NewIndex, ParsedEvent, Step, ToolSchemas, is_partial, skip_ws
from .region import Advance, ToolRegion
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
        go_on = True
        while go_on and pos < len(buf):
            if self._in_string:
                pos, go_on = self._delimited(buf, pos, final, out)
            elif self._in_json_string:
                pos, go_on = self._json_quoted(buf, pos, out)
            elif self._held:
                pos = self._held_char(buf, pos, out)
            else:
                pos, go_on = self._structure(buf, pos, final, out)
        if final and self._held:  # a key or scalar cut short (nothing is held at a stop)
            held = "".join(self._held)
            out.append(json.dumps(held) if self._expect_key else _scalar_json(held.strip()))
            self._held = []
        return pos

    def _delimited(self, buf: str, pos: int, final: bool, out: list[str]) -> tuple[int, bool]:
        """Inside a string between delimiter tokens: ``(pos, read on)``."""
        text, pos, stop = take_until(buf, pos, (self._quote,), final)
        out.append(json.dumps(text, ensure_ascii=False)[1:-1])
        if stop is None:
            return pos, False
        out.append('"')
        self._in_string = False
        return self._after_string(buf, pos, out), True

    def _json_quoted(self, buf: str, pos: int, out: list[str]) -> tuple[int, bool]:
        """Inside a ``"..."`` string some models write instead: ``(pos, read on)``."""
        n = len(buf)
        i = pos
        while i < n and buf[i] != '"':
            i += 2 if buf[i] == "\\" and i + 1 < n else 1
        if i >= n:
            end = n - 1 if buf[n - 1] == "\\" and (n - pos) % 2 else n
            out.append(buf[pos:end])
            return end, False
        out.append(buf[pos : i + 1])
        self._in_json_string = False
        return self._after_string(buf, i + 1, out), True

    def _after_string(self, buf: str, pos: int, out: list[str]) -> int:
        """A quoted key (``%json`` writes nested objects' keys so) carries its colon."""
        if not self._expect_key:
            return pos
        self._expect_key = False
        out.append(": ")
        return self._skip_colon(buf, pos)

    def _held_char(self, buf: str, pos: int, out: list[str]) -> int:
        """A character after part of a bare key or scalar: it ends it, or is part of it."""
        c = buf[pos]
        if self._expect_key and c == ":":
            out.append(json.dumps("".join(self._held).strip(), ensure_ascii=False))
            out.append(": ")
            self._held = []
            self._expect_key = False
            return pos + 1
        if not self._expect_key and c in _SCALAR_STOP:
            out.append(_scalar_json("".join(self._held).strip()))
            self._held = []
            return pos
        self._held.append(c)
        return pos + 1

    def _structure(self, buf: str, pos: int, final: bool, out: list[str]) -> tuple[int, bool]:
        """A character outside strings and bare words: ``(pos, read on)``."""
        c = buf[pos]
        if c == "<":
            if buf.startswith(self._quote, pos):
                out.append('"')
                self._in_string = True
                return pos + len(self._quote), True
            if not final and is_partial(buf, pos, (self._quote,)):
                return pos, False
        if c in "{[":
            self._stack.append(c)
            self._expect_key = c == "{"
            out.append(c)
        elif c in "}]":
            if self._stack:
                self._stack.pop()
            self._expect_key = False
            out.append(c)
            return pos + 1, bool(self._stack)  # the object closed: stop there
        elif c == ",":
            out.append(", ")
            self._expect_key = bool(self._stack) and self._stack[-1] == "{"
        elif c == '"':
            out.append(c)
            self._in_json_string = True
        elif c not in " \t\r\n" and (c != ":" or self._expect_key):
            self._held.append(c)  # (whitespace, and a stray colon after a key, are skipped)
        return pos + 1, True

    def _skip_colon(self, buf: str, pos: int) -> int:
        end = skip_ws(buf, pos)
        return end + 1 if end < len(buf) and buf[end] == ":" else pos


class _S(Enum):
    CALL_WAIT = auto()  # before ``call:``
    NAME = auto()
    ARGS = auto()
    CLOSE = auto()  # after the arguments: the block's close, if written


class GemmaRegion(ToolRegion):
    """After the block's marker: ``call:NAME{...}`` then the close (module docstring)."""

    def __init__(
        self, syntax: GemmaSyntax, marker: str, new_index: NewIndex, schemas: ToolSchemas | None
    ) -> None:
        super().__init__(marker, new_index, schemas)
        self._syntax = syntax
        self._state = _S.CALL_WAIT
        self._args = GemmaArgs(syntax.quote)

    def _advance(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        match self._state:
            case _S.CALL_WAIT:
                return self._call_word(buf, pos, final, out)
            case _S.NAME:
                return self._name(buf, pos, final, out)
            case _S.ARGS:
                return self._arguments(buf, pos, final, out)
            case _S.CLOSE:
                return self._close(buf, pos, final, out)

    def _call_word(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        pos, hit = self._next_marker(buf, pos, final, (_CALL,))
        if hit is None and not final:
            return Step(pos, out)
        if not hit:
            return self._revert(pos, out)
        self._note(_CALL)
        self._state = _S.NAME
        return pos + len(_CALL)

    def _name(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        m = _NAME_CHARS.match(buf, pos)
        assert m is not None
        self._parts.append(m.group())
        self._note(m.group())
        pos = m.end()
        name = "".join(self._parts)
        if pos == len(buf):
            if final or len(name) > _NAME_MAX:
                return self._revert(pos, out)
            return Step(pos, out)
        if buf[pos] != "{" or not name:
            return self._revert(pos, out)
        self._start_call(name, out)
        self._state = _S.ARGS
        return pos

    def _arguments(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Advance:
        assert self._stream is not None
        pieces: list[str] = []
        pos = self._args.feed(buf, pos, final, pieces)
        self._stream.send("".join(pieces), out)
        if self._args.complete:
            self._stream.end("", out)
            self._state = _S.CLOSE
            return pos
        if final:
            self._stream.end("", out)
            return Step(pos, out, done=True)
        return Step(pos, out)

    def _close(self, buf: str, pos: int, final: bool, out: list[ParsedEvent]) -> Step:
        """The block's end marker, if the model wrote it."""
        end = skip_ws(buf, pos)
        close = self._syntax.close
        if buf.startswith(close, end):
            return Step(end + len(close), out, done=True)
        if not final and (end == len(buf) or is_partial(buf, end, (close,))):
            return Step(pos, out)
        return Step(pos, out, done=True)
