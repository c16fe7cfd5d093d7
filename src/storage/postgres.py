"""The shared store of several replicas, in one PostgreSQL database (``--store
postgresql://...``): responses, background job rows and their live events, replica
leases, conversations and files, under the very same flags as the memory and SQLite backends.

Invariants:
- The store actor opens one ``PgDatabase`` per part (one ``psycopg`` connection, autocommit,
  every write an explicit transaction) on its ``StorageThread`` and uses them only there; the
  replica link's worker and listener threads (``actors/replica_link.py``, with the queries of
  ``postgres_jobs.py``) hold their own. Trio never waits on the database.
- Durability: every write a caller is answered for is committed (PostgreSQL's
  ``synchronous_commit``, on by default) before the backend returns. Read recency (the LRU
  order refreshed by a ``get``) is committed with ``synchronous_commit = off``: a crash of the
  database may lose a few refreshes, nothing a user can see.
- Budgets are the database's, shared by every replica: a ``put`` takes the table's advisory
  lock, deletes the rows whose TTL (or file deadline) has run out, drops the key's old version,
  refuses a record over the whole byte budget, writes the record, then evicts the least
  recently used rows until the entry and byte limits both hold (``BudgetedMap``'s rules, the
  same serialised-JSON charge). Expired rows are removed by the next write and never read.
  ``statistics()`` counts what this replica removed, with the entries and bytes held as of its
  last write.
- Tenant scoping: every record's key is ``scoped(owner, id)`` and every query names the key
  (or, to list files, the owner), so another tenant's object is absent.
- Schema: ``postgres_schema.py`` (forward-only migrations applied at each connection's open).
- Background jobs: ``jobs`` holds each stored running job's queued object, the replica running
  it and its live snapshot; ``job_events`` its events so far (published by its replica, read by
  the others). The job's final record put deletes both in one transaction and notifies
  ``mlx_progress``. Each replica holds a lease row in ``replicas`` (database clock) that it
  renews; ``sweep_dead_replicas`` (run by every replica, at start and then periodically) stores
  each job of a replica whose lease expired ``failed`` (``LEASE_MESSAGE``) and removes it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import psycopg

from ..protocol.records import failed_unstarted
from .files import FileLimits, StoredFile, charged_bytes
from .interface import (
    ConversationEdit,
    ConversationRecord,
    StoredResponse,
    StoreLimits,
    StoreStatistics,
    change_in_place,
    scoped,
)
from .memory import encode_json
from .postgres_schema import (
    LEASE_LOCK,
    LEASE_MESSAGE,
    NOW,
    PROGRESS_CHANNEL,
    SCHEMA_VERSION,
    TABLE_LOCKS,
    PgDatabase,
)
from .sqlite import StoreError, compress, decompress_json

Clock = Callable[[], float]


class _JsonRecord(Protocol):
    @property
    def key(self) -> str: ...
    @property
    def owner(self) -> str: ...
    def to_json(self) -> Any: ...


R = TypeVar("R")


class _PgTable:
    """One table of budgeted records (responses, conversations or files)."""

    def __init__(self, db: PgDatabase, table: str, limits: StoreLimits, clock: Clock) -> None:
        if limits.max_entries < 0 or limits.max_bytes < 0 or limits.ttl_seconds < 0:
            raise ValueError(f"store limits must not be negative: {limits}")
        self._db = db
        self._table = table
        self._store_limits = limits
        self._clock = clock
        self._entries = 0
        self._bytes = 0
        self._evictions = 0
        self._expirations = 0
        self._rejections = 0
        with db.transaction() as conn:  # flags smaller than the data's take effect at start
            self._lock(conn)
            self._expire(conn, clock())
            self._evict(conn)

    def _lock(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (TABLE_LOCKS[self._table],))

    def _readable(self) -> str:
        """The SQL condition of a row still readable at ``%(now)s``."""
        ttl = self._store_limits.ttl_seconds
        alive = "(deadline IS NULL OR deadline > %(now)s)"
        return f"written_at + {float(ttl)!r} > %(now)s AND {alive}" if ttl > 0 else alive

    def _expire(self, conn: psycopg.Connection[Any], now: float) -> None:
        cur = conn.execute(
            f"DELETE FROM {self._table} WHERE NOT ({self._readable()})",
            {"now": now},
        )
        self._expirations += max(cur.rowcount, 0)

    def _evict(self, conn: psycopg.Connection[Any]) -> None:
        """Least recently used rows out until both limits hold; then the totals."""
        limits = self._store_limits
        entries, nbytes = self._totals(conn)
        if entries > limits.max_entries or nbytes > limits.max_bytes:
            cur = conn.execute(
                f"""DELETE FROM {self._table} WHERE key IN (
                    SELECT key FROM (
                        SELECT key, sum(nbytes) OVER w AS total, row_number() OVER w AS n
                        FROM {self._table}
                        WINDOW w AS (ORDER BY used DESC ROWS UNBOUNDED PRECEDING)) AS ranked
                    WHERE total > %s OR n > %s)""",
                (limits.max_bytes, limits.max_entries),
            )
            self._evictions += max(cur.rowcount, 0)
            entries, nbytes = self._totals(conn)
        self._entries, self._bytes = entries, nbytes

    def _totals(self, conn: psycopg.Connection[Any]) -> tuple[int, int]:
        row = conn.execute(
            f"SELECT count(*), coalesce(sum(nbytes), 0) FROM {self._table}"
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def _write(
        self,
        key: str,
        owner: str,
        blob: bytes,
        nbytes: int,
        *,
        deadline: float | None = None,
        data: bytes | None = None,
        after: Callable[[psycopg.Connection[Any]], None] | None = None,
        refuse: bool = False,
    ) -> bool:
        """Put one row under the budget (``refuse``: only drop the old version); kept?"""
        now = self._clock()
        limits = self._store_limits
        with self._db.transaction() as conn:
            self._lock(conn)
            self._expire(conn, now)
            conn.execute(f"DELETE FROM {self._table} WHERE key = %s", (key,))
            kept = not refuse
            if kept and (
                limits.max_entries == 0 or limits.max_bytes == 0 or nbytes > limits.max_bytes
            ):
                self._rejections += 1
                kept = False
            if kept:
                conn.execute(
                    f"INSERT INTO {self._table} (key, owner, blob, nbytes, written_at, used, "
                    "deadline, data, uploaded) VALUES "
                    "(%s, %s, %s, %s, %s, nextval('mlx_use'), %s, %s, nextval('mlx_use'))",
                    (key, owner, blob, nbytes, now, deadline, data),
                )
            self._evict(conn)
            if after is not None:
                after(conn)
        return kept

    def _read(self, key: str, columns: str) -> tuple[Any, ...] | None:
        """The row's ``columns`` if readable (its recency refreshed), else None."""
        with self._db.transaction() as conn:
            conn.execute("SET LOCAL synchronous_commit = off")
            return conn.execute(
                f"UPDATE {self._table} SET used = nextval('mlx_use') "
                f"WHERE key = %(key)s AND {self._readable()} RETURNING {columns}",
                {"key": key, "now": self._clock()},
            ).fetchone()

    def delete(self, key: str) -> bool:
        now = self._clock()
        with self._db.transaction() as conn:
            self._lock(conn)
            self._expire(conn, now)
            cur = conn.execute(f"DELETE FROM {self._table} WHERE key = %s", (key,))
            self._entries, self._bytes = self._totals(conn)
        return cur.rowcount > 0

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            entries=self._entries,
            bytes=self._bytes,
            evictions=self._evictions,
            expirations=self._expirations,
            rejections=self._rejections,
        )

    def close(self) -> None:
        self._db.close()


class _PgRecords(_PgTable, Generic[R]):
    def __init__(
        self,
        db: PgDatabase,
        table: str,
        limits: StoreLimits,
        decode: Callable[[Any], R],
        clock: Clock,
    ) -> None:
        super().__init__(db, table, limits, clock)
        self._decode = decode

    @property
    def limits(self) -> StoreLimits:
        return self._store_limits

    def _put(
        self, record: _JsonRecord, after: Callable[[psycopg.Connection[Any]], None] | None = None
    ) -> None:
        data = encode_json(record.to_json())
        self._write(record.key, record.owner, compress(data), len(data), after=after)

    def get(self, key: str) -> R | None:
        row = self._read(key, "blob")
        return None if row is None else self._decode(decompress_json(row[0]))


def lease_failed(record: StoredResponse) -> StoredResponse:
    """The stored answer for a job whose replica stopped: ``failed``, saying so; its stream
    replays as ``created``, ``queued``, ``failed``."""
    return failed_unstarted(record.response, record.input_items, record.owner, LEASE_MESSAGE)


class PgResponseStorage(_PgRecords[StoredResponse]):
    """Stored responses and the rows of running background jobs (owned by ``replica_id``)."""

    def __init__(
        self,
        db: PgDatabase,
        limits: StoreLimits,
        replica_id: str = "",
        *,
        lease_seconds: float = 10.0,
        clock: Clock = time.time,
    ) -> None:
        super().__init__(db, "responses", limits, StoredResponse.from_json, clock)
        self.replica_id = replica_id
        if replica_id:
            register_replica(db, replica_id, lease_seconds)
        self.interrupted_jobs = self.sweep_dead_replicas()

    def put(self, record: StoredResponse) -> None:
        self._put(record, after=lambda conn: _end_job(conn, record.key))

    def job_started(self, record: StoredResponse) -> None:
        with self._db.transaction() as conn:
            conn.execute(
                "INSERT INTO jobs (key, blob, started_at, replica) VALUES (%s, %s, "
                f"{NOW}, %s) ON CONFLICT (key) DO UPDATE SET blob = EXCLUDED.blob, "
                "replica = EXCLUDED.replica, snapshot = NULL",
                (record.key, compress(encode_json(record.to_json())), self.replica_id),
            )

    def sweep_dead_replicas(self) -> int:
        """Store every job of a replica whose lease has expired (or that has no lease row)
        ``failed`` unless its record exists, and drop those jobs and leases; how many."""
        with self._db.transaction() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (LEASE_LOCK,))
            rows = conn.execute(
                "SELECT j.key, j.blob FROM jobs j LEFT JOIN replicas r ON r.id = j.replica "
                f"WHERE r.id IS NULL OR r.expires_at < {NOW} ORDER BY j.started_at"
            ).fetchall()
            conn.execute(f"DELETE FROM replicas WHERE expires_at < {NOW}")
            failed = 0
            for key, blob in rows:
                held = conn.execute("SELECT 1 FROM responses WHERE key = %s", (key,)).fetchone()
                if held is None:
                    self.put(lease_failed(StoredResponse.from_json(decompress_json(blob))))
                    failed += 1
                else:
                    _end_job(conn, str(key))
        return failed


def _end_job(conn: psycopg.Connection[Any], key: str) -> None:
    """Drop a job's row and events (with its record's put); followers are woken."""
    ended = conn.execute("DELETE FROM jobs WHERE key = %s RETURNING 1", (key,)).fetchone()
    if ended is not None:
        conn.execute("SELECT pg_notify(%s, %s)", (PROGRESS_CHANNEL, f"{key}\tend"))


def register_replica(db: PgDatabase, replica_id: str, lease_seconds: float) -> None:
    """Take (or renew) ``replica_id``'s lease for ``lease_seconds`` of the database's clock."""
    with db.transaction() as conn:
        conn.execute(
            f"INSERT INTO replicas (id, started_at, expires_at) VALUES (%s, {NOW}, {NOW} + %s) "
            f"ON CONFLICT (id) DO UPDATE SET expires_at = {NOW} + %s",
            (replica_id, lease_seconds, lease_seconds),
        )


def release_replica(db: PgDatabase, replica_id: str) -> None:
    with db.transaction() as conn:
        conn.execute("DELETE FROM replicas WHERE id = %s", (replica_id,))


class PgConversationStorage(_PgRecords[ConversationRecord]):
    """Conversations, one row each (an append rewrites the row)."""

    def __init__(self, db: PgDatabase, limits: StoreLimits, *, clock: Clock = time.time) -> None:
        super().__init__(db, "conversations", limits, ConversationRecord.from_json, clock)

    def put(self, record: ConversationRecord) -> None:
        self._put(record)

    def change(self, conversation_id: str, edit: ConversationEdit) -> ConversationRecord | None:
        """Read, edit and write in one transaction holding the table's lock, so two replicas
        appending to one conversation at once both keep their items."""
        with self._db.transaction() as conn:
            self._lock(conn)
            return change_in_place(self, conversation_id, edit)


def _file_meta(record: StoredFile) -> bytes:
    return encode_json(
        {
            "id": record.id,
            "filename": record.filename,
            "purpose": record.purpose,
            "content_type": record.content_type,
            "created_at": record.created_at,
            "expires_at": record.expires_at,
            "owner": record.owner,
            "size": record.size,
        }
    )


def _file_from(meta: bytes, data: bytes | None) -> StoredFile:
    m = json.loads(meta)
    return StoredFile(
        m["id"],
        m["filename"],
        m["purpose"],
        m["content_type"],
        b"" if data is None else bytes(data),
        int(m["created_at"]),
        m["expires_at"],
        m["owner"],
        None if data is not None else int(m["size"]),
    )


class PgFileStorage(_PgTable):
    """Uploaded files: metadata and bytes in one row each, under the file flags."""

    def __init__(self, db: PgDatabase, limits: FileLimits, *, clock: Clock = time.time) -> None:
        super().__init__(db, "files", limits.store_limits(), clock)
        self._file_limits = limits

    @property
    def limits(self) -> FileLimits:
        return self._file_limits

    def put(self, record: StoredFile, *, lifetime: float | None = None) -> bool:
        key = scoped(record.owner, record.id)
        deadline = None if lifetime is None else self._clock() + lifetime
        return self._write(
            key,
            record.owner,
            _file_meta(record),
            charged_bytes(record),
            deadline=deadline,
            data=record.data,
            refuse=record.size > self._file_limits.max_file_bytes,
        )

    def get(self, file_id: str, owner: str = "") -> StoredFile | None:
        row = self._read(scoped(owner, file_id), "blob, data")
        return None if row is None else _file_from(row[0], row[1])

    def list(self, owner: str = "", purpose: str | None = None) -> tuple[StoredFile, ...]:
        rows = self._db.conn.execute(
            f"SELECT blob FROM files WHERE owner = %(owner)s AND {self._readable()} "
            "ORDER BY uploaded",
            {"owner": owner, "now": self._clock()},
        ).fetchall()
        found = (_file_from(row[0], None) for row in rows)
        return tuple(f for f in found if purpose is None or f.purpose == purpose)

    def delete(self, file_id: str, owner: str = "") -> bool:
        return super().delete(scoped(owner, file_id))


__all__ = [
    "LEASE_MESSAGE",
    "SCHEMA_VERSION",
    "PgConversationStorage",
    "PgDatabase",
    "PgFileStorage",
    "PgResponseStorage",
    "StoreError",
]
