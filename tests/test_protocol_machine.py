"""The response event machine, over every (state, input) and over random input sequences.

An independent oracle (`_Oracle`) restates which inputs are legal and which output items they
produce; the machine must agree with it exactly, refuse illegal inputs without changing anything,
and every stream it produces must pass the strict conformance checks of tests/conformance.py.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

import pydantic
import pytest
from hypothesis import event as note_event
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses.response_output_text import Logprob

from mlx_responses.protocol.events.machine import (
    Cancel,
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
from mlx_responses.protocol.ids import new_id
from mlx_responses.protocol.objects import (
    ResponseConfig,
    ResponseErrorCode,
    Usage,
    mcp_call_item,
    mcp_list_tools_item,
)
from mlx_responses.protocol.tools.citations import url_citations
from tests.conformance import (
    TERMINAL_EVENT_TYPES,
    assert_stream_invariants,
    assert_strict_event,
    assert_strict_response,
    unknown_keys,
)

CREATED_AT = 1_700_000_000

# Text a model can produce: any Unicode scalar value (lone surrogates cannot be UTF-8 encoded).
texts = st.text(st.characters(codec="utf-8"), max_size=12)
nonempty_texts = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
usages = st.builds(
    lambda i, o, c, r: Usage(i + c, o + r, cached_tokens=c, reasoning_tokens=r),
    *(st.integers(0, 10_000) for _ in range(4)),
)
terminals: st.SearchStrategy[MachineInput] = st.one_of(
    st.builds(Finish, st.sampled_from(["stop", "length"]), usages, st.integers(0, 2**31)),
    st.builds(Fail, st.sampled_from(get_args(ResponseErrorCode)), texts, st.none() | usages),
    st.builds(Cancel, st.none() | usages),
)

# Logprob entries in the content part's shape (the machine's input); a few broken ones too.
_top_logprobs = st.builds(
    lambda token, logprob: {"token": token, "bytes": list(token.encode()), "logprob": logprob},
    texts,
    st.floats(-50, 0),
)
logprob_entries = st.builds(
    lambda token, logprob, top: {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode()),
        "top_logprobs": top,
    },
    texts,
    st.floats(-50, 0) | st.integers(-50, 0),
    st.lists(_top_logprobs, max_size=2),
)
_GOOD_ENTRY: dict[str, Any] = {"token": "a", "logprob": -1.0, "bytes": [97], "top_logprobs": []}
BAD_LOGPROBS: list[dict[str, Any]] = [
    {k: v for k, v in _GOOD_ENTRY.items() if k != "bytes"},
    {**_GOOD_ENTRY, "logprob": float("nan")},
    {**_GOOD_ENTRY, "logprob": float("-inf")},
    {**_GOOD_ENTRY, "logprob": True},
    {**_GOOD_ENTRY, "extra": 1},
    {**_GOOD_ENTRY, "bytes": [256]},
    {**_GOOD_ENTRY, "top_logprobs": [{"token": "a", "logprob": -1.0}]},
]
# Text that cites the sources of hosted_results below, by marker and by URL.
citing_texts = st.sampled_from(["see [1]", " [2]", " https://a.org/x.", "[3] and https://b.org"])
text_deltas = st.one_of(
    st.builds(TextDelta, texts),
    st.builds(TextDelta, citing_texts),
    st.builds(TextDelta, nonempty_texts, st.lists(logprob_entries, min_size=1, max_size=2)),
)
reasoning_deltas = st.builds(ReasoningDelta, texts)
call_names = st.sampled_from(["get_weather", "f", "a.b"])
call_ids = st.none() | st.sampled_from(["call_given", "toolu_01"])
call_begins = st.builds(ToolCallBegin, call_names, call_ids)
call_args = st.builds(ToolCallArgs, st.text(max_size=6))
hosted_calls = st.sampled_from(
    [HostedCall("web_search"), HostedCall("mcp", "deepwiki"), HostedCall("mcp", "s", approval=True)]
)
hosted_begins = st.builds(
    lambda name, hosted: ToolCallBegin(name, hosted=hosted), call_names, hosted_calls
)
search_arguments = st.sampled_from(
    ['{"query": "paris"}', '{"url": "https://a.org/x"}', '{"url": "u", "pattern": "p"}', "", "["]
)
_MCP_ERRORS: list[dict[str, Any] | str] = [
    "refused by the host allow-list",
    {"type": "http_error", "code": 500, "message": "boom"},
    {"type": "mcp_protocol_error", "code": -32602, "message": "bad params"},
    {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": "no city"}]},
]
hosted_results = st.builds(
    HostedResult,
    st.booleans(),
    st.sampled_from([(), (("https://a.org/x", "A"),), (("https://a.org/x", "A"), ("", "?"))])
    | st.just((("https://a.org/x", "A"), ("https://b.org", "B"), ("https://c.org", "C"))),
    st.none() | texts,
    st.none() | st.sampled_from(_MCP_ERRORS),
)
_TOOLS = [{"name": "add", "input_schema": {"type": "object"}, "description": None}]
whole_items = st.sampled_from(
    [
        WholeItem(mcp_list_tools_item("mcpl_1", server_label="s", tools=_TOOLS)),
        WholeItem(mcp_list_tools_item("mcpl_2", server_label="s", tools=[], error="refused")),
        WholeItem(
            mcp_call_item(
                "mcp_w1",
                server_label="s",
                name="add",
                arguments='{"a": 1}',
                status="completed",
                output="2",
                approval_request_id="mcpr_1",
            )
        ),
        WholeItem(
            mcp_call_item(
                "mcp_w2",
                server_label="s",
                name="add",
                arguments="{}",
                status="failed",
                error={"type": "http_error", "code": 401, "message": "unauthorized"},
                approval_request_id="mcpr_2",
            )
        ),
    ]
)


@dataclass(frozen=True)
class EndExtending:
    """Stands for ``ToolCallEnd(streamed + rest)``: the test fills in the arguments streamed so
    far when it feeds it, as a producer whose final parse agrees with its stream does."""

    rest: str


Step = MachineInput | EndExtending
call_ends: st.SearchStrategy[Step] = st.one_of(
    st.builds(EndExtending, st.text(max_size=6)),
    st.builds(EndExtending, st.text(max_size=6)),
    st.builds(EndExtending, st.text(max_size=6)),
    st.builds(ToolCallEnd, st.text(max_size=6)),  # usually disowns what was streamed
)
malformed: st.SearchStrategy[MachineInput] = st.one_of(
    st.builds(TextDelta, st.just(""), st.lists(logprob_entries, min_size=1, max_size=1)),
    st.builds(TextDelta, nonempty_texts, st.sampled_from(BAD_LOGPROBS).map(lambda e: [e])),
    st.builds(ToolCallBegin, st.just(""), call_ids),
    st.builds(ToolCallBegin, call_names, st.just("")),
    st.sampled_from(
        [
            ToolCallBegin("", hosted=HostedCall("web_search")),
            ToolCallBegin("f", "call_given", hosted=HostedCall("web_search")),
            ToolCallBegin("f", custom=True, hosted=HostedCall("mcp", "s")),
            ToolCallBegin("f", hosted=HostedCall("mcp")),  # no server label
            ToolCallBegin("f", hosted=HostedCall("web_search", "s")),
            ToolCallBegin("f", hosted=HostedCall("web_search", approval=True)),
            WholeItem({"type": "message", "id": "msg_x"}),
            WholeItem({"type": "mcp_list_tools"}),
        ]
    ),
)
inputs: st.SearchStrategy[Step] = st.one_of(
    st.just(Start()),
    text_deltas,
    text_deltas,
    reasoning_deltas,
    call_begins,
    call_args,
    call_ends,
    hosted_begins,
    search_arguments.map(ToolCallEnd),
    hosted_results,
    whole_items,
    terminals,
    malformed,
)
configs = st.builds(
    ResponseConfig,
    model=st.sampled_from(["tiny", "mlx-community/Qwen3-0.6B-4bit"]),
    instructions=st.none() | texts,
    max_output_tokens=st.none() | st.integers(1, 4096),
    temperature=st.none() | st.floats(0, 2),
    top_p=st.none() | st.floats(0, 1),
    store=st.booleans(),
    metadata=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    background=st.booleans(),
    previous_response_id=st.none() | st.just(new_id("resp")),
    sources_included=st.booleans(),
)
# Mostly-legal sequences reach deep states; fully random ones probe every refusal.
segments: st.SearchStrategy[list[Step]] = st.one_of(
    st.lists(reasoning_deltas, min_size=1, max_size=4),
    st.lists(text_deltas, min_size=1, max_size=4),
    st.builds(
        lambda begin, args, end: [begin, *args, end],
        call_begins,
        st.lists(call_args, max_size=4),
        call_ends,
    ),
    st.builds(
        lambda begin, args, end, result: [begin, *args, end, result],
        hosted_begins,
        st.lists(call_args, max_size=3),
        call_ends | search_arguments.map(ToolCallEnd),
        hosted_results,
    ),
    whole_items.map(lambda item: [item]),
)
well_formed = st.builds(
    lambda parts, open_call, end, tail: [Start(), *itertools.chain(*parts), *open_call, end, *tail],
    st.lists(segments, max_size=5),
    st.just([])
    | st.builds(lambda b, a: [b, *a], call_begins | hosted_begins, st.lists(call_args, max_size=3))
    | st.builds(lambda b, e: [b, e], hosted_begins, search_arguments.map(ToolCallEnd)),
    terminals,
    st.lists(inputs, max_size=3),
)
_sequence_kinds: list[st.SearchStrategy[list[Step]]] = [
    st.lists(inputs, max_size=30),
    st.lists(inputs, max_size=30).map(lambda rest: [Start(), *rest]),
    well_formed,
]
sequences = st.sampled_from([0, 1, 2, 2, 2, 2]).flatmap(lambda kind: _sequence_kinds[kind])


def _valid_logprob(entry: dict[str, Any]) -> bool:
    """Restated with the SDK's own part-logprob model, strictly, as JSON."""
    try:
        model = Logprob.model_validate_json(json.dumps(entry, allow_nan=False), strict=True)
    except (ValueError, pydantic.ValidationError):
        return False
    byte_lists = [entry["bytes"], *(top["bytes"] for top in entry["top_logprobs"])]
    return not unknown_keys(model) and all(0 <= b < 256 for raw in byte_lists for b in raw)


ItemType = Literal[
    "message",
    "reasoning",
    "function_call",
    "web_search_call",
    "mcp_call",
    "mcp_approval_request",
    "mcp_list_tools",
]
_CALL_TYPES = ("function_call", "web_search_call", "mcp_call", "mcp_approval_request")
"""Open items that take ToolCallArgs / ToolCallEnd and nothing else between them."""
_HOSTED_TYPE = {"web_search": "web_search_call", "mcp": "mcp_call"}


def _expected_action(arguments: str) -> dict[str, Any]:
    """A web search's action from its arguments, restated."""
    try:
        given = json.loads(arguments)
    except ValueError:
        given = {}
    if not isinstance(given, dict):
        given = {}
    given = {k: v for k, v in given.items() if isinstance(v, str) and v}
    if {"url", "pattern"} <= set(given):
        return {"type": "find_in_page", "url": given["url"], "pattern": given["pattern"]}
    if "url" in given:
        return {"type": "open_page", "url": given["url"]}
    return {"type": "search", **({"query": given["query"]} if "query" in given else {})}


@dataclass
class _Item:
    """An output item as the oracle expects it."""

    type: ItemType
    text: str = ""  # message text, reasoning text, or call arguments (a whole item: its JSON)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    name: str = ""
    call_id: str | None = None
    status: str = "in_progress"
    server_label: str = ""
    result: Any = None  # a hosted call's action (web search) or (output, error) (MCP)
    annotations: list[dict[str, Any]] = field(default_factory=list)
    ended: bool = False  # a hosted call's ToolCallEnd came
    whole: bool = False  # given whole (WholeItem); ``text`` is its JSON


def _expected(item: _Item) -> _Item:
    """What the machine shows of an oracle item (a search shows its action, not arguments)."""
    if item.whole:
        return item
    match item.type:
        case "web_search_call":
            action = item.result
            if action is None:
                action = _expected_action(item.text) if item.ended else {"type": "search"}
            return _Item("web_search_call", status=item.status, result=action)
        case "mcp_call":
            result = (None, None) if item.result is None else item.result
            return replace(item, result=result, ended=False)
        case "mcp_approval_request":
            return replace(item, status="")  # it has no status
    return item


@dataclass
class _Oracle:
    """An independent restatement of the lifecycle and of the output items it yields."""

    started: bool = False
    ended: bool = False
    items: list[_Item] = field(default_factory=list)  # the last may be open
    open: ItemType | None = None
    running: bool = False  # the open hosted call's arguments are done; the server runs it
    streamed: list[str] = field(default_factory=list)  # all message text
    disowned: bool = False  # a ToolCallEnd disowned the streamed arguments
    mcp_disowned: bool = False  # ... of an mcp_call
    terminal: MachineInput | None = None
    sources_included: bool = False
    sources: tuple[tuple[str, str], ...] = ()  # the latest good search's

    def legal(self, inp: MachineInput) -> bool:
        if self.ended:
            return False
        between = self.started and self.open not in _CALL_TYPES
        match inp:
            case Start():
                return not self.started
            case TextDelta(text=text, logprobs=logprobs):
                well_formed = (bool(text) or not logprobs) and all(map(_valid_logprob, logprobs))
                return well_formed and between
            case ReasoningDelta() | Finish(reason="stop"):
                return between
            case ToolCallBegin(hosted=None, name=name, call_id=call_id):
                return name != "" and call_id != "" and between
            case ToolCallBegin(hosted=hosted, name=name) as begin:
                assert hosted is not None
                plain = begin.call_id is None and not begin.custom and bool(name)
                labelled = bool(hosted.server_label) == (hosted.kind == "mcp")
                asks = hosted.approval and hosted.kind != "mcp"
                return plain and labelled and not asks and between
            case ToolCallArgs() | ToolCallEnd():
                return self.open in _CALL_TYPES and not self.running
            case HostedResult():
                return self.running
            case WholeItem(item=item):
                whole = item.get("type") in ("mcp_list_tools", "mcp_call") and bool(item.get("id"))
                return whole and between
            case Finish(reason="length"):
                return self.started
            case Fail() | Cancel():
                return True
        raise AssertionError(inp)

    def _close(self, status: str) -> None:
        if self.open is not None:
            item = self.items[-1]
            item.status = status
            if item.type == "message" and self.sources:
                item.annotations = url_citations(item.text, self.sources)
            self.open = None
            self.running = False

    def _switch(self, type_: ItemType) -> _Item:
        if self.open != type_:
            self._close("completed")
            self.items.append(_Item(type_))
            self.open = type_
        return self.items[-1]

    def apply(self, inp: MachineInput) -> None:
        match inp:
            case Start():
                self.started = True
            case TextDelta(text=text, logprobs=logprobs) if text:
                item = self._switch("message")
                item.text += text
                item.logprobs += copy.deepcopy(list(logprobs))
                self.streamed.append(text)
            case ReasoningDelta(text=text) if text:
                self._switch("reasoning").text += text
            case ToolCallBegin(name=name, call_id=call_id, hosted=hosted):
                self._close("completed")
                type_: ItemType = "function_call"
                if hosted is not None:
                    approval = "mcp_approval_request"
                    type_ = approval if hosted.approval else _HOSTED_TYPE[hosted.kind]  # type: ignore[assignment]
                label = hosted.server_label if hosted is not None else ""
                self.items.append(_Item(type_, name=name, call_id=call_id, server_label=label))
                self.open = type_
            case ToolCallArgs(delta=delta):
                self.items[-1].text += delta
            case ToolCallEnd(arguments=arguments):
                disowned = not arguments.startswith(self.items[-1].text)
                if self.open == "function_call":  # the only deltas the shared check joins
                    self.disowned |= disowned
                elif self.open == "mcp_call":
                    self.mcp_disowned |= disowned
                self.items[-1].text = arguments
                if self.open in ("web_search_call", "mcp_call"):
                    self.running = self.items[-1].ended = True
                else:
                    self._close("completed")
            case HostedResult() as outcome:
                self._result(outcome)
            case WholeItem(item=item):
                self._close("completed")
                status = item.get("status", "completed")
                whole = _Item(item["type"], json.dumps(item), status=status, whole=True)
                self.items.append(whole)
            case Finish(reason=reason):
                self._close("completed" if reason == "stop" else "incomplete")
            case Fail():
                if self.open is not None:
                    self.items.pop()  # abandoned, never presented as done
                    self.open = None
            case Cancel():
                self._close("incomplete")
        if isinstance(inp, Finish | Fail | Cancel):
            self.ended = True
            self.terminal = inp

    def _result(self, outcome: HostedResult) -> None:
        item = self.items[-1]
        if item.type == "web_search_call":
            action = _expected_action(item.text)
            if outcome.ok and action["type"] == "search":
                self.sources = outcome.sources
                if self.sources_included:
                    action["sources"] = [{"type": "url", "url": u} for u, _ in outcome.sources]
            item.result = action
        elif outcome.ok:
            item.result = (outcome.output, None)
        else:
            error = outcome.error or "the tool call failed"
            if isinstance(error, str):
                error = {
                    "type": "mcp_tool_execution_error",
                    "content": [{"type": "text", "text": error}],
                }
            item.result = (outcome.output, error)
        self._close("completed" if outcome.ok else "failed")

    def resolve(self, step: Step) -> MachineInput:
        if isinstance(step, EndExtending):
            streamed = self.items[-1].text if self.open in _CALL_TYPES else ""
            return ToolCallEnd(streamed + step.rest)
        return step


def _observed(item: dict[str, Any]) -> _Item:
    """Project a machine-made output item onto the oracle's view of it."""
    match item["type"]:
        case "message":
            (part,) = item["content"]
            return _Item(
                "message",
                part["text"],
                part["logprobs"],
                status=item["status"],
                annotations=part["annotations"],
            )
        case "reasoning":
            assert item["summary"] == []
            (part,) = item["content"]
            return _Item("reasoning", part["text"], status=item["status"])
        case "function_call":
            call_id = item["call_id"]
            given = call_id in ("call_given", "toolu_01")
            assert given or (call_id.startswith("call_") and len(call_id) > len("call_given"))
            return _Item(
                "function_call",
                item["arguments"],
                name=item["name"],
                call_id=call_id if given else None,  # None: minted by the machine
                status=item["status"],
            )
        case "web_search_call":
            assert item["id"].startswith("ws_")
            return _observed_search(item)
        case "mcp_call" if item["id"].startswith("mcp_w"):  # a WholeItem's own id
            return _Item("mcp_call", json.dumps(item), status=item["status"], whole=True)
        case "mcp_call":
            assert item["id"].startswith("mcp_")
            assert item["approval_request_id"] is None
            return _Item(
                "mcp_call",
                item["arguments"],
                name=item["name"],
                status=item["status"],
                server_label=item["server_label"],
                result=(item["output"], item["error"]),
            )
        case "mcp_approval_request":
            assert item["id"].startswith("mcpr_")
            return _Item(
                "mcp_approval_request",
                item["arguments"],
                name=item["name"],
                status="",
                server_label=item["server_label"],
            )
        case "mcp_list_tools":
            return _Item("mcp_list_tools", json.dumps(item), status="completed", whole=True)
    raise AssertionError(item)


def _observed_search(item: dict[str, Any]) -> _Item:
    return _Item("web_search_call", status=item["status"], result=item["action"])


def _expected_items(oracle: _Oracle) -> list[_Item]:
    return [_expected(item) for item in oracle.items]


def _fingerprint(machine: ResponseMachine) -> tuple[Any, ...]:
    return (
        machine.state,
        machine.status,
        machine.terminal,
        machine.next_sequence_number,
        machine.output_text,
        machine.has_tool_calls,
        machine.output_items,
        machine.snapshot(),
    )


@settings(max_examples=1000, deadline=None)
@given(config=configs, sequence=sequences)
def test_random_sequences_follow_the_grammar(config: ResponseConfig, sequence: list[Step]) -> None:
    machine = ResponseMachine("resp_" + "0" * 48, config, CREATED_AT)
    oracle = _Oracle(sources_included=config.sources_included)
    events: list[dict[str, Any]] = []
    for step in sequence:
        inp = oracle.resolve(step)
        before = _fingerprint(machine)
        if not oracle.legal(inp):
            with pytest.raises(ProtocolError):
                machine.feed(inp)
            assert _fingerprint(machine) == before, f"refused {inp!r} but changed the machine"
            continue
        new = machine.feed(inp)
        oracle.apply(inp)
        assert [e["sequence_number"] for e in new] == list(range(before[3], before[3] + len(new)))
        if isinstance(inp, TextDelta | ReasoningDelta) and not inp.text:
            assert new == []
        if isinstance(inp, ToolCallArgs) and not inp.delta:
            assert new == []
        for event in new:
            assert_strict_event(event)
        events.extend(new)

    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert machine.next_sequence_number == len(events)
    assert machine.output_text == "".join(oracle.streamed)
    assert machine.terminal == oracle.ended
    closed = [item for item in oracle.items if item.status != "in_progress"]
    assert [_observed(item) for item in machine.output_items] == list(map(_expected, closed))
    assert machine.has_tool_calls == any(item.type == "function_call" for item in oracle.items)
    snapshot = machine.snapshot()
    note_event(f"ended {machine.state.value}")
    note_event(f"output item types: {sorted({item.type for item in oracle.items})}")
    assert_strict_response(snapshot)
    assert ("background" in snapshot) == config.background
    if events:
        assert events[0]["type"] == "response.created"
    if not oracle.ended:
        assert not any(e["type"] in TERMINAL_EVENT_TYPES for e in events)
        if config.background:  # a poll never sees partial output (spec 000)
            assert snapshot["output"] == []
            assert snapshot["usage"]["total_tokens"] == 0
        else:  # the open item shows, in progress
            assert [_observed(item) for item in snapshot["output"]] == _expected_items(oracle)
        return

    stream = [(e["type"], e) for e in events]
    if oracle.disowned:
        # Documented: `.done` carries the authoritative arguments, so the deltas do not join.
        note_event("arguments disowned")
        with pytest.raises(AssertionError, match="arguments"):
            _stream_invariants(stream)
        final = snapshot
    else:
        final = _stream_invariants(stream)
    assert final == snapshot
    _check_hosted_events(events, joined=not oracle.mcp_disowned)
    _check_annotations(events, final)
    assert [_observed(item) for item in final["output"]] == _expected_items(oracle)
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == machine.output_text
    _check_terminal(final, oracle)


_FAILED_ITEMS = ("web_search_call", "mcp_call")


def _stream_invariants(stream: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """``assert_stream_invariants``, with a hosted call's ``failed`` status (the SDK allows it
    on web_search_call and mcp_call) read as ``completed``, which the shared check expects of
    every done item; returns the final object as sent."""
    shown = copy.deepcopy(stream)
    for _, event in shown:
        items = [event["item"]] if "item" in event else []
        items += event["response"]["output"] if "response" in event else []
        for item in items:
            if item["type"] in _FAILED_ITEMS and item["status"] == "failed":
                item["status"] = "completed"
    assert_stream_invariants(shown)
    return dict(stream[-1][1]["response"])


_HOSTED_GRAMMAR = {
    "web_search_call": r"A I(S(C)?)? D",
    "mcp_call": r"A I(Δ)*(Ω(C|F)?)? D",
}
_HOSTED_LETTERS = {
    "response.output_item.added": "A",
    "response.output_item.done": " D",
    "response.web_search_call.in_progress": " I",
    "response.web_search_call.searching": "S",
    "response.web_search_call.completed": "C",
    "response.mcp_call.in_progress": " I",
    "response.mcp_call_arguments.delta": "Δ",
    "response.mcp_call_arguments.done": "Ω",
    "response.mcp_call.completed": "C",
    "response.mcp_call.failed": "F",
    "response.mcp_list_tools.in_progress": " I",
    "response.mcp_list_tools.completed": "C",
    "response.mcp_list_tools.failed": "F",
}


def _check_hosted_events(events: list[dict[str, Any]], *, joined: bool) -> None:
    """Each hosted item's events, in order, follow its grammar (hosted_items.py), and how it
    ended agrees with its done status; an mcp_call's arguments.done and item carry the same
    arguments, which its deltas join to (``joined``: none was disowned)."""
    by_index: dict[int, list[dict[str, Any]]] = {}
    for event in events:
        if "output_index" in event:
            by_index.setdefault(event["output_index"], []).append(event)
    for own in by_index.values():
        item = own[-1].get("item")
        if item is None or own[-1]["type"] != "response.output_item.done":
            continue
        word = "".join(_HOSTED_LETTERS.get(e["type"], "?") for e in own)
        whole = item["id"].startswith(("mcp_w", "mcpl_"))
        if item["type"] == "mcp_list_tools":
            assert word == ("A IF D" if "error" in item else "A IC D"), word
        elif item["type"] == "mcp_call" and whole:
            assert word == ("A IΩF D" if item["status"] == "failed" else "A IΩC D"), word
        elif item["type"] in _HOSTED_GRAMMAR:
            assert re.fullmatch(_HOSTED_GRAMMAR[item["type"]], word), (item["type"], word)
            ended = {"C": item["status"] == "completed", "F": item["status"] == "failed"}
            if item["type"] == "web_search_call":  # one event for both: the status says
                ended = {"C": item["status"] in ("completed", "failed"), "F": False}
            for letter, expected in ended.items():
                assert (letter in word) == expected, (item, word)
            if "Ω" in word:
                (done,) = [e for e in own if e["type"] == "response.mcp_call_arguments.done"]
                deltas = [e["delta"] for e in own if e["type"].endswith("arguments.delta")]
                assert done["arguments"] == item["arguments"]
                assert not joined or "".join(deltas) == done["arguments"]
        elif item["type"] == "mcp_approval_request":
            assert word == "A D", word


def _check_annotations(events: list[dict[str, Any]], final: dict[str, Any]) -> None:
    """Each message's annotation.added events come before its output_text.done, numbered from
    0, and are its part's annotations; each cites its text to its marker or URL."""
    added: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        if event["type"] == "response.output_text.annotation.added":
            added.setdefault(event["item_id"], []).append(event)
        elif event["type"] == "response.output_text.done":
            for mine in added.get(event["item_id"], []):
                assert mine["sequence_number"] < event["sequence_number"]
    for item in final["output"]:
        if item["type"] != "message":
            continue
        (part,) = item["content"]
        mine = added.pop(item["id"], [])
        assert [e["annotation_index"] for e in mine] == list(range(len(mine)))
        assert [e["annotation"] for e in mine] == part["annotations"]
        for note in part["annotations"]:
            span = part["text"][note["start_index"] : note["end_index"]]
            assert span == note["url"] or re.fullmatch(r"\[[0-9]+\]", span), (span, note)
    assert not added, f"annotations on no final message: {added}"


def _check_terminal(final: dict[str, Any], oracle: _Oracle) -> None:
    statuses = {item.get("status", "completed") for item in final["output"]}
    match oracle.terminal:
        case Finish(reason="stop", usage=usage, completed_at=completed_at):
            assert final["status"] == "completed"
            assert final["completed_at"] == completed_at
            assert final["incomplete_details"] is None
            assert final["usage"] == usage.to_json()
            assert statuses <= {"completed", "failed"}
        case Finish(reason="length", usage=usage):
            assert final["status"] == "incomplete"
            assert final["incomplete_details"] == {"reason": "max_output_tokens"}
            assert final["completed_at"] is None
            assert final["usage"] == usage.to_json()
        case Fail(code=code, message=message, usage=usage):
            assert final["status"] == "failed"
            assert final["error"] == {"code": code, "message": message}
            assert statuses <= {"completed", "failed"}  # only items closed before the failure
            assert final["usage"] == (None if usage is None else usage.to_json())
        case Cancel(usage=usage):
            assert final["status"] == "cancelled"
            assert final["usage"] == (None if usage is None else usage.to_json())
        case _:
            raise AssertionError(oracle.terminal)
    # Only the item open at the end can be incomplete; no empty item is ever invented.
    done = ("completed", "failed")
    assert all(item.get("status", "completed") in done for item in final["output"][:-1])
    for item in final["output"]:
        if item["type"] in ("message", "reasoning"):
            assert item["content"][0]["text"] != ""


# --- Every (state, input) pair, exhaustively -------------------------------------------------

_PATHS: dict[State, list[MachineInput]] = {
    State.QUEUED: [],
    State.IN_PROGRESS: [Start()],
    State.IN_MESSAGE: [Start(), TextDelta("a")],
    State.IN_REASONING: [Start(), ReasoningDelta("r")],
    State.IN_TOOL_CALL: [Start(), ToolCallBegin("f"), ToolCallArgs("{")],
    State.IN_HOSTED_CALL: [Start(), ToolCallBegin("add", hosted=HostedCall("mcp", "s"))],
    State.HOSTED_RUNNING: [
        Start(),
        ToolCallBegin("web_search", hosted=HostedCall("web_search")),
        ToolCallEnd('{"query": "q"}'),
    ],
    State.COMPLETED: [Start(), Finish("stop", Usage(1, 0), 2)],
    State.INCOMPLETE: [Start(), TextDelta("a"), Finish("length", Usage(1, 1), 2)],
    State.FAILED: [Fail("server_error", "boom", None)],
    State.CANCELLED: [Start(), Cancel(None)],
}
_INPUTS: dict[str, MachineInput] = {
    "start": Start(),
    "delta": TextDelta("x"),
    "empty": TextDelta(""),
    "delta with logprobs": TextDelta("x", [_GOOD_ENTRY]),
    "reasoning": ReasoningDelta("r"),
    "empty reasoning": ReasoningDelta(""),
    "call": ToolCallBegin("f"),
    "call with id": ToolCallBegin("f", "call_given"),
    "args": ToolCallArgs('"a"'),
    "empty args": ToolCallArgs(""),
    "end": ToolCallEnd("{}"),
    "stop": Finish("stop", Usage(1, 1), 3),
    "length": Finish("length", Usage(1, 1), 3),
    "fail": Fail("invalid_prompt", "no", Usage(1, 0)),
    "cancel": Cancel(None),
    "steered": Finish("steered", Usage(1, 1), 3),
    "search": ToolCallBegin("web_search", hosted=HostedCall("web_search")),
    "mcp call": ToolCallBegin("add", hosted=HostedCall("mcp", "s")),
    "approval": ToolCallBegin("add", hosted=HostedCall("mcp", "s", approval=True)),
    "result": HostedResult(True, (("https://a.org", "A"),)),
    "failed result": HostedResult(False, error={"type": "http_error", "code": 500, "message": "x"}),
    "whole list": WholeItem(mcp_list_tools_item("mcpl_1", server_label="s", tools=_TOOLS)),
    # Malformed in every state:
    "logprobs without text": TextDelta("", [_GOOD_ENTRY]),
    **{f"bad logprob {i}": TextDelta("x", [bad]) for i, bad in enumerate(BAD_LOGPROBS)},
    "nameless call": ToolCallBegin(""),
    "empty call id": ToolCallBegin("f", ""),
    "unknown finish": Finish("eos", Usage(1, 1), 0),  # type: ignore[arg-type]
    "unknown error code": Fail("server_overloaded", "full", None),  # type: ignore[arg-type]
    "labelled search": ToolCallBegin("web_search", hosted=HostedCall("web_search", "s")),
    "unlabelled mcp": ToolCallBegin("add", hosted=HostedCall("mcp")),
    "hosted with call id": ToolCallBegin("add", "call_given", hosted=HostedCall("mcp", "s")),
    "whole message": WholeItem({"type": "message", "id": "msg_1"}),
}
_BETWEEN_CALLS = {
    "delta",
    "empty",
    "delta with logprobs",
    "reasoning",
    "empty reasoning",
    "call",
    "call with id",
    "stop",
    "length",
    "steered",
    "fail",
    "cancel",
    "search",
    "mcp call",
    "approval",
    "whole list",
}
_LEGAL: dict[State, set[str]] = {
    State.QUEUED: {"start", "fail", "cancel"},
    State.IN_PROGRESS: _BETWEEN_CALLS,
    State.IN_MESSAGE: _BETWEEN_CALLS,
    State.IN_REASONING: _BETWEEN_CALLS,
    State.IN_TOOL_CALL: {"args", "empty args", "end", "length", "steered", "fail", "cancel"},
    State.IN_HOSTED_CALL: {"args", "empty args", "end", "length", "steered", "fail", "cancel"},
    State.HOSTED_RUNNING: {"result", "failed result", "length", "steered", "fail", "cancel"},
    State.COMPLETED: set(),
    State.INCOMPLETE: set(),
    State.FAILED: set(),
    State.CANCELLED: set(),
}


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("name", list(_INPUTS))
def test_every_state_and_input(state: State, name: str) -> None:
    machine = ResponseMachine("resp_1", ResponseConfig(model="m"), CREATED_AT)
    for inp in _PATHS[state]:
        machine.feed(inp)
    assert machine.state is state
    before = _fingerprint(machine)
    if name in _LEGAL[state]:
        events = machine.feed(_INPUTS[name])
        assert machine.next_sequence_number == before[3] + len(events)
        for event in events:
            assert_strict_event(event)
    else:
        with pytest.raises(ProtocolError):
            machine.feed(_INPUTS[name])
        assert _fingerprint(machine) == before


# --- Exact streams for the common paths --------------------------------------------------------


def _ids(prefix: str) -> str:
    return f"{prefix}_fixed"


def _run(config: ResponseConfig, *inputs_: MachineInput) -> tuple[ResponseMachine, list[Any]]:
    machine = ResponseMachine("resp_1", config, CREATED_AT, id_factory=_ids)
    events = [event for inp in inputs_ for event in machine.feed(inp)]
    return machine, events


def test_foreground_text_stream_matches_openai_order() -> None:
    machine, events = _run(
        ResponseConfig(model="m"),
        Start(),
        TextDelta("Hel"),
        TextDelta(""),
        TextDelta("lo"),
        Finish("stop", Usage(5, 2, cached_tokens=3), CREATED_AT + 1),
    )
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[0]["response"]["status"] == "in_progress"
    assert events[0]["response"]["usage"] is None
    assert "background" not in events[0]["response"]
    final = assert_stream_invariants([(e["type"], e) for e in events])
    assert final["output"] == [
        {
            "id": "msg_fixed",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}
            ],
        }
    ]
    assert final["usage"] == {
        "input_tokens": 5,
        "input_tokens_details": {"cached_tokens": 3, "cache_write_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 7,
    }
    assert final["completed_at"] == CREATED_AT + 1
    assert final["temperature"] == 1.0
    assert final["top_p"] == 1.0
    assert final["text"] == {"format": {"type": "text"}, "verbosity": "medium"}
    assert assert_strict_response(final).output_text == "Hello"
    assert machine.output_text == "Hello"


def test_snapshot_in_flight_shows_partial_text_in_foreground() -> None:
    machine, _ = _run(ResponseConfig(model="m"), Start(), TextDelta("par"))
    snap = machine.snapshot()
    assert snap["status"] == "in_progress"
    assert snap["output"][0]["status"] == "in_progress"
    assert snap["output"][0]["content"][0]["text"] == "par"
    assert_strict_response(snap)


def test_background_stream_is_queued_first_and_hides_partial_output() -> None:
    machine, events = _run(ResponseConfig(model="m", background=True), Start(), TextDelta("a"))
    assert [e["type"] for e in events[:3]] == [
        "response.created",
        "response.queued",
        "response.in_progress",
    ]
    assert events[0]["response"]["status"] == "queued"
    assert events[0]["response"]["background"] is True
    snap = machine.snapshot()
    assert snap["output"] == []
    assert snap["usage"]["total_tokens"] == 0
    machine.feed(Finish("stop", Usage(1, 1), CREATED_AT))
    assert machine.snapshot()["output"][0]["content"][0]["text"] == "a"


def test_cancel_while_queued_still_starts_with_created() -> None:
    _, events = _run(ResponseConfig(model="m", background=True), Cancel(None))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.queued",
        "response.cancelled",
    ]
    final = assert_stream_invariants([(e["type"], e) for e in events])
    assert final["status"] == "cancelled"
    assert final["output"] == []


def test_malformed_inputs_are_protocol_errors() -> None:
    machine = ResponseMachine("resp_1", ResponseConfig(model="m"), CREATED_AT)
    machine.feed(Start())
    with pytest.raises(ProtocolError):
        machine.feed(Finish("eos", Usage(1, 1), 0))  # type: ignore[arg-type]
    with pytest.raises(ProtocolError):
        machine.feed(Fail("server_overloaded", "full", None))  # type: ignore[arg-type]
    assert machine.next_sequence_number == 2


def test_events_and_snapshots_do_not_alias_machine_state() -> None:
    machine, events = _run(ResponseConfig(model="m"), Start(), TextDelta("a"))
    snapshot = machine.snapshot()
    pristine = copy.deepcopy(snapshot)
    snapshot["output"][0]["content"][0]["text"] = "mutated"
    events[2]["item"]["content"].append("junk")
    assert machine.snapshot() == pristine
    machine.feed(Finish("stop", Usage(1, 1), CREATED_AT))
    done = machine.snapshot()
    done["output"][0]["id"] = "mutated"
    assert machine.snapshot()["output"][0]["id"] == "msg_fixed"


# --- Reasoning, function calls and logprobs ----------------------------------------------------


def _counting_ids() -> Callable[[str], str]:
    counter = itertools.count()
    return lambda prefix: f"{prefix}_{next(counter)}"


def _run_counted(*inputs_: MachineInput) -> tuple[ResponseMachine, list[Any]]:
    config = ResponseConfig(model="m")
    machine = ResponseMachine("resp_1", config, CREATED_AT, id_factory=_counting_ids())
    return machine, [event for inp in inputs_ for event in machine.feed(inp)]


def _stop() -> Finish:
    return Finish("stop", Usage(5, 4, reasoning_tokens=2), CREATED_AT + 1)


def test_reasoning_comes_first_in_its_own_item() -> None:
    machine, events = _run_counted(
        Start(), ReasoningDelta("Let me "), ReasoningDelta("think."), TextDelta("Hi"), _stop()
    )
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[2]["item"] == {
        "id": "rs_0",
        "type": "reasoning",
        "summary": [],
        "content": [],
        "status": "in_progress",
    }
    assert events[3]["part"] == {"type": "reasoning_text", "text": ""}
    assert events[6]["text"] == "Let me think."
    final = assert_stream_invariants([(e["type"], e) for e in events])
    assert [item["id"] for item in final["output"]] == ["rs_0", "msg_1"]
    assert final["output"][0]["content"] == [{"type": "reasoning_text", "text": "Let me think."}]
    assert final["output"][0]["status"] == "completed"
    assert final["usage"]["output_tokens_details"] == {"reasoning_tokens": 2}
    assert assert_strict_response(final).output_text == "Hi"  # reasoning never leaks into it
    assert machine.output_text == "Hi"
    assert not machine.has_tool_calls


def test_tool_call_streams_arguments_and_gets_the_unsent_rest() -> None:
    machine, events = _run_counted(
        Start(),
        TextDelta("Checking."),
        ToolCallBegin("get_weather"),
        ToolCallArgs('{"city": '),
        ToolCallArgs(""),
        ToolCallEnd('{"city": "Paris"}'),
        ToolCallBegin("get_time", "call_given"),
        ToolCallEnd("{}"),
        _stop(),
    )
    assert [e["type"] for e in events[8:]] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    minted = events[8]["item"]
    assert minted == {
        "id": minted["id"],
        "type": "function_call",
        "call_id": minted["call_id"],
        "name": "get_weather",
        "arguments": "",
        "status": "in_progress",
    }
    assert minted["id"].startswith("fc_")
    assert minted["call_id"].startswith("call_")
    assert [e["delta"] for e in events[9:11]] == ['{"city": ', '"Paris"}']
    assert events[11] == {
        "type": "response.function_call_arguments.done",
        "sequence_number": 11,
        "item_id": minted["id"],
        "output_index": 1,
        "arguments": '{"city": "Paris"}',
    }
    final = assert_stream_invariants([(e["type"], e) for e in events])
    calls = final["output"][1:]
    assert [(c["call_id"], c["name"], c["arguments"], c["status"]) for c in calls] == [
        (minted["call_id"], "get_weather", '{"city": "Paris"}', "completed"),
        ("call_given", "get_time", "{}", "completed"),
    ]
    assert machine.has_tool_calls
    assert machine.output_items == final["output"]
    machine.output_items[0]["id"] = "mutated"  # a copy
    assert machine.output_items == final["output"]


def test_text_after_a_call_opens_a_new_message() -> None:
    _, events = _run_counted(
        Start(), TextDelta("a"), ToolCallBegin("f"), ToolCallEnd("{}"), TextDelta("b"), _stop()
    )
    final = assert_stream_invariants([(e["type"], e) for e in events])
    assert [item["type"] for item in final["output"]] == ["message", "function_call", "message"]
    assert final["output"][0]["id"] != final["output"][2]["id"]
    assert assert_strict_response(final).output_text == "ab"


def test_disowned_streamed_arguments_are_replaced_at_done() -> None:
    _, events = _run_counted(
        Start(), ToolCallBegin("f"), ToolCallArgs('{"x": 1'), ToolCallEnd('{"y": 2}'), _stop()
    )
    types = [e["type"] for e in events]
    assert types.count("response.function_call_arguments.delta") == 1  # no "rest" to send
    (done,) = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert done["arguments"] == '{"y": 2}'
    assert events[-1]["response"]["output"][0]["arguments"] == '{"y": 2}'
    with pytest.raises(AssertionError, match="arguments"):
        assert_stream_invariants([(e["type"], e) for e in events])


def test_length_stop_inside_a_call_closes_it_incomplete_with_what_streamed() -> None:
    machine, events = _run_counted(
        Start(),
        ToolCallBegin("f"),
        ToolCallArgs('{"q": "lon'),
        Finish("length", Usage(3, 3), CREATED_AT),
    )
    final = assert_stream_invariants([(e["type"], e) for e in events])
    assert final["status"] == "incomplete"
    (call,) = final["output"]
    assert (call["arguments"], call["status"]) == ('{"q": "lon', "incomplete")
    assert machine.has_tool_calls


def test_stop_inside_a_call_is_refused() -> None:
    machine, _ = _run_counted(Start(), ToolCallBegin("f"), ToolCallArgs("{"))
    with pytest.raises(ProtocolError, match="illegal in state in_tool_call"):
        machine.feed(_stop())
    with pytest.raises(ProtocolError):
        machine.feed(TextDelta("x"))
    assert machine.state is State.IN_TOOL_CALL


def test_fail_abandons_the_open_item_and_keeps_closed_ones() -> None:
    machine, events = _run_counted(
        Start(),
        ReasoningDelta("hmm"),
        ToolCallBegin("f"),
        ToolCallArgs("{"),
        Fail("server_error", "boom", None),
    )
    final = assert_stream_invariants([(e["type"], e) for e in events])
    assert [item["type"] for item in final["output"]] == ["reasoning"]
    assert "response.function_call_arguments.done" not in [e["type"] for e in events]
    assert not machine.has_tool_calls  # the abandoned call is not in the output


def test_cancel_closes_open_reasoning_as_incomplete() -> None:
    _, events = _run_counted(Start(), ReasoningDelta("hal"), Cancel(None))
    final = assert_stream_invariants([(e["type"], e) for e in events])
    assert final["output"][0]["status"] == "incomplete"
    assert final["output"][0]["content"] == [{"type": "reasoning_text", "text": "hal"}]


def test_logprobs_take_the_event_shape_on_events_and_the_part_shape_on_parts() -> None:
    first = {
        "token": "Hel",
        "logprob": -0.25,
        "bytes": [72, 101, 108],
        "top_logprobs": [{"token": "Hel", "bytes": [72, 101, 108], "logprob": -0.25}],
    }
    second = {"token": "lo", "logprob": -1.5, "bytes": [108, 111], "top_logprobs": []}
    given = [copy.deepcopy(first)]
    machine, events = _run_counted(Start(), TextDelta("Hel", given))
    given[0]["token"] = "mutated"  # the machine kept its own copy
    events += machine.feed(TextDelta("lo", [second])) + machine.feed(_stop())
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas[0]["logprobs"] == [
        {"token": "Hel", "logprob": -0.25, "top_logprobs": [{"token": "Hel", "logprob": -0.25}]}
    ]
    (done,) = [e for e in events if e["type"] == "response.output_text.done"]
    assert done["logprobs"] == deltas[0]["logprobs"] + deltas[1]["logprobs"]
    final = assert_stream_invariants([(e["type"], e) for e in events])
    assert final["output"][0]["content"][0]["logprobs"] == [first, second]


def test_snapshot_in_flight_shows_the_open_reasoning_and_call() -> None:
    machine, _ = _run_counted(Start(), ReasoningDelta("r"))
    assert machine.snapshot()["output"][0]["status"] == "in_progress"
    assert machine.output_items == []
    machine.feed(ToolCallBegin("f"))
    machine.feed(ToolCallArgs('{"a'))
    snap = machine.snapshot()
    assert [(i["type"], i["status"]) for i in snap["output"]] == [
        ("reasoning", "completed"),
        ("function_call", "in_progress"),
    ]
    assert snap["output"][1]["arguments"] == '{"a'
    assert machine.has_tool_calls
    assert_strict_response(snap)


# --- Hosted calls: the exact streams -----------------------------------------------------------


def _types(events: list[Any]) -> list[str]:
    return [e["type"].removeprefix("response.") for e in events]


def test_a_web_search_streams_its_three_events_and_cites_its_sources() -> None:
    config = ResponseConfig(model="m", sources_included=True)
    machine = ResponseMachine("resp_1", config, CREATED_AT, id_factory=_counting_ids())
    feed = machine.feed
    events = feed(Start()) + feed(ToolCallBegin("web_search", hosted=HostedCall("web_search")))
    assert events[-2]["item"] == {
        "id": "ws_0",
        "type": "web_search_call",
        "status": "in_progress",
        "action": {"type": "search"},
    }
    events += feed(ToolCallArgs('{"query": "paris"}')) + feed(ToolCallEnd('{"query": "paris"}'))
    assert machine.state is State.HOSTED_RUNNING
    events += feed(HostedResult(True, (("https://en.wikipedia.org/wiki/Paris", "Paris"),)))
    events += feed(TextDelta("The capital [1].")) + feed(_stop())
    assert _types(events) == [
        "created",
        "in_progress",
        "output_item.added",
        "web_search_call.in_progress",
        "web_search_call.searching",
        "web_search_call.completed",
        "output_item.done",
        "output_item.added",
        "content_part.added",
        "output_text.delta",
        "output_text.annotation.added",
        "output_text.done",
        "content_part.done",
        "output_item.done",
        "completed",
    ]
    final = _stream_invariants([(e["type"], e) for e in events])
    assert final["output"][0]["action"] == {
        "type": "search",
        "query": "paris",
        "sources": [{"type": "url", "url": "https://en.wikipedia.org/wiki/Paris"}],
    }
    citation = {
        "type": "url_citation",
        "url": "https://en.wikipedia.org/wiki/Paris",
        "title": "Paris",
        "start_index": 12,
        "end_index": 15,
    }
    assert final["output"][1]["content"][0]["annotations"] == [citation]
    assert events[10]["annotation"] == citation
    assert events[10]["annotation_index"] == 0


def test_sources_included_does_not_change_the_response_object() -> None:
    plain = ResponseMachine("resp_1", ResponseConfig(model="m"), CREATED_AT).snapshot()
    asked = ResponseConfig(model="m", sources_included=True)
    assert ResponseMachine("resp_1", asked, CREATED_AT).snapshot() == plain


def test_a_failed_search_keeps_no_sources_and_cites_nothing() -> None:
    config = ResponseConfig(model="m", sources_included=True)
    _, events = _run(
        config,
        Start(),
        ToolCallBegin("web_search", hosted=HostedCall("web_search")),
        ToolCallEnd('{"query": "q"}'),
        HostedResult(False, error="the search backend answered 500"),
        TextDelta("see [1]"),
        _stop(),
    )
    final = _stream_invariants([(e["type"], e) for e in events])
    search, message = final["output"]
    assert (search["status"], search["action"]) == ("failed", {"type": "search", "query": "q"})
    assert message["content"][0]["annotations"] == []


def test_an_mcp_call_streams_its_arguments_and_its_outcome() -> None:
    _, events = _run(
        ResponseConfig(model="m"),
        Start(),
        ToolCallBegin("get_weather", hosted=HostedCall("mcp", "weather")),
        ToolCallArgs('{"city": '),
        ToolCallEnd('{"city": "Paris"}'),
        HostedResult(True, output="sunny, 18C"),
        _stop(),
    )
    assert _types(events)[2:] == [
        "output_item.added",
        "mcp_call.in_progress",
        "mcp_call_arguments.delta",
        "mcp_call_arguments.delta",
        "mcp_call_arguments.done",
        "mcp_call.completed",
        "output_item.done",
        "completed",
    ]
    final = _stream_invariants([(e["type"], e) for e in events])
    assert final["output"] == [
        {
            "id": "mcp_fixed",
            "type": "mcp_call",
            "server_label": "weather",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
            "approval_request_id": None,
            "output": "sunny, 18C",
            "error": None,
            "status": "completed",
        }
    ]


def test_an_approval_request_is_whole_at_its_end_and_cancel_stops_a_running_call() -> None:
    _, events = _run(
        ResponseConfig(model="m"),
        Start(),
        ToolCallBegin("add", hosted=HostedCall("mcp", "calc", approval=True)),
        ToolCallArgs('{"a": 1}'),
        ToolCallEnd('{"a": 1}'),
        ToolCallBegin("slow", hosted=HostedCall("mcp", "calc")),
        ToolCallEnd("{}"),
        Cancel(None),
    )
    assert _types(events)[2:] == [
        "output_item.added",
        "output_item.done",
        "output_item.added",
        "mcp_call.in_progress",
        "mcp_call_arguments.delta",  # the unsent rest: deltas join to .done
        "mcp_call_arguments.done",
        "output_item.done",
        "cancelled",
    ]
    final = _stream_invariants([(e["type"], e) for e in events])
    approval, call = final["output"]
    assert approval == {
        "id": "mcpr_fixed",
        "type": "mcp_approval_request",
        "server_label": "calc",
        "name": "add",
        "arguments": '{"a": 1}',
    }
    assert (call["status"], call["output"], call["error"]) == ("incomplete", None, None)
