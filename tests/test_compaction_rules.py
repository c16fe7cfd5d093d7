"""The pure compaction rules (``protocol/compaction.py``), over generated histories.

Histories are built from blocks a client really sends: system/developer messages, user turns,
assistant turns (with or without a reasoning item), tool groups (one or more parallel calls,
their outputs in any order after all of them, optionally reasoning first and a reply after), a
pending call group at the end, and sometimes an earlier compaction item. Also: the
``encrypted_content`` codec, rendering, and the event machine's compaction step.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_responses.protocol.errors import ApiError
from mlx_responses.protocol.events.machine import (
    Compacted,
    Finish,
    MachineInput,
    ProtocolError,
    ResponseMachine,
    Start,
    State,
    TextDelta,
)
from mlx_responses.protocol.items.compaction import (
    SUMMARY_PREFIX,
    NothingToSummarize,
    Split,
    decode_compaction,
    default_keep_tokens,
    encode_compaction,
    item_text,
    legal_splits,
    replay_view,
    split_history,
)
from mlx_responses.protocol.items.read import (
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    InputMessage,
    Reasoning,
    TurnItem,
    parse_item,
)
from mlx_responses.protocol.items.write import item_json
from mlx_responses.protocol.objects import ResponseConfig, Usage
from mlx_responses.text.chat import to_chat
from tests.conformance import assert_stream_invariants

WORDS = st.text(alphabet="abcdefgh ", min_size=0, max_size=40)


@dataclass
class History:
    prefix: str = "call"
    items: list[InputItem] = field(default_factory=list)
    groups: list[set[str]] = field(default_factory=list)  # call ids of each parallel group
    calls: int = 0
    boundaries: list[int] = field(default_factory=lambda: [0])  # where blocks start and end

    def call_ids(self, count: int) -> list[str]:
        ids = [f"{self.prefix}_{self.calls + i}" for i in range(count)]
        self.calls += count
        return ids


@st.composite
def blocks(draw: st.DrawFn, history: History) -> None:
    kind = draw(st.sampled_from(["system", "user", "assistant", "tools", "tools", "user"]))
    items = history.items
    match kind:
        case "system":
            items.append(InputMessage(draw(st.sampled_from(["system", "developer"])), draw(WORDS)))
        case "user":
            items.append(InputMessage("user", draw(WORDS)))
        case "assistant":
            if draw(st.booleans()):
                items.append(Reasoning(draw(WORDS)))
            items.append(InputMessage("assistant", draw(WORDS)))
        case "tools":
            ids = history.call_ids(draw(st.integers(1, 3)))
            history.groups.append(set(ids))
            if draw(st.booleans()):
                items.append(Reasoning(draw(WORDS)))
            items += [FunctionCall(call_id, "f", json.dumps({"q": draw(WORDS)})) for call_id in ids]
            for call_id in draw(st.permutations(ids)):
                items.append(FunctionCallOutput(call_id, draw(WORDS)))
            if draw(st.booleans()):
                items.append(InputMessage("assistant", draw(WORDS)))


@st.composite
def histories(draw: st.DrawFn, *, allow_compaction: bool = True) -> History:
    history = History("call" if allow_compaction else "inner")
    for _ in range(draw(st.integers(0, 14))):
        draw(blocks(history))
        history.boundaries.append(len(history.items))
    if allow_compaction and draw(st.booleans()):
        # An earlier compaction somewhere, holding turns of its own.
        inner = draw(histories(allow_compaction=False))
        retained = tuple(item for item in inner.items if isinstance(item, TurnItem))
        at = draw(st.sampled_from(history.boundaries))  # between blocks, as a client sends it
        history.items.insert(at, Compaction(draw(WORDS), retained))
        history.groups += inner.groups
    if draw(st.booleans()):
        # A pending tool group at the end (the client has not sent the outputs yet).
        history.items += [FunctionCall(i, "f", "{}") for i in history.call_ids(2)]
    return history


def cost(item: TurnItem) -> int:
    return len(item_text(item)) // 4 + 1


def _turns_of(items: list[InputItem]) -> list[TurnItem]:
    return [
        item
        for item in replay_view(items)
        if not (isinstance(item, InputMessage) and item.role in ("system", "developer"))
        and not (isinstance(item, InputMessage) and item.text.startswith(SUMMARY_PREFIX))
    ]


def _check_split(history: History, split: Split, keep_tokens: int) -> None:
    items = history.items
    turns = _turns_of(items)
    users = [
        i for i, item in enumerate(turns) if isinstance(item, InputMessage) and item.role == "user"
    ]
    latest = users[-1] if users else None

    # Kept: every system and developer message of what renders, in order (a summary excluded).
    view = replay_view(items)
    expected_kept = [
        item
        for item in view
        if isinstance(item, InputMessage)
        and item.role in ("system", "developer")
        and not item.text.startswith(SUMMARY_PREFIX)
    ]
    assert list(split.kept) == expected_kept

    # Something is summarized; the latest user message is always kept, first when moved.
    assert split.summarized
    if latest is not None:
        assert any(item is turns[latest] for item in split.retained)
    # The two parts are the turns: summarized in order, then the latest user message (when the
    # split falls after it) and the suffix after the split.
    n, r = len(turns), len(split.retained)
    moved = latest is not None and latest < n - r
    cut = n - r + 1 if moved else n - r
    expected = ([turns[latest]] if moved and latest is not None else []) + turns[cut:]
    assert _same(split.retained, expected)
    assert _same(split.summarized, [t for i, t in enumerate(turns[:cut]) if i != latest])

    # The split falls before a user message or right after a function call output.
    assert (cut < n and cut in users) or isinstance(turns[cut - 1], FunctionCallOutput)
    # Never a call without its output; parallel calls stay together.
    left = {t.call_id for t in split.summarized if isinstance(t, FunctionCall | FunctionCallOutput)}
    right = {t.call_id for t in turns[cut:] if isinstance(t, FunctionCall | FunctionCallOutput)}
    assert not left & right, f"call ids on both sides: {left & right}"
    for group in history.groups:
        assert not (group & left and group & right), f"parallel group {group} split"

    # The retained turns fit keep_tokens, or no smaller legal suffix exists; and no larger
    # legal suffix would have fitted (the newest whole turns that fit).
    def suffix_cost(at: int) -> int:
        return sum(cost(t) for i, t in enumerate(turns[at:], start=at) if i != latest)

    legal = [i for i in legal_splits(turns) if not (i == 1 and latest == 0)]
    assert cut in legal
    if suffix_cost(cut) > keep_tokens:
        assert cut == max(legal)
    assert not [i for i in legal if i < cut and suffix_cost(i) <= keep_tokens]


def _same(got: tuple[TurnItem, ...], expected: list[TurnItem]) -> bool:
    return len(got) == len(expected) and all(a is b for a, b in zip(got, expected, strict=True))


@settings(max_examples=400, deadline=None)
@given(histories(), st.integers(0, 80))
def test_split_rules_hold_for_any_history(history: History, keep_tokens: int) -> None:
    try:
        split = split_history(history.items, cost, keep_tokens)
    except NothingToSummarize:
        turns = _turns_of(history.items)
        users = [i for i, t in enumerate(turns) if isinstance(t, InputMessage) and t.role == "user"]
        latest = users[-1] if users else None
        assert not [i for i in legal_splits(turns) if not (i == 1 and latest == 0)]
        return
    _check_split(history, split, keep_tokens)
    if split.prior_summary is not None:
        assert any(isinstance(item, Compaction) for item in history.items)


@settings(max_examples=200, deadline=None)
@given(histories(), st.integers(0, 80))
def test_compacted_output_replays_the_same_whole_or_appended(history: History, keep: int) -> None:
    """A compaction output (kept, retained, item) renders the same sent alone or after the
    full history: the compaction item stands in for all that precedes it."""
    try:
        split = split_history(history.items, cost, keep)
    except NothingToSummarize:
        return
    item = Compaction("the summary", split.retained)
    alone = [*split.kept, *split.retained, item]
    appended = [*history.items, item]
    view = replay_view(alone)
    assert view == [
        *split.kept,
        InputMessage("system", SUMMARY_PREFIX + "the summary"),
        *split.retained,
    ]
    assert [i for i in replay_view(appended) if i not in split.kept] == view[len(split.kept) :]


def test_a_tool_loop_after_one_user_message_can_still_be_compacted() -> None:
    user = InputMessage("user", "fix the bug")
    loop: list[InputItem] = [user]
    for n in range(6):
        loop += [FunctionCall(f"c{n}", "run", "{}"), FunctionCallOutput(f"c{n}", "x" * 40)]
    split = split_history(loop, cost, keep_tokens=30)
    assert split.retained[0] == user
    assert split.retained[1:] == tuple(loop[-2:])  # the newest whole tool group that fits
    assert split.summarized == tuple(loop[1:-2])


def test_nothing_to_summarize() -> None:
    for items in (
        [InputMessage("user", "hello")],
        [
            InputMessage("system", "be brief"),
            InputMessage("user", "hi"),
            InputMessage("assistant", "ok"),
        ],
        [],
    ):
        with pytest.raises(NothingToSummarize):
            split_history(items, cost, keep_tokens=1000)


def test_default_keep_tokens() -> None:
    assert default_keep_tokens(2048) == 128
    assert default_keep_tokens(1 << 20) == 8192
    assert default_keep_tokens(8) == 1


# --- encrypted_content ----------------------------------------------------------------------

turn_items = st.one_of(
    st.builds(
        InputMessage, st.sampled_from(["system", "developer", "user", "assistant"]), st.text()
    ),
    st.builds(FunctionCall, st.text(min_size=1), st.text(min_size=1), st.just('{"a": [1, "é"]}')),
    st.builds(FunctionCallOutput, st.text(min_size=1), st.text()),
    st.builds(Reasoning, st.text()),
)


@given(st.text(), st.lists(turn_items, max_size=6))
def test_encrypted_content_round_trips(summary: str, retained: list[TurnItem]) -> None:
    compaction = Compaction(summary, tuple(retained))
    item = item_json(compaction)
    assert item["id"].startswith("cmp_")
    assert set(item) == {"id", "type", "encrypted_content"}
    assert "=" not in item["encrypted_content"]  # base64url, unpadded
    assert parse_item(item, "input[0]") == compaction
    assert decode_compaction(encode_compaction(compaction), "x") == compaction


def _b64(payload: Any) -> str:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return base64.urlsafe_b64encode(raw).decode()


GOOD_ITEM = {"type": "message", "role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("content", "param", "says"),
    [
        ("not base64 !", "input[2].encrypted_content", "base64url"),
        (_b64(b"\xff\xfe"), "input[2].encrypted_content", "not JSON"),
        (_b64([1, 2]), "input[2].encrypted_content", "an array, not an object"),
        (_b64({"v": 1, "summary": "s"}), "input[2].encrypted_content", "'items'"),
        (_b64({"v": 2, "summary": "s", "items": []}), "input[2].encrypted_content", "version 2"),
        (_b64({"v": 1, "summary": 3, "items": []}), "input[2].encrypted_content", "'summary'"),
        (_b64({"v": 1, "summary": "", "items": {}}), "input[2].encrypted_content", "'items'"),
        (
            _b64(
                {
                    "v": 1,
                    "summary": "",
                    "items": [{"type": "message", "role": "robot", "content": ""}],
                }
            ),
            "input[2].encrypted_content.items[0].role",
            "robot",
        ),
        (
            _b64(
                {
                    "v": 1,
                    "summary": "",
                    "items": [
                        GOOD_ITEM,
                        {
                            "type": "compaction",
                            "encrypted_content": _b64({"v": 1, "summary": "", "items": []}),
                        },
                    ],
                }
            ),
            "input[2].encrypted_content",
            "itself a compaction item",
        ),
    ],
)
def test_a_malformed_compaction_item_is_a_400_naming_the_problem(
    content: str, param: str, says: str
) -> None:
    with pytest.raises(ApiError) as caught:
        parse_item({"type": "compaction", "encrypted_content": content}, "input[2]")
    assert caught.value.status == 400
    assert caught.value.param == param
    assert says in caught.value.message


def test_compaction_item_keys_are_strict() -> None:
    good = item_json(Compaction("s", ()))
    assert parse_item({**good, "created_by": "x"}, "input[0]") == Compaction("s", ())
    with pytest.raises(ApiError) as caught:
        parse_item({**good, "summary": "x"}, "input[0]")
    assert caught.value.param == "input[0].summary"
    with pytest.raises(ApiError) as caught:
        parse_item({"type": "compaction"}, "input[0]")
    assert caught.value.param == "input[0].encrypted_content"


def test_to_chat_puts_the_summary_in_the_system_message_and_drops_what_it_replaces() -> None:
    retained = (InputMessage("user", "latest"),)
    items: list[InputItem] = [
        InputMessage("developer", "be brief"),
        InputMessage("user", "old question"),
        InputMessage("assistant", "old answer"),
        Compaction("they talked", retained),
        InputMessage("assistant", "new answer"),
    ]
    assert to_chat("rules", items) == [
        {"role": "system", "content": f"rules\n\nbe brief\n\n{SUMMARY_PREFIX}they talked"},
        {"role": "user", "content": "latest"},
        {"role": "assistant", "content": "new answer"},
    ]
    # An empty summary adds nothing; the retained turns still stand in for the earlier ones.
    assert to_chat(None, [InputMessage("user", "old"), Compaction("", retained)]) == [
        {"role": "user", "content": "latest"}
    ]


# --- the event machine's compaction step ------------------------------------------------------


def _compacted_item() -> dict[str, Any]:
    return item_json(Compaction("s", (InputMessage("user", "u"),)), "cmp_1")


def _stream(config: ResponseConfig, *inputs: MachineInput) -> list[tuple[str, dict[str, Any]]]:
    machine = ResponseMachine("resp_1", config, 1)
    events = [event for step in inputs for event in machine.feed(step)]
    return [(event["type"], event) for event in events]


@pytest.mark.parametrize("background", [False, True])
def test_the_machine_puts_the_compaction_first_after_in_progress(background: bool) -> None:
    step = Compacted(_compacted_item(), 90, 40)
    events = _stream(
        ResponseConfig(model="m", background=background),
        Start(step),
        TextDelta("hi"),
        Finish("stop", Usage(40, 1), 2),
    )
    final = assert_stream_invariants(events)
    types = [name for name, _ in events]
    at = types.index("response.in_progress") + 1
    assert types[at : at + 4] == [
        "mlx.compaction.started",
        "mlx.compaction.completed",
        "response.output_item.added",
        "response.output_item.done",
    ]
    assert events[at][1] == {
        "type": "mlx.compaction.started",
        "sequence_number": at,
        "response_id": "resp_1",
        "input_tokens": 90,
    }
    assert events[at + 1][1]["input_tokens_after"] == 40
    assert [item["type"] for item in final["output"]] == ["compaction", "message"]
    assert final["output"][0] == _compacted_item()
    assert events[at + 4][1]["output_index"] == 1  # the answer comes after it


def test_a_malformed_compaction_step_is_refused_and_changes_nothing() -> None:
    machine = ResponseMachine("resp_1", ResponseConfig(model="m"), 1)
    for step in (
        Compacted({**_compacted_item(), "type": "message"}, 9, 4),
        Compacted({**_compacted_item(), "extra": 1}, 9, 4),
        Compacted(_compacted_item(), -1, 4),
    ):
        with pytest.raises(ProtocolError):
            machine.feed(Start(step))
        assert machine.next_sequence_number == 0
        assert machine.state is State.QUEUED


def test_conformance_rejects_a_compaction_item_without_its_events() -> None:
    events = _stream(
        ResponseConfig(model="m"),
        Start(Compacted(_compacted_item(), 90, 40)),
        Finish("stop", Usage(40, 0), 2),
    )
    # Drop the two extension events and renumber: the item alone is not a compaction stream.
    kept = [(name, dict(data)) for name, data in events if not name.startswith("mlx.")]
    for index, (_, data) in enumerate(kept):
        data["sequence_number"] = index
    with pytest.raises(AssertionError, match="no compaction events"):
        assert_stream_invariants(kept)
