"""gpt-oss's harmony format: messages on channels, calls addressed ``to=functions.NAME``.

Generation begins after the template's ``<|start|>assistant``; the model writes messages, each
a header then ``<|message|>`` then its body:

- ``<|channel|>analysis<|message|>...<|end|>``: reasoning (``ReasoningChunk``);
- ``<|channel|>final<|message|>...``, and ``commentary`` with no recipient (a preamble): text;
- `` to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>`` (the template's
  form) or ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}``: a
  call of ``NAME`` (a namespaced tool's qualified name) whose arguments stream raw.

A message ends at ``<|end|>`` (another may follow, after ``<|start|>assistant``); ``<|call|>``
and ``<|return|>`` end the turn, and anything after them is dropped.

Invariants:
- Chunking never matters: a header is decided only once its ``<|message|>`` is seen, and a
  body's text is held back only while it could still be the start of a marker.
- A header is never shown, nor whitespace before one. Output that does not open with a header
  (a model that skipped it) is read as final text.
- A call's arguments are its body as generated (``{}`` when empty); ``ToolCallEnd`` ends every
  started call, at its end marker or at the end of the generation.
- With tools disabled a call's body is text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from .base import (
    CallStream,
    ParsedEvent,
    ReasoningChunk,
    TextChunk,
    find_first,
    partial_suffix,
)
from .buffered import BufferedParser
from .format import Detection, Format, ParseOptions, Parser, Replay, register
from .grammars import ForcedTool, argument_rules, lark_string

__all__ = ["ANALYSIS_MAX_TOKENS", "HARMONY", "HarmonyParser", "harmony_grammar"]

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
END = "<|end|>"
CALL = "<|call|>"
RETURN = "<|return|>"
CONSTRAIN = "<|constrain|>"

# A body also ends where a new header begins without ``<|end|>`` (``<|start|>``, or a bare
# ``<|channel|>``: markers are special tokens, never a body's own text).
_BODY_ENDS = (END, CALL, RETURN, START, CHANNEL)
_HEADER_OPENERS = (CHANNEL, START, " to=", "to=", CONSTRAIN)
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
_FUNCTIONS = "functions."

BodyKind = Literal["reasoning", "text", "call"]


class HarmonyParser(BufferedParser):
    """One generation's harmony text -> events (module docstring)."""

    def __init__(self, *, tools_enabled: bool) -> None:
        super().__init__()
        self._tools = tools_enabled
        self._state: Literal["header", "body", "done"] = "header"
        self._kind: BodyKind = "text"
        self._call: CallStream | None = None
        self._args_sent = False

    def _run(self, *, final: bool) -> list[ParsedEvent]:
        out: list[ParsedEvent] = []
        while True:
            if self._state == "done":
                self._buf = ""
                return out
            progressed = (
                self._scan_header(final, out)
                if self._state == "header"
                else self._scan_body(final, out)
            )
            if not progressed:
                if final:
                    self._end_body(out)
                    self._buf = ""
                return out

    def _scan_header(self, final: bool, out: list[ParsedEvent]) -> bool:
        buf = self._buf
        if buf[:1].isspace():
            # Whitespace before a header is dropped; decided once that is known.
            stripped = buf.lstrip()
            if not final and any(o.startswith(stripped) for o in ("<|", "to=")):
                return False
            if stripped.startswith(("<|", "to=")) or not stripped:
                self._buf = buf = stripped
        i = buf.find(MESSAGE)
        if i < 0:
            if not buf:
                return False
            opens = any(buf.startswith(o) or o.startswith(buf) for o in _HEADER_OPENERS)
            if opens and not final:
                return False  # a header still being written
            if not opens:  # no header at all: the model wrote its answer straight away
                self._open_body("text", None, out)
                return True
            self._buf = ""  # cut short inside a header: nothing to show
            return False
        header, self._buf = buf[:i], buf[i + len(MESSAGE) :]
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL_NAME.search(header)
        if recipient is not None and self._tools:
            name = recipient.group(1)
            self._open_body("call", name.removeprefix(_FUNCTIONS), out)
        elif recipient is None and channel is not None and channel.group(1) == "analysis":
            self._open_body("reasoning", None, out)
        else:
            self._open_body("text", None, out)
        return True

    def _open_body(self, kind: BodyKind, name: str | None, out: list[ParsedEvent]) -> None:
        self._state = "body"
        self._kind = kind
        if kind == "call" and name is not None:
            self._call = CallStream(self._new_index)
            self._call.start(name, out)

    def _scan_body(self, final: bool, out: list[ParsedEvent]) -> bool:
        buf = self._buf
        best, marker = find_first(buf, 0, _BODY_ENDS)
        if best < 0:
            end = len(buf) if final else len(buf) - partial_suffix(buf, 0, _BODY_ENDS)
            self._emit(buf[:end], out)
            self._buf = buf[end:]
            return False
        self._emit(buf[:best], out)
        self._end_body(out)
        if marker in (CALL, RETURN):
            self._state = "done"
            self._buf = ""
        else:
            self._state = "header"
            # ``<|end|>`` is followed by ``<|start|>``: the next header begins there.
            self._buf = buf[best + len(END) :] if marker == END else buf[best:]
        return True

    def _emit(self, text: str, out: list[ParsedEvent]) -> None:
        if not text:
            return
        if self._kind == "reasoning":
            out.append(ReasoningChunk(text))
        elif self._kind == "call" and self._call is not None:
            self._call.send(text, out)
            self._args_sent = True
        else:
            out.append(TextChunk(text))

    def _end_body(self, out: list[ParsedEvent]) -> None:
        call, self._call = self._call, None
        if call is not None:
            call.end("" if self._args_sent else "{}", out)  # "": exactly what was sent
        self._args_sent = False
        self._kind = "text"


ANALYSIS_MAX_TOKENS = 1024
"""The longest analysis message a forced call's grammar lets precede the call: past it the
message is closed and the call follows, so a forced call always comes."""

_MARKERS = (START, CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN)


def harmony_grammar(tools: Sequence[ForcedTool], literal: Callable[[str], str]) -> str:
    """After ``<|start|>assistant``: optionally one ``<|channel|>analysis<|message|>...<|end|>
    <|start|>assistant`` message (gpt-oss reasons before a call, as OpenAI's reasoning models
    do before a forced one; at most ``ANALYSIS_MAX_TOKENS``), then `` to=functions.NAME
    <|channel|>commentary json<|message|>{...}<|call|>``, the form the gpt-oss template replays
    calls in."""
    alternatives = " | ".join(f"call_{i}" for i in range(len(tools)))
    lines = [f"start: analysis? ({alternatives}) {literal(CALL)}"]
    # Reasoning text never holds a marker (as text, where the tokenizer lacks the token).
    markers = "|".join(re.escape(m) for m in _MARKERS)
    lines.append(f"REASONING: /(?s:.*)/ & ~/(?s:.*({markers}).*)/")
    end = literal(END)
    if end.startswith("<["):  # a special token: text can never run into it
        lines.append(f"thought[max_tokens={ANALYSIS_MAX_TOKENS}]: REASONING")
        thought = f"thought {end}"
    else:
        lines.append(f"THOUGHT: REASONING {end}")
        lines.append(f"thought[max_tokens={ANALYSIS_MAX_TOKENS}]: THOUGHT")
        thought = "thought"
    lines.append(
        f"analysis: {literal(CHANNEL)} {lark_string('analysis')} {literal(MESSAGE)} {thought} "
        f"{literal(START)} {lark_string('assistant')}"
    )
    for i, tool in enumerate(tools):
        lines.append(
            f"call_{i}: {lark_string(' to=' + _FUNCTIONS + tool.name)} {literal(CHANNEL)} "
            f"{lark_string('commentary json')} {literal(MESSAGE)} args_{i}"
        )
    lines.extend(argument_rules(tools))
    return "\n".join(lines) + "\n"


def _is_harmony(d: Detection) -> bool:
    if CHANNEL in d.template and MESSAGE in d.template and START in d.template:
        return True
    return all(t in d.vocab for t in (START, CHANNEL, MESSAGE, CALL))


def _effort(effort: str | None) -> Mapping[str, Any]:
    """gpt-oss knows low, medium (its default) and high."""
    if effort is None:
        return {}
    if effort in ("none", "minimal", "low"):
        return {"reasoning_effort": "low"}
    if effort == "medium":
        return {"reasoning_effort": "medium"}
    return {"reasoning_effort": "high"}


def _new_parser(options: ParseOptions) -> Parser:
    return HarmonyParser(tools_enabled=options.tools_enabled)


HARMONY = register(
    Format(
        "harmony",
        _is_harmony,
        _new_parser,
        call_grammar=harmony_grammar,
        # The gpt-oss template: reasoning as ``thinking``; ``tool.description`` read unguarded.
        replay=Replay(reasoning_key="thinking", default_description="", effort_kwargs=_effort),
        aliases=("gpt_oss", "gpt-oss", "openai_harmony"),
        priority=10,
        reasons=True,
    )
)
