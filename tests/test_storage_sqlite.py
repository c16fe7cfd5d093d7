"""The SQLite backends on their own: spec 000's budgets over a durable file, across reopen;
forward-only migrations; job rows; the store actor serving from its own thread."""

from __future__ import annotations

import sqlite3
import threading
from functools import partial
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_responses.actors.store import run_store
from mlx_responses.storage.budget import BudgetedMap
from mlx_responses.storage.choice import Backends, Budgets, memory_backends
from mlx_responses.storage.files import FileLimits, StoredFile
from mlx_responses.storage.interface import ConversationRecord, StoredResponse, StoreLimits
from mlx_responses.storage.memory import MemoryResponseStorage
from mlx_responses.storage.sqlite import (
    RESTART_MESSAGE,
    SCHEMA_VERSION,
    Database,
    SqliteConversationStorage,
    SqliteFileStorage,
    SqliteResponseStorage,
    StoreError,
)

from .storage_records import Clock, record


def open_responses(path: Path, limits: StoreLimits, clock: Clock) -> SqliteResponseStorage:
    return SqliteResponseStorage(Database(str(path)), limits, clock=clock)


def test_records_survive_reopen_with_their_lru_order(tmp_path: Path) -> None:
    path, clock = tmp_path / "s.db", Clock()
    limits = StoreLimits(max_entries=3, max_bytes=1 << 20, ttl_seconds=0)
    store = open_responses(path, limits, clock)
    for name in ("a", "b", "c"):
        store.put(record(f"resp_{name}"))
    assert store.get("resp_a") is not None  # a is now the most recent: b is next out
    store.close()
    store = open_responses(path, limits, clock)
    store.put(record("resp_d"))
    assert store.get("resp_b") is None
    assert {r for r in ("resp_a", "resp_c", "resp_d") if store.get(r) is not None} == {
        "resp_a",
        "resp_c",
        "resp_d",
    }
    assert store.statistics().evictions == 1
    store.close()


def test_ttl_runs_across_a_restart_by_write_time(tmp_path: Path) -> None:
    path, clock = tmp_path / "s.db", Clock()
    limits = StoreLimits(max_entries=10, max_bytes=1 << 20, ttl_seconds=60)
    store = open_responses(path, limits, clock)
    store.put(record("resp_old"))
    clock.now += 30
    store.put(record("resp_new"))
    store.close()
    clock.now += 31  # old: 61 s since written; new: 31 s
    store = open_responses(path, limits, clock)
    assert store.get("resp_old") is None
    assert store.get("resp_new") is not None
    assert store.statistics().expirations == 1
    store.close()
    rows = sqlite3.connect(path).execute("SELECT key FROM responses").fetchall()
    assert rows == [("resp_new",)]  # the expired row is gone from the file too


def test_smaller_flags_at_start_evict_least_recent_first(tmp_path: Path) -> None:
    path, clock = tmp_path / "s.db", Clock()
    store = open_responses(path, StoreLimits(10, 1 << 20, 0), clock)
    for n in range(5):
        store.put(record(f"resp_{n}"))
    store.close()
    store = open_responses(path, StoreLimits(2, 1 << 20, 0), clock)
    assert [n for n in range(5) if store.get(f"resp_{n}") is not None] == [3, 4]
    store.close()


def test_records_read_back_equal_what_was_put(tmp_path: Path) -> None:
    store = open_responses(tmp_path / "s.db", StoreLimits(10, 1 << 20, 0), Clock())
    original = record("resp_x", "héllo ✓", metadata={"k": "v"})
    store.put(original)
    got = store.get("resp_x")
    assert got is not None
    assert got.response == original.response
    assert got.input_items == original.input_items
    # A caller mutating what it got changes nothing stored.
    got.response["status"] = "mutated"
    again = store.get("resp_x")
    assert again is not None
    assert again.response["status"] == "completed"
    assert store.delete("resp_x")
    assert store.get("resp_x") is None
    assert not store.delete("resp_x")
    store.close()


def test_the_budget_matches_the_memory_backend(tmp_path: Path) -> None:
    """Same flags, same decisions: the serialised size is charged on both backends."""
    limits = StoreLimits(max_entries=50, max_bytes=2_000, ttl_seconds=0)
    memory = MemoryResponseStorage(limits, clock=Clock())
    durable = open_responses(tmp_path / "s.db", limits, Clock())
    for n in range(30):
        for store in (memory, durable):
            store.put(record(f"resp_{n}", "x" * (n * 7 % 90)))
            if n % 3 == 0:
                store.get(f"resp_{n // 2}")
    assert memory.statistics() == durable.statistics()
    held = [n for n in range(30) if memory.get(f"resp_{n}") is not None]
    assert held == [n for n in range(30) if durable.get(f"resp_{n}") is not None]
    durable.close()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["put", "get", "delete", "reopen"]), st.integers(0, 6)),
        max_size=25,
    )
)
def test_random_operations_agree_with_the_pure_budget(ops: list[tuple[str, int]]) -> None:
    """Any sequence of puts, gets, deletes and restarts: the durable store holds exactly the
    keys the pure ``BudgetedMap`` holds (restarts change nothing it would not)."""
    import tempfile

    limits = StoreLimits(max_entries=3, max_bytes=1_000, ttl_seconds=0)
    model: BudgetedMap[str, None] = BudgetedMap(limits)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "s.db"
        clock = Clock()
        store = open_responses(path, limits, clock)
        for op, n in ops:
            key = f"resp_{n}"
            clock.now += 1
            match op:
                case "put":
                    stored = record(key, "y" * (n * 40))
                    store.put(stored)
                    from mlx_responses.storage.memory import serialized_size

                    model.put(key, None, serialized_size(stored.to_json()), clock.now)
                case "get":
                    assert (store.get(key) is not None) == (model.nbytes(key) is not None)
                    model.get(key, clock.now)
                case "delete":
                    assert store.delete(key) == model.delete(key)
                case "reopen":
                    store.close()
                    store = open_responses(path, limits, clock)
        held = {f"resp_{n}" for n in range(7) if store.get(f"resp_{n}") is not None}
        assert held == set(model.keys())
        store.close()


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    Database(str(path)).close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this server"):
        Database(str(path))


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    path.write_bytes(b"not a database, " * 100)
    with pytest.raises(StoreError, match="cannot open the store"):
        Database(str(path))


def test_a_job_row_becomes_failed_at_restart_unless_its_record_exists(tmp_path: Path) -> None:
    path, clock = tmp_path / "s.db", Clock()
    limits = StoreLimits(10, 1 << 20, 0)
    store = open_responses(path, limits, clock)
    queued = {"background": True, "usage": None, "error": None, "model": "m", "created_at": 1}
    store.job_started(record("resp_running", status="queued", **queued))
    store.job_started(record("resp_done", status="queued", **queued))
    store.put(record("resp_done", **queued))  # its record ends its row
    store.close()
    store = open_responses(path, limits, clock)
    assert store.interrupted_jobs == 1
    failed = store.get("resp_running")
    done = store.get("resp_done")
    assert failed is not None
    assert done is not None
    assert failed.response["status"] == "failed"
    assert failed.response["error"] == {"code": "server_error", "message": RESTART_MESSAGE}
    assert [e["type"] for e in failed.events] == [
        "response.created",
        "response.queued",
        "response.failed",
    ]
    assert done.response["status"] == "completed"
    store.close()
    assert open_responses(path, limits, clock).interrupted_jobs == 0  # rows are gone


def test_conversations_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    limits = StoreLimits(10, 1 << 20, 0)
    store = SqliteConversationStorage(Database(str(path)), limits, clock=Clock())
    conv = ConversationRecord("conv_1", 5, {"k": "v"}, ({"id": "msg_1", "type": "message"},))
    store.put(conv)
    store.close()
    store = SqliteConversationStorage(Database(str(path)), limits, clock=Clock())
    assert store.get("conv_1") == conv
    store.close()


def test_files_survive_reopen_with_their_deadlines(tmp_path: Path) -> None:
    path, clock = tmp_path / "s.db", Clock()
    limits = FileLimits(max_bytes=1 << 20, max_file_bytes=1 << 16, ttl_seconds=100)

    def stored(file_id: str) -> StoredFile:
        return StoredFile(file_id, "a.txt", "user_data", "text/plain", b"data", 1, 101, "t")

    store = SqliteFileStorage(Database(str(path)), limits, clock=clock)
    assert store.put(stored("file-short"), lifetime=10)
    assert store.put(stored("file-long"))
    assert store.put(stored("file-gone"))
    assert store.delete("file-gone", "t")
    store.close()
    clock.now += 11
    store = SqliteFileStorage(Database(str(path)), limits, clock=clock)
    assert store.get("file-short", "t") is None  # its expires_after ran out while down
    assert store.get("file-gone", "t") is None
    long = store.get("file-long", "t")
    assert long == stored("file-long")
    assert store.get("file-long", "other") is None  # another tenant's
    # The index holds metadata only; the bytes are read from the file by a get.
    (listed,) = store.list("t")
    assert (listed.id, listed.size, listed.data) == ("file-long", 4, b"")
    store.close()


async def test_the_actor_does_its_io_on_a_thread_of_its_own(tmp_path: Path) -> None:
    threads: list[str] = []
    limits = StoreLimits(10, 1 << 20, 0)
    budgets = Budgets(limits, limits)

    def open_backends() -> Backends:
        threads.append(threading.current_thread().name)
        storage = SqliteResponseStorage(Database(str(tmp_path / "s.db")), limits)
        return memory_backends(budgets, responses=storage)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            store = await nursery.start(partial(run_store, budgets, open_backends=open_backends))
            handle = store.responses
            await handle.put(record("resp_t"))
            got = await handle.get("resp_t")
            assert handle.statistics().entries == 1
            with pytest.raises(TypeError):
                await handle.put(StoredResponse({"id": "resp_bad", "x": {1}}))
            assert await handle.get("resp_t") is not None  # the actor kept serving
            nursery.cancel_scope.cancel()
    assert got is not None
    assert threads == ["store"]
    assert threading.current_thread().name != "store"
