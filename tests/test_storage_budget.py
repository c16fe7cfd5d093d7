"""The budgeted map and the memory backends: LRU under entry and byte budgets, TTL, estimates.

A Hypothesis state machine drives ``BudgetedMap`` with put / get / delete / expire / advance clock
under random small limits, against a model of the expected LRU contents; example tests pin the
documented edge cases (oversized entries, limits at 0, TTL boundaries) and the memory backends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from mlx_responses.storage.budget import BudgetedMap
from mlx_responses.storage.interface import ConversationRecord, StoredResponse, StoreLimits
from mlx_responses.storage.memory import (
    MemoryConversationStorage,
    MemoryResponseStorage,
    serialized_size,
)

KEYS = ("resp_a", "resp_b", "resp_c", "resp_d")
TOLERANCE = 0.25


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_record(key: str, text: str, n_items: int = 1) -> StoredResponse:
    """A stored response shaped like the real ones: final object, input items, events."""
    message = {
        "id": f"msg_{key}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }
    response = {"id": key, "object": "response", "status": "completed", "output": [message]}
    items = tuple(
        {"id": f"msg_in{i}", "type": "message", "role": "user", "content": text[: 10 * (i + 1)]}
        for i in range(n_items)
    )
    events = (
        {"type": "response.output_text.delta", "sequence_number": 0, "delta": text},
        {"type": "response.completed", "sequence_number": 1, "response": response},
    )
    return StoredResponse(response, items, events)


def wire_size(data: Any) -> int:
    """The size of ``data`` as the server sends it (compact UTF-8 JSON): 'the serialized size'."""
    return len(json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def within_tolerance(estimate: int, actual: int) -> bool:
    return abs(estimate - actual) <= TOLERANCE * actual


texts = st.text(alphabet='ab cé\u4e2d"\\\n', max_size=120)


@dataclass
class ModelEntry:
    key: str
    record: StoredResponse
    nbytes: int
    written_at: float


class BudgetMachine(RuleBasedStateMachine):
    """``BudgetedMap`` against a list of entries in recency order (least recent first)."""

    def __init__(self) -> None:
        super().__init__()
        self.map: BudgetedMap[str, StoredResponse] = BudgetedMap(StoreLimits(1, 1, 0))
        self.limits = StoreLimits(1, 1, 0)
        self.now = 0.0
        self.model: list[ModelEntry] = []
        self.evictions = self.expirations = self.rejections = 0

    @initialize(
        # Drawn from lists, not ranges: Hypothesis favours the ends of a range, and 0 keeps
        # nothing, which would leave most runs with an empty map.
        max_entries=st.sampled_from([1, 2, 3, 4, 0]),
        max_bytes=st.sampled_from([1500, 2500, 4000, 800, 0]),
        ttl=st.sampled_from([3, 10, 0]),
    )
    def start(self, max_entries: int, max_bytes: int, ttl: int) -> None:
        self.limits = StoreLimits(max_entries, max_bytes, ttl)
        self.map = BudgetedMap(self.limits)

    # -- the model --

    def model_expire(self) -> None:
        ttl = self.limits.ttl_seconds
        if ttl <= 0:
            return
        alive = [e for e in self.model if e.written_at + ttl > self.now]
        self.expirations += len(self.model) - len(alive)
        self.model = alive

    def model_find(self, key: str) -> ModelEntry | None:
        return next((e for e in self.model if e.key == key), None)

    def model_bytes(self) -> int:
        return sum(e.nbytes for e in self.model)

    # -- rules --

    @rule(key=st.sampled_from(KEYS), text=texts, n_items=st.integers(0, 3))
    def put(self, key: str, text: str, n_items: int) -> None:
        record = make_record(key, text, n_items)
        nbytes = serialized_size(record.to_json())
        assert within_tolerance(nbytes, wire_size(record.to_json()))

        self.model_expire()
        before = [e.key for e in self.model if e.key != key]
        self.model = [e for e in self.model if e.key != key]
        limits = self.limits
        refused = limits.max_entries == 0 or limits.max_bytes == 0 or nbytes > limits.max_bytes
        if refused:
            self.rejections += 1
        else:
            self.model.append(ModelEntry(key, record, nbytes, self.now))
            while len(self.model) > limits.max_entries or self.model_bytes() > limits.max_bytes:
                self.model.pop(0)
                self.evictions += 1

        kept = self.map.put(key, record, nbytes, self.now)

        assert kept is not refused
        held = list(self.map.keys())
        if kept:
            assert held[-1] == key, "a put makes its entry the most recent"
        else:
            assert key not in held, "a refused entry is not kept, nor an older value of its key"
        # Whatever was evicted is a prefix of the old recency order: least recent first.
        survivors = [k for k in held if k != key]
        assert survivors == before[len(before) - len(survivors) :]

    @precondition(lambda self: self.model)
    @rule(data=st.data(), fraction=st.sampled_from([0.5, 0.0, 0.25, 0.75]))
    def get_held_later(self, data: st.DataObject, fraction: float) -> None:
        # Reads of held keys, a while later, are what exercise recency and TTL; a random key is
        # mostly a miss.
        self.advance_clock(fraction)
        self.get(data.draw(st.sampled_from([e.key for e in self.model])))

    @rule(key=st.sampled_from(KEYS))
    def get(self, key: str) -> None:
        self.model_expire()
        expected = self.model_find(key)
        if expected is not None:
            self.model.remove(expected)
            self.model.append(expected)

        found = self.map.get(key, self.now)

        if expected is None:
            assert found is None
        else:
            assert found is expected.record
            assert list(self.map.keys())[-1] == key, "a get refreshes recency"

    @rule(key=st.sampled_from(KEYS))
    def delete(self, key: str) -> None:
        expected = self.model_find(key)
        if expected is not None:
            self.model.remove(expected)
        assert self.map.delete(key) is (expected is not None)

    @rule()
    def expire(self) -> None:
        before = len(self.model)
        self.model_expire()
        assert self.map.expire(self.now) == before - len(self.model)

    @rule(fraction=st.sampled_from([0.5, 1.0, 0.25, 0.75, 2.0]))
    def advance_clock(self, fraction: float) -> None:
        # In fractions of the TTL, so that runs reach expiry within a few steps.
        self.now += fraction * (self.limits.ttl_seconds or 4)

    # -- invariants --

    @invariant()
    def budgets_hold(self) -> None:
        assert len(self.map) <= self.limits.max_entries
        assert self.map.bytes <= self.limits.max_bytes

    @invariant()
    def contents_match_the_lru_model(self) -> None:
        # Nothing within budget is lost, nothing else is kept, and the order is LRU.
        assert list(self.map.keys()) == [e.key for e in self.model]
        assert self.map.bytes == self.model_bytes()
        for entry in self.model:
            assert self.map.nbytes(entry.key) == entry.nbytes

    @invariant()
    def readable_now_matches_the_ttl_model(self) -> None:
        ttl = self.limits.ttl_seconds
        alive = [e.key for e in self.model if ttl <= 0 or e.written_at + ttl > self.now]
        assert list(self.map.keys(self.now)) == alive

    @invariant()
    def byte_estimate_is_honest(self) -> None:
        actual = sum(wire_size(e.record.to_json()) for e in self.model)
        assert within_tolerance(self.map.bytes, actual)

    @invariant()
    def removals_are_counted(self) -> None:
        stats = self.map.statistics()
        assert (stats.evictions, stats.expirations, stats.rejections) == (
            self.evictions,
            self.expirations,
            self.rejections,
        )
        assert (stats.entries, stats.bytes) == (len(self.map), self.map.bytes)


BudgetMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBudgetMachine = BudgetMachine.TestCase


# -- examples ------------------------------------------------------------------------------------


def test_lru_get_refreshes_recency() -> None:
    m: BudgetedMap[str, int] = BudgetedMap(StoreLimits(2, 100, 0))
    m.put("a", 1, 10, 0)
    m.put("b", 2, 10, 0)
    assert m.get("a", 0) == 1
    m.put("c", 3, 10, 0)
    assert list(m.keys()) == ["a", "c"]
    assert m.get("b", 0) is None
    assert m.evictions == 1


def test_byte_budget_evicts_least_recent_until_it_holds() -> None:
    m: BudgetedMap[str, int] = BudgetedMap(StoreLimits(10, 100, 0))
    for key in "abcd":
        m.put(key, 0, 25, 0)
    assert m.bytes == 100
    m.put("e", 0, 60, 0)
    assert list(m.keys()) == ["d", "e"]
    assert m.bytes == 85
    assert m.evictions == 3


def test_oversized_entry_is_not_kept_and_evicts_nothing() -> None:
    m: BudgetedMap[str, int] = BudgetedMap(StoreLimits(10, 100, 0))
    m.put("a", 1, 50, 0)
    m.put("b", 2, 50, 0)
    assert m.put("big", 3, 101, 0) is False
    assert list(m.keys()) == ["a", "b"]
    assert m.bytes == 100
    assert (m.evictions, m.rejections) == (0, 1)
    # Replacing a key with an oversized value drops the old value: no stale version survives.
    assert m.put("a", 4, 101, 0) is False
    assert list(m.keys()) == ["b"]
    # An entry of exactly the budget fits, evicting everything else.
    assert m.put("c", 5, 100, 0) is True
    assert list(m.keys()) == ["c"]


@pytest.mark.parametrize("limits", [StoreLimits(0, 1000, 0), StoreLimits(5, 0, 0)])
def test_zero_entries_or_zero_bytes_keep_nothing(limits: StoreLimits) -> None:
    m: BudgetedMap[str, int] = BudgetedMap(limits)
    assert m.put("a", 1, 0, 0) is False
    assert m.put("b", 1, 10, 0) is False
    assert len(m) == 0
    assert m.bytes == 0
    assert m.get("a", 0) is None
    assert m.rejections == 2


def test_ttl_counts_from_the_last_write_not_the_last_read() -> None:
    m: BudgetedMap[str, int] = BudgetedMap(StoreLimits(10, 1000, 10))
    m.put("a", 1, 1, 0)
    m.put("b", 2, 1, 5)
    assert m.get("a", 9.5) == 1  # read, not rewritten: still expires at 10
    assert m.get("a", 10) is None
    assert m.get("b", 10) == 2
    m.put("b", 3, 1, 12)  # rewritten: now expires at 22
    assert m.get("b", 21.9) == 3
    assert m.expire(22) == 1
    assert len(m) == 0
    assert m.expirations == 2


def test_ttl_zero_never_expires_and_time_never_goes_backwards() -> None:
    forever: BudgetedMap[str, int] = BudgetedMap(StoreLimits(10, 1000, 0))
    forever.put("a", 1, 1, 0)
    assert forever.get("a", 1e12) == 1
    m: BudgetedMap[str, int] = BudgetedMap(StoreLimits(10, 1000, 10))
    m.put("a", 1, 1, 100)
    m.put("b", 2, 1, 50)  # an earlier 'now' is taken as 100: b expires at 110, not 60
    assert m.get("b", 60) == 2
    assert m.get("b", 109) == 2
    assert m.get("b", 110) is None


def test_negative_limits_and_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        BudgetedMap(StoreLimits(-1, 10, 0))
    with pytest.raises(ValueError, match="negative"):
        BudgetedMap(StoreLimits(1, 10, -1))
    m: BudgetedMap[str, int] = BudgetedMap(StoreLimits(1, 10, 0))
    with pytest.raises(ValueError, match="negative"):
        m.put("a", 1, -1, 0)


# -- the memory backends -------------------------------------------------------------------------


def test_memory_response_storage_round_trips_and_charges_the_serialized_size() -> None:
    clock = FakeClock()
    storage = MemoryResponseStorage(StoreLimits(10, 1 << 20, 60), clock=clock)
    record = make_record("resp_1", "héllo wörld \u4e2d" * 20, n_items=3)
    storage.put(record)
    found = storage.get("resp_1")
    assert found == record
    stats = storage.statistics()
    assert stats.entries == 1
    assert stats.bytes == wire_size(record.to_json())
    # Also within 25% of Python's default spacing.
    spaced = len(json.dumps(record.to_json(), ensure_ascii=False).encode("utf-8"))
    assert within_tolerance(stats.bytes, spaced)
    clock.now = 60
    assert storage.get("resp_1") is None
    assert storage.statistics().expirations == 1


def test_memory_storage_hands_out_independent_records() -> None:
    storage = MemoryResponseStorage(StoreLimits(10, 1 << 20, 0))
    record = make_record("resp_1", "text")
    storage.put(record)
    record.response["status"] = "mutated after put"
    first = storage.get("resp_1")
    assert first is not None
    first.response["status"] = "mutated after get"
    first.input_items[0]["content"] = "mutated"
    second = storage.get("resp_1")
    assert second is not None
    assert second.response["status"] == "completed"
    assert second.input_items[0]["content"] == "text"


def test_memory_storage_refuses_a_non_json_record_and_changes_nothing() -> None:
    storage = MemoryResponseStorage(StoreLimits(10, 1 << 20, 0))
    storage.put(make_record("resp_1", "kept"))
    with pytest.raises(TypeError):
        storage.put(StoredResponse({"id": "resp_2", "bad": object()}))
    assert storage.statistics().entries == 1
    assert storage.get("resp_2") is None


def test_memory_conversation_storage_round_trips_under_its_budget() -> None:
    clock = FakeClock()
    item = {"id": "msg_1", "type": "message", "role": "user", "content": "hi " * 30}
    record = ConversationRecord("conv_1", 1700000000, {"topic": "x"}, (item,))
    size = wire_size(record.to_json())
    storage = MemoryConversationStorage(StoreLimits(10, size, 5), clock=clock)
    storage.put(record)
    assert storage.get("conv_1") == record
    assert storage.statistics().bytes == size
    # One more item makes the transcript larger than the budget: it is not kept.
    storage.put(ConversationRecord("conv_1", 1700000000, {"topic": "x"}, (item, item)))
    assert storage.get("conv_1") is None
    assert storage.statistics().rejections == 1
