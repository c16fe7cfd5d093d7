"""The response event machine, over every (state, input) and over random input sequences.

An independent oracle (`_Oracle`) restates which inputs are legal and which output items they
produce; the machine must agree with it exactly, refuse illegal inputs without changing anything,
and every stream it produces must pass the strict conformance checks of tests/conformance.py.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
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
)
from mlx_responses.protocol.ids import new_id
from mlx_responses.protocol.objects import ResponseConfig, ResponseErrorCode, Usage
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
text_deltas = st.one_of(
    st.builds(TextDelta, texts),
    st.builds(TextDelta, nonempty_texts, st.lists(logprob_entries, min_size=1, max_size=2)),
)
reasoning_deltas = st.builds(ReasoningDelta, texts)
call_names = st.sampled_from(["get_weather", "f", "a.b"])
call_ids = st.none() | st.sampled_from(["call_given", "toolu_01"])
call_begins = st.builds(ToolCallBegin, call_names, call_ids)
call_args = st.builds(ToolCallArgs, st.text(max_size=6))


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
)
inputs: st.SearchStrategy[Step] = st.one_of(
    st.just(Start()),
    text_deltas,
    text_deltas,
    reasoning_deltas,
    call_begins,
    call_args,
    call_ends,
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
)
well_formed = st.builds(
    lambda parts, open_call, end, tail: [Start(), *itertools.chain(*parts), *open_call, end, *tail],
    st.lists(segments, max_size=5),
    st.just([]) | st.builds(lambda b, a: [b, *a], call_begins, st.lists(call_args, max_size=3)),
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


ItemType = Literal["message", "reasoning", "function_call"]


@dataclass
class _Item:
    """An output item as the oracle expects it."""

    type: ItemType
    text: str = ""  # message text, reasoning text, or call arguments
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    name: str = ""
    call_id: str | None = None
    status: str = "in_progress"


@dataclass
class _Oracle:
    """An independent restatement of the lifecycle and of the output items it yields."""

    started: bool = False
    ended: bool = False
    items: list[_Item] = field(default_factory=list)  # the last may be open
    open: ItemType | None = None
    streamed: list[str] = field(default_factory=list)  # all message text
    disowned: bool = False  # a ToolCallEnd disowned the streamed arguments
    terminal: MachineInput | None = None

    def legal(self, inp: MachineInput) -> bool:
        if self.ended:
            return False
        match inp:
            case Start():
                return not self.started
            case TextDelta(text=text, logprobs=logprobs):
                well_formed = (bool(text) or not logprobs) and all(map(_valid_logprob, logprobs))
                return well_formed and self.started and self.open != "function_call"
            case ReasoningDelta() | Finish(reason="stop"):
                return self.started and self.open != "function_call"
            case ToolCallBegin(name=name, call_id=call_id):
                well_formed = name != "" and call_id != ""
                return well_formed and self.started and self.open != "function_call"
            case ToolCallArgs() | ToolCallEnd():
                return self.open == "function_call"
            case Finish(reason="length"):
                return self.started
            case Fail() | Cancel():
                return True
        raise AssertionError(inp)

    def _close(self, status: str) -> None:
        if self.open is not None:
            self.items[-1].status = status
            self.open = None

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
            case ToolCallBegin(name=name, call_id=call_id):
                self._close("completed")
                self.items.append(_Item("function_call", name=name, call_id=call_id))
                self.open = "function_call"
            case ToolCallArgs(delta=delta):
                self.items[-1].text += delta
            case ToolCallEnd(arguments=arguments):
                self.disowned |= not arguments.startswith(self.items[-1].text)
                self.items[-1].text = arguments
                self._close("completed")
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

    def resolve(self, step: Step) -> MachineInput:
        if isinstance(step, EndExtending):
            streamed = self.items[-1].text if self.open == "function_call" else ""
            return ToolCallEnd(streamed + step.rest)
        return step


def _observed(item: dict[str, Any]) -> _Item:
    """Project a machine-made output item onto the oracle's view of it."""
    match item["type"]:
        case "message":
            (part,) = item["content"]
            return _Item("message", part["text"], part["logprobs"], status=item["status"])
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
    raise AssertionError(item)


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
    oracle = _Oracle()
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
    assert [_observed(item) for item in machine.output_items] == closed
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
            assert [_observed(item) for item in snapshot["output"]] == oracle.items
        return

    stream = [(e["type"], e) for e in events]
    if oracle.disowned:
        # Documented: `.done` carries the authoritative arguments, so the deltas do not join.
        note_event("arguments disowned")
        with pytest.raises(AssertionError, match="arguments"):
            assert_stream_invariants(stream)
        final = snapshot
    else:
        final = assert_stream_invariants(stream)
    assert final == snapshot
    assert [_observed(item) for item in final["output"]] == oracle.items
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == machine.output_text
    _check_terminal(final, oracle)


def _check_terminal(final: dict[str, Any], oracle: _Oracle) -> None:
    statuses = {item["status"] for item in final["output"]}
    match oracle.terminal:
        case Finish(reason="stop", usage=usage, completed_at=completed_at):
            assert final["status"] == "completed"
            assert final["completed_at"] == completed_at
            assert final["incomplete_details"] is None
            assert final["usage"] == usage.to_json()
            assert statuses <= {"completed"}
        case Finish(reason="length", usage=usage):
            assert final["status"] == "incomplete"
            assert final["incomplete_details"] == {"reason": "max_output_tokens"}
            assert final["completed_at"] is None
            assert final["usage"] == usage.to_json()
        case Fail(code=code, message=message, usage=usage):
            assert final["status"] == "failed"
            assert final["error"] == {"code": code, "message": message}
            assert statuses <= {"completed"}  # only items closed before the failure
            assert final["usage"] == (None if usage is None else usage.to_json())
        case Cancel(usage=usage):
            assert final["status"] == "cancelled"
            assert final["usage"] == (None if usage is None else usage.to_json())
        case _:
            raise AssertionError(oracle.terminal)
    # Only the item open at the end can be incomplete; no empty item is ever invented.
    assert all(item["status"] == "completed" for item in final["output"][:-1])
    for item in final["output"]:
        if item["type"] != "function_call":
            assert item["content"][0]["text"] != ""


# --- Every (state, input) pair, exhaustively -------------------------------------------------

_PATHS: dict[State, list[MachineInput]] = {
    State.QUEUED: [],
    State.IN_PROGRESS: [Start()],
    State.IN_MESSAGE: [Start(), TextDelta("a")],
    State.IN_REASONING: [Start(), ReasoningDelta("r")],
    State.IN_TOOL_CALL: [Start(), ToolCallBegin("f"), ToolCallArgs("{")],
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
    # Malformed in every state:
    "logprobs without text": TextDelta("", [_GOOD_ENTRY]),
    **{f"bad logprob {i}": TextDelta("x", [bad]) for i, bad in enumerate(BAD_LOGPROBS)},
    "nameless call": ToolCallBegin(""),
    "empty call id": ToolCallBegin("f", ""),
    "unknown finish": Finish("eos", Usage(1, 1), 0),  # type: ignore[arg-type]
    "unknown error code": Fail("server_overloaded", "full", None),  # type: ignore[arg-type]
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
    "fail",
    "cancel",
}
_LEGAL: dict[State, set[str]] = {
    State.QUEUED: {"start", "fail", "cancel"},
    State.IN_PROGRESS: _BETWEEN_CALLS,
    State.IN_MESSAGE: _BETWEEN_CALLS,
    State.IN_REASONING: _BETWEEN_CALLS,
    State.IN_TOOL_CALL: {"args", "empty args", "end", "length", "fail", "cancel"},
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
