"""The response event machine, over every (state, input) and over random input sequences.

An independent oracle (`_legal`) restates which inputs are legal; the machine must agree with it
exactly, refuse illegal inputs without changing anything, and every stream it produces must pass
the strict conformance checks of tests/conformance.py.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, get_args

import pytest
from hypothesis import event as note_event
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_responses.protocol.ids import new_id
from mlx_responses.protocol.machine import (
    Cancel,
    Fail,
    Finish,
    MachineInput,
    ProtocolError,
    ResponseMachine,
    Start,
    State,
    TextDelta,
)
from mlx_responses.protocol.objects import ResponseConfig, ResponseErrorCode, Usage
from tests.conformance import (
    TERMINAL_EVENT_TYPES,
    assert_stream_invariants,
    assert_strict_event,
    assert_strict_response,
)

CREATED_AT = 1_700_000_000

# Text a model can produce: any Unicode scalar value (lone surrogates cannot be UTF-8 encoded).
texts = st.text(st.characters(codec="utf-8"), max_size=12)
usages = st.builds(
    lambda i, o, c, r: Usage(i + c, o + r, cached_tokens=c, reasoning_tokens=r),
    *(st.integers(0, 10_000) for _ in range(4)),
)
terminals: st.SearchStrategy[MachineInput] = st.one_of(
    st.builds(Finish, st.sampled_from(["stop", "length"]), usages, st.integers(0, 2**31)),
    st.builds(Fail, st.sampled_from(get_args(ResponseErrorCode)), texts, st.none() | usages),
    st.builds(Cancel, st.none() | usages),
)
inputs: st.SearchStrategy[MachineInput] = st.one_of(
    st.just(Start()),
    st.builds(TextDelta, texts),
    st.builds(TextDelta, texts),
    st.builds(TextDelta, st.just("")),
    terminals,
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
well_formed = st.builds(
    lambda deltas, end, tail: [Start(), *deltas, end, *tail],
    st.lists(st.builds(TextDelta, texts), max_size=10),
    terminals,
    st.lists(inputs, max_size=3),
)
sequences = st.one_of(
    st.lists(inputs, max_size=30),
    st.lists(inputs, max_size=30).map(lambda rest: [Start(), *rest]),
    well_formed,
)


@dataclass
class _Oracle:
    """An independent restatement of the lifecycle: started? ended?"""

    started: bool = False
    ended: bool = False
    streamed: list[str] = field(default_factory=list)
    terminal: MachineInput | None = None

    def legal(self, inp: MachineInput) -> bool:
        if self.ended:
            return False
        match inp:
            case Start():
                return not self.started
            case TextDelta() | Finish():
                return self.started
            case Fail() | Cancel():
                return True
        raise AssertionError(inp)

    def apply(self, inp: MachineInput) -> None:
        match inp:
            case Start():
                self.started = True
            case TextDelta(text=text):
                self.streamed.append(text)
            case Finish() | Fail() | Cancel():
                self.ended = True
                self.terminal = inp


def _fingerprint(machine: ResponseMachine) -> tuple[Any, ...]:
    return (
        machine.state,
        machine.status,
        machine.terminal,
        machine.next_sequence_number,
        machine.output_text,
        machine.snapshot(),
    )


@settings(max_examples=400, deadline=None)
@given(config=configs, sequence=sequences)
def test_random_sequences_follow_the_grammar(
    config: ResponseConfig, sequence: list[MachineInput]
) -> None:
    machine = ResponseMachine("resp_" + "0" * 48, config, CREATED_AT)
    oracle = _Oracle()
    events: list[dict[str, Any]] = []
    for inp in sequence:
        before = _fingerprint(machine)
        if not oracle.legal(inp):
            with pytest.raises(ProtocolError):
                machine.feed(inp)
            assert _fingerprint(machine) == before, f"refused {inp!r} but changed the machine"
            continue
        new = machine.feed(inp)
        oracle.apply(inp)
        assert [e["sequence_number"] for e in new] == list(range(before[3], before[3] + len(new)))
        if isinstance(inp, TextDelta) and not inp.text:
            assert new == []
        for event in new:
            assert_strict_event(event)
        events.extend(new)

    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert machine.next_sequence_number == len(events)
    assert machine.output_text == "".join(oracle.streamed)
    assert machine.terminal == oracle.ended
    snapshot = machine.snapshot()
    note_event(f"ended {machine.state.value}")
    assert_strict_response(snapshot)
    assert ("background" in snapshot) == config.background
    if events:
        assert events[0]["type"] == "response.created"
    if not oracle.ended:
        assert not any(e["type"] in TERMINAL_EVENT_TYPES for e in events)
        if config.background:  # a poll never sees partial output (spec 000)
            assert snapshot["output"] == []
            assert snapshot["usage"]["total_tokens"] == 0
        return

    final = assert_stream_invariants([(e["type"], e) for e in events])
    assert final == snapshot
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == machine.output_text
    _check_terminal(final, oracle, deltas)


def _check_terminal(final: dict[str, Any], oracle: _Oracle, deltas: str) -> None:
    last = oracle.terminal
    text = "".join(p["text"] for item in final["output"] for p in item["content"])
    match last:
        case Finish(reason="stop", usage=usage, completed_at=completed_at):
            assert final["status"] == "completed"
            assert final["completed_at"] == completed_at
            assert final["incomplete_details"] is None
            assert final["usage"] == usage.to_json()
            assert text == deltas
        case Finish(reason="length", usage=usage):
            assert final["status"] == "incomplete"
            assert final["incomplete_details"] == {"reason": "max_output_tokens"}
            assert final["completed_at"] is None
            assert final["usage"] == usage.to_json()
            assert text == deltas
        case Fail(code=code, message=message, usage=usage):
            assert final["status"] == "failed"
            assert final["error"] == {"code": code, "message": message}
            assert final["output"] == []  # the open message is abandoned, not presented as done
            assert final["usage"] == (None if usage is None else usage.to_json())
        case Cancel(usage=usage):
            assert final["status"] == "cancelled"
            assert text == deltas  # the partial text stays readable
            assert all(item["status"] == "incomplete" for item in final["output"])
            assert final["usage"] == (None if usage is None else usage.to_json())
    if text:
        assert len(final["output"]) == 1
    else:
        assert final["output"] == []  # no empty message is invented


# --- Every (state, input) pair, exhaustively -------------------------------------------------

_PATHS: dict[State, list[MachineInput]] = {
    State.QUEUED: [],
    State.IN_PROGRESS: [Start()],
    State.IN_MESSAGE: [Start(), TextDelta("a")],
    State.COMPLETED: [Start(), Finish("stop", Usage(1, 0), 2)],
    State.INCOMPLETE: [Start(), TextDelta("a"), Finish("length", Usage(1, 1), 2)],
    State.FAILED: [Fail("server_error", "boom", None)],
    State.CANCELLED: [Start(), Cancel(None)],
}
_INPUTS: dict[str, MachineInput] = {
    "start": Start(),
    "delta": TextDelta("x"),
    "empty": TextDelta(""),
    "stop": Finish("stop", Usage(1, 1), 3),
    "length": Finish("length", Usage(1, 1), 3),
    "fail": Fail("invalid_prompt", "no", Usage(1, 0)),
    "cancel": Cancel(None),
}
_LEGAL: dict[State, set[str]] = {
    State.QUEUED: {"start", "fail", "cancel"},
    State.IN_PROGRESS: {"delta", "empty", "stop", "length", "fail", "cancel"},
    State.IN_MESSAGE: {"delta", "empty", "stop", "length", "fail", "cancel"},
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
