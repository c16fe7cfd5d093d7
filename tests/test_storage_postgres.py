"""The PostgreSQL backends on their own, over a real PostgreSQL server (issue 15): spec 000's
budgets, TTLs and LRU over the shared database, decided exactly as the memory backends decide;
two backends on one database (two replicas) see each other's records; tenant scoping; schema
versions; a dead replica's job rows end ``failed`` once its lease expires."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlx_responses.storage.budget import BudgetedMap
from mlx_responses.storage.files import FileLimits, MemoryFileStorage, StoredFile
from mlx_responses.storage.interface import ConversationRecord, StoredResponse, StoreLimits
from mlx_responses.storage.memory import (
    MemoryConversationStorage,
    MemoryResponseStorage,
    serialized_size,
)
from mlx_responses.storage.postgres import (
    LEASE_MESSAGE,
    SCHEMA_VERSION,
    PgConversationStorage,
    PgDatabase,
    PgFileStorage,
    PgResponseStorage,
    StoreError,
)

from .postgres import PostgresServer
from .storage_records import Clock, record


def responses(url: str, limits: StoreLimits, clock: Clock, replica: str = "") -> PgResponseStorage:
    return PgResponseStorage(PgDatabase(url), limits, replica, lease_seconds=0.3, clock=clock)


def test_the_budget_matches_the_memory_backend(postgresql_url: str) -> None:
    """Same flags, same decisions (LRU order refreshed by gets, entry and byte limits)."""
    limits = StoreLimits(max_entries=8, max_bytes=2_000, ttl_seconds=0)
    memory = MemoryResponseStorage(limits, clock=Clock())
    shared = responses(postgresql_url, limits, Clock())
    for n in range(30):
        for store in (memory, shared):
            store.put(record(f"resp_{n}", "x" * (n * 37 % 300)))
            if n % 3 == 0:
                store.get(f"resp_{n // 2}")
    assert memory.statistics() == shared.statistics()
    held = [n for n in range(30) if memory.get(f"resp_{n}") is not None]
    assert held == [n for n in range(30) if shared.get(f"resp_{n}") is not None]
    big = record("resp_big", "y" * 3_000)  # over the whole budget: not kept, evicts nothing
    shared.put(big)
    assert shared.get("resp_big") is None
    assert shared.statistics().rejections == 1
    assert len([n for n in range(30) if shared.get(f"resp_{n}") is not None]) == len(held)
    shared.close()


_DATABASES: dict[int, str] = {}


def _shared_database(server: PostgresServer) -> str:
    """One database for every example of the Hypothesis test (emptied by each)."""
    if id(server) not in _DATABASES:
        _DATABASES[id(server)] = server.new_database()
        PgDatabase(_DATABASES[id(server)]).close()
    return _DATABASES[id(server)]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(st.sampled_from(["put", "get", "delete", "tick"]), st.integers(0, 6)),
        max_size=20,
    )
)
def test_random_operations_agree_with_the_pure_budget(
    postgresql_server: PostgresServer, ops: list[tuple[str, int]]
) -> None:
    """Any sequence of puts, gets, deletes and time passing: the database holds exactly the
    keys the pure ``BudgetedMap`` holds."""
    limits = StoreLimits(max_entries=3, max_bytes=1_000, ttl_seconds=5)
    model: BudgetedMap[str, None] = BudgetedMap(limits)
    clock = Clock()
    url = _shared_database(postgresql_server)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE responses, jobs, replicas CASCADE")
    store = responses(url, limits, clock)
    for op, n in ops:
        key = f"resp_{n}"
        clock.now += 1
        match op:
            case "put":
                stored = record(key, "y" * (n * 40))
                store.put(stored)
                model.put(key, None, serialized_size(stored.to_json()), clock.now)
            case "get":
                model.get(key, clock.now)  # expires, then refreshes (its value is None)
                assert (store.get(key) is not None) == (model.nbytes(key) is not None)
            case "delete":
                model.expire(clock.now)
                assert store.delete(key) == model.delete(key)
            case "tick":
                clock.now += n
    held = {f"resp_{n}" for n in range(7) if store.get(f"resp_{n}") is not None}
    assert held == set(model.keys(clock.now))
    store.close()


def test_ttl_runs_from_the_write_and_a_get_does_not_extend_it(postgresql_url: str) -> None:
    clock = Clock()
    limits = StoreLimits(10, 1 << 20, ttl_seconds=10)
    store = responses(postgresql_url, limits, clock)
    store.put(record("resp_a"))
    clock.now += 9
    assert store.get("resp_a") is not None
    clock.now += 1
    assert store.get("resp_a") is None
    store.put(record("resp_b"))  # the next write removes the expired row
    assert store.statistics().expirations == 1
    assert store.statistics().entries == 1
    store.close()


def test_two_replicas_share_records_and_tenants_stay_apart(postgresql_url: str) -> None:
    limits = StoreLimits(10, 1 << 20, 0)
    a = responses(postgresql_url, limits, Clock(), "replica-a")
    b = responses(postgresql_url, limits, Clock(), "replica-b")
    a.put(record("resp_1", owner="alice"))
    got = b.get(StoredResponse({"id": "resp_1"}, owner="alice").key)
    assert got == record("resp_1", owner="alice")
    assert b.get(StoredResponse({"id": "resp_1"}, owner="bob").key) is None
    assert b.get("resp_1") is None
    assert b.delete(got.key)
    assert a.get(got.key) is None
    conv_a = PgConversationStorage(PgDatabase(postgresql_url), limits)
    conv_b = PgConversationStorage(PgDatabase(postgresql_url), limits)
    conv = ConversationRecord("conv_1", 5, {"k": "v"}, ({"id": "msg_1", "type": "message"},))
    conv_a.put(conv)
    assert conv_b.get("conv_1") == conv
    for store in (a, b, conv_a, conv_b):
        store.close()


def test_conversations_follow_the_memory_budget(postgresql_url: str) -> None:
    limits = StoreLimits(max_entries=3, max_bytes=600, ttl_seconds=0)
    memory = MemoryConversationStorage(limits, clock=Clock())
    shared = PgConversationStorage(PgDatabase(postgresql_url), limits, clock=Clock())
    for n in range(8):
        conv = ConversationRecord(f"conv_{n}", n, {}, ({"id": f"msg_{n}", "text": "z" * n * 20},))
        for store in (memory, shared):
            store.put(conv)
            store.get("conv_1")
    assert memory.statistics() == shared.statistics()
    assert [n for n in range(8) if memory.get(f"conv_{n}")] == [
        n for n in range(8) if shared.get(f"conv_{n}")
    ]
    shared.close()


def test_files_keep_bytes_deadlines_and_tenants(postgresql_url: str) -> None:
    clock = Clock()
    limits = FileLimits(max_bytes=3_000, max_file_bytes=1_500, ttl_seconds=100)
    memory = MemoryFileStorage(limits, clock=clock)
    shared = PgFileStorage(PgDatabase(postgresql_url), limits, clock=clock)
    other = PgFileStorage(PgDatabase(postgresql_url), limits, clock=clock)

    def stored(file_id: str, size: int = 4, owner: str = "t") -> StoredFile:
        return StoredFile(file_id, "a.txt", "user_data", "text/plain", b"d" * size, 1, 101, owner)

    for store in (memory, shared):
        assert store.put(stored("file-short"), lifetime=10)
        assert store.put(stored("file-long", 1_000))
        assert not store.put(stored("file-huge", 2_000))  # over the per-file limit
        assert store.put(stored("file-b", 1_200, owner="u"))
        assert store.put(stored("file-c", 1_200))  # evicts the least recently used
    clock.now += 11
    for store in (memory, shared):
        assert store.get("file-short", "t") is None  # its expires_after ran out
    assert [f.id for f in memory.list("t")] == [f.id for f in other.list("t")]
    assert [f.id for f in other.list("u")] == [f.id for f in memory.list("u")]
    assert memory.statistics() == shared.statistics()
    for file_id, owner in (("file-long", "t"), ("file-b", "u"), ("file-c", "t")):
        assert other.get(file_id, owner) == memory.get(file_id, owner)
    assert other.get("file-c", "u") is None  # another tenant's
    assert other.delete("file-c", "t")
    assert shared.get("file-c", "t") is None
    shared.close()
    other.close()


def test_a_newer_schema_is_refused(postgresql_url: str) -> None:
    PgDatabase(postgresql_url).close()
    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM mlx_schema").fetchone() == (SCHEMA_VERSION,)
        conn.execute("UPDATE mlx_schema SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreError, match="newer than this server"):
        PgDatabase(postgresql_url)


def test_an_unreachable_database_is_refused_with_its_url() -> None:
    with pytest.raises(StoreError, match=r"cannot open the store postgresql://u:\*\*\*@"):
        PgDatabase("postgresql://u:secret@127.0.0.1:1/db")


def test_a_dead_replicas_jobs_end_failed_once_its_lease_expires(postgresql_url: str) -> None:
    limits = StoreLimits(10, 1 << 20, 0)
    a = responses(postgresql_url, limits, Clock(), "replica-a")
    queued = {"background": True, "usage": None, "error": None, "model": "m", "created_at": 1}
    a.job_started(record("resp_running", status="queued", **queued))
    a.job_started(record("resp_done", status="queued", **queued))
    a.put(record("resp_done", **queued))  # its record ends its row
    b = responses(postgresql_url, limits, Clock(), "replica-b")
    assert b.interrupted_jobs == 0  # a's lease holds
    assert b.get("resp_running") is None
    deadline = time.monotonic() + 10
    while b.sweep_dead_replicas() == 0:  # a never renews: its 0.3 s lease runs out
        assert time.monotonic() < deadline
        time.sleep(0.05)
    failed = b.get("resp_running")
    assert failed is not None
    assert failed.response["status"] == "failed"
    assert failed.response["error"] == {"code": "server_error", "message": LEASE_MESSAGE}
    assert [e["type"] for e in failed.events] == [
        "response.created",
        "response.queued",
        "response.failed",
    ]
    assert b.get("resp_done") is not None
    assert b.get("resp_done").response["status"] == "completed"  # type: ignore[union-attr]
    assert b.sweep_dead_replicas() == 0
    a.close()
    b.close()


def test_the_store_flag_takes_a_postgresql_url_and_a_lease() -> None:
    from mlx_responses.cli import build_parser, settings_from_args
    from mlx_responses.storage.choice import StoreChoice

    url = "postgresql://mlx:pw@db.example:5432/mlx"
    args = build_parser({}).parse_args(["serve", "--store", url, "--replica-lease-secs", "2.5"])
    settings = settings_from_args(args)
    assert settings.store == StoreChoice("postgresql", url)
    assert settings.store.describe() == "postgresql://mlx:***@db.example:5432/mlx"
    assert settings.replica_lease_seconds == 2.5
    from_env = build_parser({"MLX_RESPONSES_STORE": url}).parse_args(["serve"])
    assert settings_from_args(from_env).store == StoreChoice("postgresql", url)
    zero = build_parser({}).parse_args(["serve", "--store", url, "--replica-lease-secs", "0"])
    with pytest.raises(SystemExit, match="--replica-lease-secs must be above 0"):
        settings_from_args(zero)


def test_two_replicas_appending_to_one_conversation_at_once_keep_every_item(
    postgresql_url: str,
) -> None:
    """Each replica's conversation actor reads, edits and writes; over one shared database
    the two must not overwrite each other's turns."""
    limits = StoreLimits(10, 1 << 20, 0)
    stores = [PgConversationStorage(PgDatabase(postgresql_url), limits) for _ in range(2)]
    stores[0].put(ConversationRecord("conv_1", 5, {}, ()))
    appends = 40

    def append_all(store: PgConversationStorage, name: str) -> None:
        for n in range(appends):
            item = {"id": f"{name}_{n}", "type": "message"}
            store.change("conv_1", lambda c, item=item: replace(c, items=(*c.items, item)))

    threads = [
        threading.Thread(target=append_all, args=(store, name))
        for store, name in zip(stores, ("a", "b"), strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive()
    held = stores[1].get("conv_1")
    assert held is not None
    ids = [item["id"] for item in held.items]
    assert sorted(ids) == sorted(f"{name}_{n}" for name in "ab" for n in range(appends))
    for store in stores:
        store.close()
