"""Compact replay records: a stored response keeps its final object and a short *tape* of its
stream's delta boundaries, not every SSE event; the events are rebuilt from the two on demand.

Why this works: every event of a response comes from the pure ``ResponseMachine``, so feeding a
fresh machine the same inputs gives the same events. The inputs are recoverable from the final
object (item ids, names, call ids, texts, logprobs, usage, error) except for two things the
final object cannot tell: *where* the deltas were cut (the generation thread coalesces tokens
when the reader is slow, so the chunking differs from run to run) and the text of an item the
final object no longer holds (a message abandoned by a failure, or tool-call arguments that the
final parse disowned). The tape records exactly that.

The tape (``{"v": 1, "ops": "...", "lit": {...}}``): ``ops`` is one comma-separated string with
one token per machine input:

======================  ====================================================================
token                   machine input
======================  ====================================================================
``S``                   ``Start()``
``S<b>:<a>``            ``Start(Compacted(output[0], b, a))`` (automatic compaction)
``T<n>`` / ``T<n>/<m>``  ``TextDelta`` of the next ``n`` characters of the open message's text,
                        with its next ``m`` logprob entries
``R<n>``                ``ReasoningDelta`` of the next ``n`` characters of the reasoning text
``B``                   ``ToolCallBegin(name, call_id)`` of the next output item
``Bw`` / ``Bm`` / ``Ba``  ``ToolCallBegin`` of a hosted call: a ``web_search_call``, an
                        ``mcp_call``, an ``mcp_approval_request`` (name and server label
                        from the item)
``A<n>``                ``ToolCallArgs`` of the next ``n`` characters of the call's arguments
``E``                   ``ToolCallEnd(arguments)``, the final item's arguments (a web
                        search's rebuilt from its action)
``H``                   ``HostedResult`` of the open hosted call, from its final item (a
                        search's sources from ``src``)
``W``                   ``WholeItem`` of the next output item, as the final object holds it
``F`` / ``L``           ``Finish("stop")`` / ``Finish("length")``, with the final usage
``X`` / ``C``           ``Fail`` (the final ``error``) / ``Cancel``
======================  ====================================================================

``lit`` maps an ``output_index`` (as a string) to the item's literal streamed text (``text``,
``lp``: logprobs, ``id``, ``type``, ``name``, ``call_id``, ``server_label``) when the final
object does not hold it. ``si``: the request asked for the searches' sources. ``src`` maps a search's ``output_index`` to the ``(url, title)``
sources its result gave, as far as the stream shows them: the stored URLs (when the response
included them) and the titles of the citations; a marker's number places its source, and
unknown places are ``("", "")`` (which cite nothing).

Invariants:
- ``compact_events(final, events)`` returns a tape only if ``expand_events(final, tape)``
  equals ``events`` exactly (it checks), so a stored replay is the original stream, event for
  event: same types, ids, ``sequence_number`` s, texts, logprobs and snapshots. Anything else
  (an event stream not made by the machine) gives ``None``, and the caller keeps the events as
  they are.
- Snapshots inside events (``response.created``, ``in_progress``, the terminal) differ from the
  final object only in the keys of ``DYNAMIC``; every other key comes from the final object.
- Cost: a run of plain deltas on one item is fed to the machine as one input and its one
  delta event cut back into the run's events (the machine's state and every other event are
  the same as feeding them one by one; sequence numbers are renumbered), so expanding costs
  about what serialising the events would, not one machine step per delta.
- Pure: no I/O, no clock, no ids minted.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from ..objects import ResponseConfig, Usage
from .machine import (
    Cancel,
    Compacted,
    Fail,
    Finish,
    HostedCall,
    HostedResult,
    MachineInput,
    ProtocolError,
    ReasoningDelta,
    ResponseMachine,
    Start,
    State,
    TextDelta,
    ToolCallArgs,
    ToolCallBegin,
    ToolCallEnd,
    WholeItem,
)
from .replay_hosted import is_whole, known_sources, search_arguments

JsonObject = dict[str, Any]

FORMAT: Final = 1
DYNAMIC: Final = ("status", "output", "usage", "error", "incomplete_details", "completed_at")
FAILED_UNSTARTED: Final[JsonObject] = {"v": FORMAT, "ops": "X"}
"""The tape of a response that failed before it started: ``created`` (+ ``queued``), then
``failed`` with the final object's error (a stored stand-in, e.g. after a restart)."""
_TERMINAL_OPS: Final = {
    "response.completed": "F",
    "response.incomplete": "L",
    "response.failed": "X",
    "response.cancelled": "C",
}
_DELTA_OPS: Final = {
    "response.output_text.delta": "T",
    "response.reasoning_text.delta": "R",
    "response.function_call_arguments.delta": "A",
    "response.mcp_call_arguments.delta": "A",
}
_BEGIN_OPS: Final = {
    "function_call": "B",
    "web_search_call": "Bw",
    "mcp_call": "Bm",
    "mcp_approval_request": "Ba",
}
_HOSTED_BEGINS: Final = {
    "Bw": HostedCall("web_search"),
    "Bm": HostedCall("mcp"),
    "Ba": HostedCall("mcp", approval=True),
}
_HOSTED_DONE: Final = frozenset(
    {
        "response.web_search_call.completed",
        "response.mcp_call.completed",
        "response.mcp_call.failed",
    }
)
_ARGUMENT_ITEMS: Final = ("function_call", "mcp_call", "mcp_approval_request")


def compact_events(final: JsonObject, events: Sequence[JsonObject]) -> JsonObject | None:
    """The tape that rebuilds ``events`` from ``final``, or None when none does."""
    try:
        tape = _encode(final, events)
        rebuilt = expand_events(final, tape)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, ProtocolError):
        return None
    return tape if rebuilt == list(events) else None


def _encode(final: JsonObject, events: Sequence[JsonObject]) -> JsonObject:
    ops: list[str] = []
    streamed: dict[int, list[str]] = {}  # output_index -> delta texts
    logprobs: dict[int, list[JsonObject]] = {}
    opened: dict[int, JsonObject] = {}  # output_index -> the item as added
    closed: dict[int, JsonObject] = {}  # output_index -> the item as done
    whole: set[int] = set()  # items shown whole (WholeItem)
    ended: dict[int, str] = {}  # hosted call -> its arguments when they were done
    cited: dict[int, list[tuple[int, JsonObject]]] = {}  # search index -> (message, citation)
    search = -1  # the latest good search's output_index
    for event in events:
        kind = event["type"]
        index = int(event.get("output_index", -1))
        if kind == "response.in_progress":
            ops.append("S")
        elif kind == "mlx.compaction.completed":
            ops[-1] = f"S{int(event['input_tokens_before'])}:{int(event['input_tokens_after'])}"
        elif kind in _DELTA_OPS:
            delta = str(event["delta"])
            streamed.setdefault(index, []).append(delta)
            token = f"{_DELTA_OPS[kind]}{len(delta)}"
            entries = event.get("logprobs") or []
            logprobs.setdefault(index, []).extend(entries)
            ops.append(f"{token}/{len(entries)}" if entries else token)
        elif kind == "response.output_item.added":
            item = opened[index] = event["item"]
            if is_whole(item):
                whole.add(index)
                ops.append("W")
            elif item["type"] in _BEGIN_OPS:
                ops.append(_BEGIN_OPS[item["type"]])
        elif kind == "response.output_item.done":
            item = closed[index] = event["item"]
            if item["type"] == "mcp_approval_request" or (
                item["type"] == "function_call" and item["status"] == "completed"
            ):
                ops.append("E")
            if item["type"] == "web_search_call" and item["status"] == "completed":
                search = index if item["action"]["type"] == "search" else search
        elif index in whole:
            continue
        elif kind in ("response.web_search_call.searching", "response.mcp_call_arguments.done"):
            ended[index] = str(event.get("arguments", ""))
            ops.append("E")
        elif kind in _HOSTED_DONE:
            ops.append("H")
        elif kind == "response.output_text.annotation.added":
            cited.setdefault(search, []).append((index, event["annotation"]))
        elif kind in _TERMINAL_OPS:
            ops.append(_TERMINAL_OPS[kind])
    tape: JsonObject = {"v": FORMAT, "ops": ",".join(ops)}
    lit = _literals(final["output"], opened, closed, streamed, logprobs, whole)
    for index, arguments in ended.items():  # a hosted call abandoned while it ran
        lit.get(str(index), {}).setdefault("args", arguments)
    if lit:
        tape["lit"] = lit
    src = known_sources(closed, cited)
    if src:
        tape["src"] = src
    if any(
        item["type"] == "web_search_call" and "sources" in item["action"]
        for item in closed.values()
    ):
        tape["si"] = True  # the request included the sources
    return tape


def _literals(
    output: list[JsonObject],
    opened: Mapping[int, JsonObject],
    closed: Mapping[int, JsonObject],
    streamed: Mapping[int, list[str]],
    logprobs: Mapping[int, list[JsonObject]],
    whole: set[int],
) -> JsonObject:
    lit: JsonObject = {}
    for index, item in opened.items():
        held = output[index] if index < len(output) else None
        if index in whole and (held is None or held["id"] != item["id"]) and index in closed:
            lit[str(index)] = {"id": item["id"], "done": closed[index]}  # background, running
        if item["type"] == "compaction" or index in whole:
            continue
        text = "".join(streamed.get(index, ()))
        if held is not None and held["id"] == item["id"] and _source(held).startswith(text):
            continue
        literal = lit[str(index)] = {
            "id": item["id"],
            "type": item["type"],
            "name": item.get("name", ""),
            "call_id": item.get("call_id", ""),
            "server_label": item.get("server_label", ""),
            "text": text,
            # Event-shaped entries lack ``bytes``: take the part's from its ``.done`` when it
            # was closed; an abandoned item never shows a part, so empty bytes do.
            "lp": (
                _source_logprobs(closed[index])
                if index in closed
                else [_part_shaped(entry) for entry in logprobs.get(index, ())]
            ),
        }
        if index in closed and item["type"] in _ARGUMENT_ITEMS:
            literal["args"] = closed[index]["arguments"]
        if index in closed and item["type"] in ("web_search_call", "mcp_call"):
            literal["done"] = closed[index]
    return lit


def _part_shaped(entry: Mapping[str, Any]) -> JsonObject:
    return {
        "token": entry["token"],
        "logprob": entry["logprob"],
        "bytes": [],
        "top_logprobs": [
            {"token": top["token"], "logprob": top["logprob"], "bytes": []}
            for top in entry["top_logprobs"]
        ],
    }


def _source(item: Mapping[str, Any]) -> str:
    """The text an item's deltas stream: message or reasoning text, or call arguments."""
    if item["type"] in _ARGUMENT_ITEMS:
        return str(item["arguments"])
    if item["type"] == "web_search_call":
        return ""  # a web search's arguments stream no events
    return str(item["content"][0]["text"]) if item["content"] else ""


def _source_logprobs(item: Mapping[str, Any]) -> list[JsonObject]:
    if item["type"] != "message" or not item["content"]:
        return []
    return list(item["content"][0].get("logprobs") or [])


def _usage(final: JsonObject) -> Usage | None:
    usage = final.get("usage")
    if usage is None:
        return None
    return Usage(
        input_tokens=int(usage["input_tokens"]),
        output_tokens=int(usage["output_tokens"]),
        cached_tokens=int(usage["input_tokens_details"]["cached_tokens"]),
        reasoning_tokens=int(usage["output_tokens_details"]["reasoning_tokens"]),
    )


class _Items:
    """Where the decoder reads each output item's id, name, text and logprobs from."""

    def __init__(
        self,
        final: JsonObject,
        lit: Mapping[str, JsonObject],
        src: Mapping[str, Sequence[Sequence[str]]],
    ) -> None:
        self._output: list[JsonObject] = final["output"]
        self._lit = lit
        self._src = src
        # output_index -> (text, logprobs, [text cursor, logprobs cursor])
        self._sources: dict[int, tuple[str, list[JsonObject], list[int]]] = {}

    def literal(self, index: int) -> JsonObject | None:
        return self._lit.get(str(index))

    def held(self, index: int) -> JsonObject:
        return self._output[index]

    def done(self, index: int) -> JsonObject:
        """The item as it was done: held, or literal where the final object does not hold it
        (a background response's object before its end)."""
        lit = self.literal(index)
        return lit["done"] if lit is not None and "done" in lit else self.held(index)

    def sources(self, index: int) -> Sequence[Sequence[str]]:
        return self._src.get(str(index), ())

    def meta(self, index: int, key: str) -> str:
        lit = self.literal(index)
        return str(lit[key]) if lit is not None and key in lit else str(self.held(index)[key])

    def take(self, index: int, chars: int, entries: int) -> tuple[str, list[JsonObject]]:
        source = self._sources.get(index)
        if source is None:
            lit = self.literal(index)
            if lit is not None:
                source = self._sources[index] = (str(lit["text"]), list(lit["lp"]), [0, 0])
            else:
                item = self.held(index)
                source = self._sources[index] = (_source(item), _source_logprobs(item), [0, 0])
        text, lps, cursor = source
        at, lp_at = cursor
        if at + chars > len(text) or lp_at + entries > len(lps) or chars <= 0:
            raise ValueError("the tape runs past the item's text")
        cursor[0], cursor[1] = at + chars, lp_at + entries
        return text[at : at + chars], lps[lp_at : lp_at + entries] if entries else []


def expand_events(final: JsonObject, tape: JsonObject) -> list[JsonObject]:
    """The events ``compact_events`` compacted, rebuilt: new event dicts each call, whose
    snapshots share the final object's unchanging values (tools, metadata, ...)."""
    if tape.get("v") != FORMAT:
        raise ValueError(f"unknown replay tape format {tape.get('v')!r}")
    items = _Items(final, tape.get("lit") or {}, tape.get("src") or {})
    compacted = any(item.get("type") == "compaction" for item in final["output"][:1])
    first = 1 if compacted else 0
    state = {"next": first, "open": -1}

    def mint(_prefix: str) -> str:
        index = state["next"]
        state["next"] += 1
        return items.meta(index, "id")

    config = ResponseConfig(
        model=str(final["model"]),
        background=final.get("background") is True,
        background_key="background" in final,
        sources_included=tape.get("si") is True,
    )
    machine = ResponseMachine(str(final["id"]), config, int(final["created_at"]), id_factory=mint)
    events: list[JsonObject] = []
    ops = str(tape["ops"])
    tokens = ops.split(",") if ops else []
    at = 0
    while at < len(tokens):
        token = tokens[at]
        op = token[0]
        end = at + 1
        if op in _RUN_OPS and "/" not in token:
            while end < len(tokens) and tokens[end][0] == op and "/" not in tokens[end]:
                end += 1
        if end - at > 1:
            events += _delta_run(op, tokens[at:end], machine, items, state)
        else:
            for step in _inputs(token, final, machine, items, state):
                events += machine.feed(step)
        at = end
    for number, event in enumerate(events):
        event["sequence_number"] = number
    static = {key: value for key, value in final.items() if key not in DYNAMIC}
    for event in events:
        snapshot = event.get("response")
        if snapshot is not None:
            event["response"] = {
                key: (snapshot[key] if key in DYNAMIC else static[key]) for key in final
            }
    return events


_RUN_OPS: Final = frozenset("TRA")


def _delta_run(
    op: str, tokens: list[str], machine: ResponseMachine, items: _Items, state: dict[str, int]
) -> list[JsonObject]:
    """A run of plain deltas of one kind on one item, fed to the machine as one input (the
    same state, text and item as feeding them one by one), its one delta event then cut back
    into the run's events; ``expand_events`` renumbers the sequence afterwards."""
    if op != "A" and machine.state is not (State.IN_MESSAGE if op == "T" else State.IN_REASONING):
        state["open"] = state["next"]  # the run's first delta opens the next item
    pieces = [items.take(state["open"], int(token[1:]), 0)[0] for token in tokens]
    joined = "".join(pieces)
    step: MachineInput
    if op == "T":
        step = TextDelta(joined)
    elif op == "R":
        step = ReasoningDelta(joined)
    else:
        step = ToolCallArgs(joined)
    produced = machine.feed(step)
    template = produced.pop()
    if template.get("delta") != joined:
        raise ValueError("a delta run did not end in its delta event")
    messages = "logprobs" in template  # text deltas carry their (here empty) logprobs
    for piece in pieces:
        event = {**template, "delta": piece}
        if messages:
            event["logprobs"] = []
        produced.append(event)
    return produced


def _inputs(
    token: str,
    final: JsonObject,
    machine: ResponseMachine,
    items: _Items,
    state: dict[str, int],
) -> Iterator[MachineInput]:
    op, arg = token[:1], token[1:]
    match op:
        case "S":
            if arg:
                before, after = (int(n) for n in arg.split(":"))
                yield Start(Compacted(dict(final["output"][0]), before, after))
            else:
                yield Start()
        case "T" | "R":
            chars, _, entries = arg.partition("/")
            wanted = State.IN_MESSAGE if op == "T" else State.IN_REASONING
            if machine.state is not wanted:
                state["open"] = state["next"]  # this delta opens the next item
            text, lps = items.take(state["open"], int(chars), int(entries or 0))
            yield TextDelta(text, lps) if op == "T" else ReasoningDelta(text)
        case "B" if arg:
            index = state["open"] = state["next"]
            hosted = _HOSTED_BEGINS[token]
            label = items.meta(index, "server_label") if hosted.kind == "mcp" else ""
            name = items.meta(index, "name") if hosted.kind == "mcp" else "web_search"
            yield ToolCallBegin(name, hosted=HostedCall(hosted.kind, label, hosted.approval))
        case "B":
            index = state["open"] = state["next"]
            yield ToolCallBegin(items.meta(index, "name"), items.meta(index, "call_id"))
        case "A":
            text, _ = items.take(state["open"], int(arg), 0)
            yield ToolCallArgs(text)
        case "E":
            lit = items.literal(state["open"])
            item = items.done(state["open"]) if lit is None or "done" in lit else None
            if item is not None and item["type"] == "web_search_call":
                yield ToolCallEnd(search_arguments(item["action"]))
            elif lit is not None:
                # an abandoned search shows no action: any arguments give its events
                yield ToolCallEnd(str(lit.get("args", "")))
            else:
                yield ToolCallEnd(str(items.held(state["open"])["arguments"]))
        case "H":
            held = items.done(state["open"])
            ok = held["status"] == "completed"
            if held["type"] == "web_search_call":
                found = items.sources(state["open"])
                yield HostedResult(ok, tuple((str(url), str(title)) for url, title in found))
            else:
                yield HostedResult(ok, output=held["output"], error=held["error"])
        case "W":
            index = state["next"]
            state["next"] += 1  # the item keeps its own id: nothing is minted for it
            yield WholeItem(items.done(index))
        case "F" | "L":
            usage = _usage(final)
            if usage is None:
                raise ValueError("a finished response without usage")
            yield Finish("stop" if op == "F" else "length", usage, int(final["completed_at"] or 0))
        case "X":
            error = final["error"]
            yield Fail(error["code"], str(error["message"]), _usage(final))
        case "C":
            yield Cancel(_usage(final))
        case _:
            raise ValueError(f"unknown replay op {token!r}")
