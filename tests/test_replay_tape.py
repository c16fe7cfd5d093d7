"""The compact replay tape (protocol.replay): any stream the event machine makes, under any
chunking, hosted items and citations included, is rebuilt event for event from its final
object and the tape."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_responses.protocol.events.machine import (
    Cancel,
    Compacted,
    Fail,
    Finish,
    HostedCall,
    HostedResult,
    MachineInput,
    ProtocolError,
    ResponseMachine,
    Start,
    TextDelta,
    ToolCallArgs,
    ToolCallBegin,
    ToolCallEnd,
    WholeItem,
)
from mlx_responses.protocol.events.replay import compact_events, expand_events
from mlx_responses.protocol.objects import ResponseConfig, Usage, mcp_list_tools_item
from mlx_responses.storage.interface import StoredResponse
from mlx_responses.storage.memory import encode_json
from tests.test_protocol_machine import EndExtending, Step, configs, sequences


def _run(config: ResponseConfig, steps: list[Step]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    machine = ResponseMachine("resp_test", config, 1_700_000_000)
    events: list[dict[str, Any]] = []
    streamed = ""
    for step in steps:
        inp = ToolCallEnd(streamed + step.rest) if isinstance(step, EndExtending) else step
        try:
            events += machine.feed(inp)
        except ProtocolError:
            continue
        if isinstance(inp, ToolCallBegin):
            streamed = ""
        elif isinstance(inp, ToolCallArgs):
            streamed += inp.delta
    return machine.snapshot(), events


@settings(max_examples=400, deadline=None)
@given(configs, sequences)
def test_every_machine_stream_is_rebuilt_exactly(config: ResponseConfig, steps: list[Step]) -> None:
    final, events = _run(config, steps)
    # What a store holds is JSON: round-trip both through it first.
    final = json.loads(json.dumps(final))
    events = json.loads(json.dumps(events))
    tape = compact_events(final, events)
    assert tape is not None
    assert expand_events(final, tape) == events
    assert expand_events(final, json.loads(json.dumps(tape))) == events


@given(st.lists(st.integers(1, 5), min_size=1, max_size=40))
def test_the_chunking_is_kept(cuts: list[int]) -> None:
    """The same text cut differently replays with its own cuts (coalescing differs per run)."""
    text = "x" * sum(cuts)
    machine = ResponseMachine("resp_t", ResponseConfig(model="m"), 1)
    events = machine.feed(Start())
    at = 0
    for n in cuts:
        events += machine.feed(TextDelta(text[at : at + n]))
        at += n
    events += machine.feed(Finish("stop", Usage(3, len(cuts)), 2))
    final = machine.snapshot()
    tape = compact_events(final, events)
    assert tape is not None
    deltas = [e["delta"] for e in expand_events(final, tape) if e["type"].endswith(".delta")]
    assert [len(d) for d in deltas] == cuts


def test_compaction_start_is_rebuilt() -> None:
    item = {"id": "cmp_1", "type": "compaction", "encrypted_content": "summary"}
    machine = ResponseMachine("resp_c", ResponseConfig(model="m", background=True), 1)
    events = machine.feed(Start(Compacted(item, 900, 120)))
    events += machine.feed(TextDelta("hi"))
    events += machine.feed(Finish("stop", Usage(120, 1), 2))
    final = machine.snapshot()
    tape = compact_events(final, events)
    assert tape is not None
    assert tape["ops"].startswith("S900:120")
    assert expand_events(final, tape) == events


def test_a_stream_the_machine_did_not_make_is_kept_literally() -> None:
    final = {"id": "resp_x", "status": "failed", "output": [], "model": "m", "created_at": 1}
    events = ({"type": "response.failed", "sequence_number": 0, "response": final},)
    assert compact_events(final, events) is None
    record = StoredResponse(final, (), events)
    data = record.to_json()
    assert "replay" not in data
    assert data["events"] == list(events)
    assert StoredResponse.from_json(json.loads(encode_json(data))).events == events


def test_a_stored_record_is_a_fraction_of_its_events() -> None:
    machine = ResponseMachine("resp_s", ResponseConfig(model="m"), 1)
    events = machine.feed(Start())
    for n in range(330):
        events += machine.feed(TextDelta(f"w{n} "))
    events += machine.feed(Finish("stop", Usage(20, 330), 2))
    record = StoredResponse(machine.snapshot(), (), tuple(events))
    compact = len(encode_json(record.to_json()))
    literal = len(encode_json({"response": record.response, "events": events}))
    assert compact * 5 < literal
    assert StoredResponse.from_json(json.loads(encode_json(record.to_json()))).events == tuple(
        events
    )


def _hosted_stream() -> list[MachineInput]:
    return [
        Start(),
        WholeItem(mcp_list_tools_item("mcpl_1", server_label="s", tools=[])),
        ToolCallBegin("web_search", hosted=HostedCall("web_search")),
        ToolCallArgs('{"query": "pa'),
        ToolCallEnd('{"query": "paris"}'),
        HostedResult(
            True, (("https://a.org/x", "A"), ("https://b.org", "B"), ("https://c.org", "C"))
        ),
        ToolCallBegin("add", hosted=HostedCall("mcp", "s")),
        ToolCallArgs('{"a": 1'),
        ToolCallEnd('{"a": 1, "b": 2}'),
        HostedResult(False, error="refused"),
        ToolCallBegin("add", hosted=HostedCall("mcp", "s", approval=True)),
        ToolCallEnd("{}"),
        TextDelta("Paris [3], see https://a.org/x."),
        ToolCallBegin("web_search", hosted=HostedCall("web_search")),
        ToolCallEnd('{"url": "https://a.org/x"}'),
    ]


@pytest.mark.parametrize("sources_included", [False, True])
@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("end", ["result", "cancel", "fail", "running"])
def test_hosted_items_compact_and_rebuild(
    sources_included: bool, background: bool, end: str
) -> None:
    """Every hosted kind, citations included, compacts to a tape (none is kept literally),
    in the end and, in background, while the response still runs."""
    config = ResponseConfig(model="m", background=background, sources_included=sources_included)
    endings: dict[str, list[MachineInput]] = {
        "result": [HostedResult(True)],
        "cancel": [Cancel(Usage(1, 1))],
        "fail": [Fail("server_error", "boom", None)],
        "running": [],
    }
    steps = _hosted_stream() + endings[end]
    if end == "result":
        steps += [TextDelta("done [1]"), Finish("stop", Usage(2, 2), 3)]
    machine = ResponseMachine("resp_h", config, 1)
    events = [event for step in steps for event in machine.feed(step)]
    final = json.loads(json.dumps(machine.snapshot()))
    events = json.loads(json.dumps(events))
    assert any(e["type"] == "response.output_text.annotation.added" for e in events)
    tape = compact_events(final, events)
    assert tape is not None
    assert {"W", "Bw", "Bm", "Ba", "H"} <= set(tape["ops"].split(","))
    assert expand_events(final, tape) == events
