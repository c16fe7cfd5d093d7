"""Generated text -> visible text, reasoning and tool calls, incrementally.

``StreamParser.feed`` takes the generated text in whatever pieces the detokenizer produces;
``finish`` ends it. This parser reads the tag formats (``tagged``: Hermes, Qwen3-Coder, Llama 3,
Mistral; their tool-call regions live in ``regions``) and, given a family's table of which
marker opens which region (``family_regions``), the family formats.

Invariants:
- Chunking never matters: the events for any split of the same text, after merging adjacent
  chunks of one kind (``coalesce``), equal those for the whole text fed at once. Each
  character is decided from the text before it only; text is held back only while it could
  still be the start of a marker (``<think>``, ``</think>``, ``<tool_call>``, ``<function=``,
  ``[TOOL_CALLS]``, ``<|python_tag|>``, a Llama 3 call's opening brace) or a call's body, and
  whitespace only while it could turn out to sit between text and a tool call.
- With ``reasoning``, text inside ``<think>...</think>`` is only ever ``ReasoningChunk``, the
  tags are never shown, a stray ``</think>`` is dropped, and the whitespace around the
  reasoning (the ``\\n`` after ``<think>``, before ``</think>``, the ``\\n\\n`` after it, the
  whitespace before a ``<think>`` that opens the output) is dropped. ``starts_in_reasoning``
  means the prompt already opened ``<think>``; output that then begins (after whitespace) with
  a tool call is that call after empty reasoning (a forced call's grammar writes the call
  first; a marker that starts no call stays reasoning). Without
  ``reasoning`` the tags are ordinary text.
- Tool calls are parsed only with ``tools_enabled``; otherwise every marker is text. Calls get
  indices 0, 1, 2... in order; each is ``ToolCallStart`` (as soon as the name is known), then
  ``ToolCallArgs`` fragments, then ``ToolCallEnd``, whose ``arguments`` equals the join of the
  fragments (the end-of-generation parse only ever appends the unsent rest).
- JSON formats stream the arguments object raw, as generated; its final text is that raw text.
  Fallbacks: text that looked like a call but is not one (no name before it went wrong, or cut
  short before the name) is shown as text, its marker included; a started call whose JSON
  breaks or is cut short ends with what was generated (``arguments`` may then not parse, as
  with a real API on ``max_output_tokens``); arguments given as a string holding a JSON object
  become that object; missing arguments become ``{}``.
- Whitespace between visible text and a tool call, and after a call, is dropped, so a message
  is never only whitespace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from .base import (
    ParsedEvent,
    ParseOptions,
    ReasoningChunk,
    Step,
    TextChunk,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
    ToolSchemas,
    find_first,
    partial_suffix,
)
from .buffered import BufferedParser
from .region import RegionFactory, ToolRegion
from .regions import (
    FUNCTION_OPEN,
    MISTRAL_TOOL_CALLS,
    PYTHON_TAG,
    TOOL_CALL_OPEN,
    FunctionRegion,
    Llama3Region,
    MistralRegion,
    TagRegion,
)

__all__ = [
    "REASONING_OPENERS",
    "ParsedEvent",
    "ReasoningChunk",
    "StreamParser",
    "TagFormat",
    "TextChunk",
    "ToolCallArgs",
    "ToolCallEnd",
    "ToolCallStart",
    "ToolSchemas",
    "coalesce",
    "reasoning_opens_in_prompt",
    "stream_parser",
]

TagFormat = Literal["hermes", "qwen3_coder", "llama3_json", "mistral", "none"]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

_TAG_REGIONS: dict[TagFormat, Mapping[str, RegionFactory]] = {
    "hermes": {TOOL_CALL_OPEN: TagRegion},
    "qwen3_coder": {TOOL_CALL_OPEN: TagRegion, FUNCTION_OPEN: FunctionRegion},
    "mistral": {MISTRAL_TOOL_CALLS: MistralRegion},
    "llama3_json": {},  # its calls open no region by a marker: see ``_start_llama``
    "none": {},
}


# Reasoning openers a generation prompt may end with: ``<think>``, Kimi K3's think block.
REASONING_OPENERS = (THINK_OPEN, "<|open|>think<|sep|>")


def reasoning_opens_in_prompt(rendered_prompt_text: str) -> bool:
    """True when the generation prompt ends inside reasoning (``<think>``: Qwen3-2507 thinking,
    DeepSeek R1...; Kimi K3's ``<|open|>think<|sep|>``): the output then begins with reasoning
    and carries no opening tag."""
    return rendered_prompt_text.rstrip().endswith(REASONING_OPENERS)


def coalesce(events: list[ParsedEvent]) -> list[ParsedEvent]:
    """Merge adjacent text chunks, adjacent reasoning chunks, and adjacent argument fragments
    of one call; a consumer may coalesce a burst of events this way before sending them."""
    merged: list[ParsedEvent] = []
    for event in events:
        last = merged[-1] if merged else None
        if isinstance(event, TextChunk) and isinstance(last, TextChunk):
            merged[-1] = TextChunk(last.text + event.text)
        elif isinstance(event, ReasoningChunk) and isinstance(last, ReasoningChunk):
            merged[-1] = ReasoningChunk(last.text + event.text)
        elif (
            isinstance(event, ToolCallArgs)
            and isinstance(last, ToolCallArgs)
            and event.index == last.index
        ):
            merged[-1] = ToolCallArgs(event.index, last.delta + event.delta)
        else:
            merged.append(event)
    return merged


class StreamParser(BufferedParser):
    """Splits one generation's text into events; one parser per generation."""

    def __init__(
        self,
        *,
        tool_format: TagFormat = "none",
        regions: Mapping[str, RegionFactory] | None = None,
        tools_enabled: bool,
        reasoning: bool,
        starts_in_reasoning: bool = False,
        tool_schemas: ToolSchemas | None = None,
        think: tuple[str, str] = (THINK_OPEN, THINK_CLOSE),
        hidden: tuple[str, ...] = (),
    ) -> None:
        """``regions``: which marker opens which tool region (a family format's table, see
        ``family_regions``); by default the tag format's. ``tool_schemas`` (optional: function name -> JSON Schema of its parameters) only
        types Qwen3-Coder XML parameter values. ``starts_in_reasoning`` needs ``reasoning``.
        ``think``: the markers around reasoning (Gemma 4 writes ``<|channel>thought``...
        ``<channel|>``). ``hidden``: markers of the format's own framing around visible text
        (Kimi K3's ``<|open|>response<|sep|>``), never shown, like a stray ``</think>``."""
        super().__init__()
        self._format: TagFormat = tool_format if tools_enabled else "none"
        self._schemas = tool_schemas
        table = _TAG_REGIONS[self._format] if regions is None else regions
        self._regions = dict(table) if tools_enabled else {}
        self._tool_markers = tuple(self._regions)
        self._think_open, self._think_close = think
        self._hidden = hidden
        self._markers = (think if reasoning else ()) + hidden + self._tool_markers
        self._in_reasoning = reasoning and starts_in_reasoning
        self._reasoning_lead = self._in_reasoning  # whitespace opening the reasoning: dropped
        self._prompt_lead = self._in_reasoning  # nothing read yet of reasoning the prompt opened
        self._from_reasoning = False  # the open region began where that reasoning would
        self._region: ToolRegion | None = None
        self._skip_ws = False  # after </think> or a tool call
        # Nothing read yet: whitespace there is held, dropped if reasoning opens after it
        # (GLM's template writes ``<|assistant|>\n<think>``; the ``\n`` is its markup).
        self._lead = reasoning and not starts_in_reasoning
        self._llama_start = self._format == "llama3_json"  # nothing visible yet

    def finish(self) -> list[ParsedEvent]:
        out = super().finish()
        assert not self._buf, "everything is flushed at finish()"
        assert self._region is None
        return out

    def _run(self, *, final: bool) -> list[ParsedEvent]:
        out: list[ParsedEvent] = []
        while True:
            if self._region is not None:
                progressed = self._scan_region(final, out)
            elif self._in_reasoning:
                progressed = self._scan_reasoning(final, out)
            else:
                progressed = self._scan_content(final, out)
            if not progressed:
                return out

    def _scan_reasoning(self, final: bool, out: list[ParsedEvent]) -> bool:
        buf = self._buf
        if self._reasoning_lead:
            buf = buf.lstrip()
            self._buf = buf
            if not buf:
                return False
            if self._prompt_lead:
                # A call where the reasoning the prompt opened should begin is a call after
                # empty reasoning: what a forced call's grammar writes (it knows nothing of the
                # prompt). Should no call start there, the text is reasoning after all.
                if any(buf.startswith(m) for m in self._tool_markers):
                    self._in_reasoning = self._reasoning_lead = self._prompt_lead = False
                    self._from_reasoning = True
                    return True
                if not final and any(m.startswith(buf) for m in self._tool_markers):
                    return False  # could still be a call's marker: wait
                self._prompt_lead = False
            self._reasoning_lead = False
        i = buf.find(self._think_close)
        if i >= 0:
            self._reasoning_text(out, buf[:i].rstrip())
            self._buf = buf[i + len(self._think_close) :]
            self._in_reasoning = False
            self._skip_ws = True
            return True
        if final:
            self._reasoning_text(out, buf.rstrip())
            self._buf = ""
            return False
        # Hold a possible "</think>" and the whitespace before it (dropped if it closes).
        end = len(buf[: len(buf) - partial_suffix(buf, 0, (self._think_close,))].rstrip())
        self._reasoning_text(out, buf[:end])
        self._buf = buf[end:]
        return False

    def _scan_content(self, final: bool, out: list[ParsedEvent]) -> bool:
        buf = self._buf
        if self._skip_ws:
            buf = buf.lstrip()
            self._buf = buf
            if not buf:
                return False
            self._skip_ws = False
        if self._lead:
            body = buf.lstrip()
            if body.startswith(self._think_open):
                buf = self._buf = body
            elif not final and self._think_open.startswith(body):
                return False  # whitespace, or the start of the opening tag: wait
            self._lead = False
        if self._llama_start:
            entered = self._start_llama(final)
            if entered is not None:
                return entered
        i, marker = find_first(buf, 0, self._markers)
        # A marker that is the start of a longer one (Muse's `` to=`` and `` to=user<|message|>``)
        # waits until the longer one is decided, so chunking never matters.
        if i >= 0 and not final:
            rest = buf[i:]
            if any(len(m) > len(rest) and m.startswith(rest) for m in self._markers):
                end = len(buf[:i].rstrip()) if self._tool_markers else i
                self._text(out, buf[:end])
                self._buf = buf[end:]
                return False
        if i < 0:
            end = len(buf)
            if not final:
                end -= partial_suffix(buf, 0, self._markers)
                if self._tool_markers:  # trailing whitespace may precede a call
                    end = len(buf[:end].rstrip())
            self._text(out, buf[:end])
            self._buf = buf[end:]
            return False
        before, self._buf = buf[:i], buf[i + len(marker) :]
        if marker == self._think_open:
            self._text(out, before)
            self._in_reasoning = self._reasoning_lead = True
        elif marker == self._think_close:
            self._text(out, before)
            self._skip_ws = True
        elif marker in self._hidden:  # framing: dropped, what follows kept as written
            self._text(out, before)
        else:
            text = before.rstrip()
            self._text(out, text)
            self._region = self._open_region(marker, before[len(text) :] + marker)
        return True

    def _start_llama(self, final: bool) -> bool | None:
        """Before anything visible: enter a Llama 3 JSON region if the output begins with
        ``{`` or the python tag (True), hold what may still become the tag (False), or
        read on as ordinary output (None)."""
        buf = self._buf
        body = buf.lstrip()
        ws = buf[: len(buf) - len(body)]
        for opener in (PYTHON_TAG, "{"):
            if body.startswith(opener):
                shown = opener if opener == PYTHON_TAG else ""
                self._llama_start = False
                self._buf = body[len(shown) :]
                self._region = Llama3Region(ws + shown, self._new_index, self._schemas)
                return True
        if not final and (not body or PYTHON_TAG.startswith(body)):
            return False
        return None

    def _open_region(self, marker: str, shown_if_reverted: str) -> ToolRegion:
        return self._regions[marker](shown_if_reverted, self._new_index, self._schemas)

    def _scan_region(self, final: bool, out: list[ParsedEvent]) -> bool:
        assert self._region is not None
        step: Step = self._region.step(self._buf, final)
        out.extend(step.events)
        rest = self._buf[step.consumed :]
        if not step.done:
            assert not final, "a region must end at finish()"
            self._buf = rest
            return False
        self._region = None
        if self._from_reasoning:
            self._from_reasoning = False
            if step.revert:  # no call started: it was reasoning
                self._buf = step.revert + step.pushback + rest
                self._in_reasoning = True
                return True
        self._text(out, step.revert)
        self._buf = step.pushback + rest
        self._skip_ws = not step.revert and not step.pushback
        return True

    def _text(self, out: list[ParsedEvent], text: str) -> None:
        if text:
            self._llama_start = False
            out.append(TextChunk(text))

    def _reasoning_text(self, out: list[ParsedEvent], text: str) -> None:
        if text:
            out.append(ReasoningChunk(text))


def stream_parser(
    options: ParseOptions,
    *,
    tool_format: TagFormat = "none",
    regions: Mapping[str, RegionFactory] | None = None,
    think: tuple[str, str] = (THINK_OPEN, THINK_CLOSE),
    hidden: tuple[str, ...] = (),
) -> StreamParser:
    """One generation's ``StreamParser`` for a tag format, or for a family's region table."""
    return StreamParser(
        tool_format=tool_format,
        regions=regions,
        tools_enabled=options.tools_enabled,
        reasoning=options.reasoning,
        starts_in_reasoning=options.starts_in_reasoning,
        tool_schemas=options.tool_schemas,
        think=think,
        hidden=hidden,
    )
