"""Durable storage in one SQLite file (the default store, decision 11): responses, background
job rows, conversations and files, under the very same budgets as the memory backends.

Invariants:
- Each store actor opens its own ``Database`` (one ``sqlite3`` connection) on its own
  ``StorageThread`` and uses it only there; the file is shared by the actors (WAL mode, so a
  reader never waits for a writer and the writers take turns, ``busy_timeout``).
- Durability: every write that a caller is answered for (put, delete, job row) is committed
  with ``synchronous=FULL`` before the backend returns, so an acknowledged record survives a
  SIGKILL and a power cut. Bookkeeping that loses nothing a user can see is written lazily,
  with the next commit: least-recently-used order refreshed by reads, and the deletion of rows
  that expired (an expired row read back at start expires again at once, by its write time).
- Budgets: the same ``BudgetedMap`` core as the memory backends decides every eviction and
  expiry, over an in-memory index of ``key -> (serialised size, write time)``; the records'
  bytes live only in the file. A record is charged its serialised JSON size (what the memory
  backend holds), so the flags mean the same on every backend; on disk it is zlib-compressed.
  Time is the wall clock (``time.time``), so TTLs run across restarts.
- Start-up: the schema is migrated forward (``PRAGMA user_version`` is the number of
  ``MIGRATIONS`` applied; a file from a newer server is refused, never downgraded); the index
  is rebuilt from the rows in least-recently-used order, and trimmed to the current flags.
- Background jobs: a stored job's queued object is kept in ``jobs`` from its start until its
  record is put (same transaction as the put). Rows left at start belong to jobs a restart
  interrupted: each becomes a ``failed`` stored response ("the server restarted") unless its
  record exists, and the rows are removed. Jobs are not resumed (docs/stores.md says why).
- Files: metadata and bytes are rows of ``files``; the file store keeps an in-memory
  ``MemoryFileStorage`` of metadata-only copies (``stored_size``; budget, TTL, per-file
  deadlines, upload order) as the index and writes through, so the Files API behaves exactly as
  with ``--store memory``; a ``get`` reads the bytes from the file.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Generic, Protocol, TypeVar

from ..protocol.records import failed_unstarted
from .budget import BudgetedMap
from .files import FileLimits, MemoryFileStorage, StoredFile
from .interface import (
    ConversationEdit,
    ConversationRecord,
    StoredResponse,
    StoreLimits,
    StoreStatistics,
    change_in_place,
)
from .memory import encode_json

Clock = Callable[[], float]

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE responses (
            key TEXT PRIMARY KEY, blob BLOB NOT NULL, nbytes INTEGER NOT NULL,
            written_at REAL NOT NULL, used INTEGER NOT NULL)""",
        """CREATE TABLE conversations (
            key TEXT PRIMARY KEY, blob BLOB NOT NULL, nbytes INTEGER NOT NULL,
            written_at REAL NOT NULL, used INTEGER NOT NULL)""",
        """CREATE TABLE jobs (
            key TEXT PRIMARY KEY, blob BLOB NOT NULL, started_at REAL NOT NULL)""",
        """CREATE TABLE files (
            owner TEXT NOT NULL, id TEXT NOT NULL, filename TEXT NOT NULL,
            purpose TEXT NOT NULL, content_type TEXT NOT NULL, created_at INTEGER NOT NULL,
            expires_at INTEGER, written_at REAL NOT NULL, lifetime REAL, data BLOB NOT NULL,
            PRIMARY KEY (owner, id))""",
    ),
)
"""Forward-only schema migrations; ``MIGRATIONS[n]`` takes a file from version n to n + 1."""
SCHEMA_VERSION = len(MIGRATIONS)

RESTART_MESSAGE = (
    "The server restarted before this background response finished; it was not resumed. "
    "Create it again."
)


class StoreError(RuntimeError):
    """The store file cannot be used (a newer schema, not a database, ...)."""


def compress(data: bytes) -> bytes:
    return zlib.compress(data, 6)


def decompress_json(blob: bytes) -> Any:
    return json.loads(zlib.decompress(blob))


class Database:
    """One connection to the store file, migrated; used by one thread only."""

    def __init__(self, path: str) -> None:
        self.path = path
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        try:
            self.conn = sqlite3.connect(path, isolation_level=None, timeout=30)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=FULL")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open the store {path}: {exc}") from exc

    def _migrate(self) -> None:
        with self.transaction() as conn:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"the store {self.path} has schema version {version}, newer than this "
                    f"server's {SCHEMA_VERSION}; upgrade mlx-responses or use another store"
                )
            for step in MIGRATIONS[version:]:
                for statement in step:
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, committed (durably) on leaving, rolled back on an error."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


class _JsonRecord(Protocol):
    @property
    def key(self) -> str: ...
    def to_json(self) -> Any: ...


R = TypeVar("R", bound=_JsonRecord)


class _SqliteRecords(Generic[R]):
    """Records in one table, under ``limits`` (``BudgetedMap`` over an in-memory index)."""

    def __init__(
        self,
        db: Database,
        table: str,
        limits: StoreLimits,
        decode: Callable[[Any], R],
        clock: Clock = time.time,
    ) -> None:
        self._db = db
        self._table = table
        self._decode = decode
        self._clock = clock
        self._map: BudgetedMap[str, None] = BudgetedMap(limits, track_removals=True)
        rows = db.conn.execute(
            f"SELECT key, nbytes, written_at, used FROM {table} ORDER BY used"
        ).fetchall()
        self._used = max((int(row[3]) for row in rows), default=0)
        self._touched: dict[str, int] = {}
        self._map.restore((str(k), None, int(n), float(w)) for k, n, w, _ in rows)
        with db.transaction() as conn:
            self._write_pending(conn)

    @property
    def limits(self) -> StoreLimits:
        return self._map.limits

    def _next_use(self) -> int:
        self._used += 1
        return self._used

    def _write_pending(self, conn: sqlite3.Connection) -> None:
        """Deletions of removed rows, then refreshed recency, inside ``conn``'s transaction."""
        removed = self._map.drain_removed()
        if removed:
            conn.executemany(f"DELETE FROM {self._table} WHERE key = ?", [(k,) for k in removed])
        if self._touched:
            conn.executemany(
                f"UPDATE {self._table} SET used = ? WHERE key = ?",
                [(used, key) for key, used in self._touched.items()],
            )
            self._touched.clear()

    def _after_put(self, conn: sqlite3.Connection, record: R) -> None:
        """More writes in the put's transaction (a subclass's)."""

    def put(self, record: R) -> None:
        data = encode_json(record.to_json())
        now = self._clock()
        key = record.key
        kept = self._map.put(key, None, len(data), now)
        with self._db.transaction() as conn:
            self._write_pending(conn)
            self._touched.pop(key, None)
            if kept:
                conn.execute(
                    f"INSERT OR REPLACE INTO {self._table} "
                    "(key, blob, nbytes, written_at, used) VALUES (?, ?, ?, ?, ?)",
                    (key, compress(data), len(data), now, self._next_use()),
                )
            self._after_put(conn, record)

    def held(self, key: str) -> bool:
        return self._map.nbytes(key) is not None

    def get(self, key: str) -> R | None:
        self._map.get(key, self._clock())
        if not self.held(key):
            return None
        row = self._db.conn.execute(
            f"SELECT blob FROM {self._table} WHERE key = ?", (key,)
        ).fetchone()
        if row is None:  # pragma: no cover - the file changed behind our back
            self._map.delete(key)
            return None
        self._touched[key] = self._next_use()
        return self._decode(decompress_json(row[0]))

    def delete(self, key: str) -> bool:
        self._map.expire(self._clock())
        removed = self._map.delete(key)
        with self._db.transaction() as conn:
            self._write_pending(conn)
        return removed

    def statistics(self) -> StoreStatistics:
        self._map.expire(self._clock())
        return self._map.statistics()

    def close(self) -> None:
        with self._db.transaction() as conn:
            self._write_pending(conn)
        self._db.close()


def restart_failed(record: StoredResponse) -> StoredResponse:
    """The stored answer for a background job a restart interrupted: ``failed``, with a
    message that says so, and a stream of ``created``, ``queued`` and ``failed`` rebuilt by
    the event machine (its replay tape is one ``Fail``)."""
    return failed_unstarted(record.response, record.input_items, record.owner, RESTART_MESSAGE)


class SqliteResponseStorage(_SqliteRecords[StoredResponse]):
    """Stored responses and the rows of running background jobs."""

    def __init__(self, db: Database, limits: StoreLimits, *, clock: Clock = time.time) -> None:
        super().__init__(db, "responses", limits, StoredResponse.from_json, clock)
        self.interrupted_jobs = self._fail_interrupted_jobs()

    def _fail_interrupted_jobs(self) -> int:
        rows = self._db.conn.execute("SELECT key, blob FROM jobs ORDER BY started_at").fetchall()
        failed = 0
        for key, blob in rows:
            if not self.held(str(key)):
                self.put(restart_failed(StoredResponse.from_json(decompress_json(blob))))
                failed += 1
        with self._db.transaction() as conn:
            conn.execute("DELETE FROM jobs")
        return failed

    def _after_put(self, conn: sqlite3.Connection, record: StoredResponse) -> None:
        conn.execute("DELETE FROM jobs WHERE key = ?", (record.key,))

    def job_started(self, record: StoredResponse) -> None:
        with self._db.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO jobs (key, blob, started_at) VALUES (?, ?, ?)",
                (record.key, compress(encode_json(record.to_json())), self._clock()),
            )


class SqliteConversationStorage(_SqliteRecords[ConversationRecord]):
    """Conversations, one row each (an append rewrites the row)."""

    def __init__(self, db: Database, limits: StoreLimits, *, clock: Clock = time.time) -> None:
        super().__init__(db, "conversations", limits, ConversationRecord.from_json, clock)

    def change(self, conversation_id: str, edit: ConversationEdit) -> ConversationRecord | None:
        return change_in_place(self, conversation_id, edit)  # one process: the lock file


_FileKey = tuple[str, str]


class SqliteFileStorage:
    """Uploaded files: ``MemoryFileStorage`` decides, every kept file is a row of ``files``."""

    def __init__(self, db: Database, limits: FileLimits, *, clock: Clock = time.time) -> None:
        self._db = db
        self._clock = clock
        self._at: float | None = None  # a fixed time while loading or writing
        self._mem = MemoryFileStorage(limits, clock=self._now)
        rows = db.conn.execute(
            "SELECT owner, id, filename, purpose, content_type, created_at, expires_at, "
            "written_at, lifetime, length(data) FROM files ORDER BY written_at"
        ).fetchall()
        for owner, id_, filename, purpose, ctype, created, expires, written, life, size in rows:
            self._at = float(written)
            stub = StoredFile(id_, filename, purpose, ctype, b"", created, expires, owner, size)
            self._mem.put(stub, lifetime=life)
        self._at = None
        self._persisted: set[_FileKey] = {(str(row[0]), str(row[1])) for row in rows}
        with db.transaction() as conn:
            self._write_removals(conn)

    def _now(self) -> float:
        return self._at if self._at is not None else self._clock()

    @property
    def limits(self) -> FileLimits:
        return self._mem.limits

    def _write_removals(self, conn: sqlite3.Connection) -> None:
        held = set(self._mem.held())
        gone = self._persisted - held
        if gone:
            conn.executemany("DELETE FROM files WHERE owner = ? AND id = ?", sorted(gone))
        self._persisted -= gone

    def put(self, record: StoredFile, *, lifetime: float | None = None) -> bool:
        now = self._at = self._clock()
        try:
            kept = self._mem.put(
                replace(record, data=b"", stored_size=record.size), lifetime=lifetime
            )
        finally:
            self._at = None
        with self._db.transaction() as conn:
            self._write_removals(conn)
            if kept:
                conn.execute(
                    "INSERT OR REPLACE INTO files (owner, id, filename, purpose, content_type, "
                    "created_at, expires_at, written_at, lifetime, data) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        record.owner,
                        record.id,
                        record.filename,
                        record.purpose,
                        record.content_type,
                        record.created_at,
                        record.expires_at,
                        now,
                        lifetime,
                        record.data,
                    ),
                )
                self._persisted.add((record.owner, record.id))
        return kept

    def get(self, file_id: str, owner: str = "") -> StoredFile | None:
        stub = self._mem.get(file_id, owner)
        if stub is None:
            return None
        row = self._db.conn.execute(
            "SELECT data FROM files WHERE owner = ? AND id = ?", (owner, file_id)
        ).fetchone()
        if row is None:  # pragma: no cover - the file changed behind our back
            return None
        return replace(stub, data=bytes(row[0]), stored_size=None)

    def list(self, owner: str = "", purpose: str | None = None) -> tuple[StoredFile, ...]:
        return self._mem.list(owner, purpose)

    def delete(self, file_id: str, owner: str = "") -> bool:
        removed = self._mem.delete(file_id, owner)
        with self._db.transaction() as conn:
            self._write_removals(conn)
        return removed

    def statistics(self) -> StoreStatistics:
        return self._mem.statistics()

    def close(self) -> None:
        with self._db.transaction() as conn:
            self._write_removals(conn)
        self._db.close()
