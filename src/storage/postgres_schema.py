"""The shared PostgreSQL store's schema and connections: forward-only migrations,
the advisory locks and channels every replica agrees on, and ``PgDatabase``.

Invariants:
- ``mlx_schema.version`` is the number of ``MIGRATIONS`` applied; each connection applies the
  missing ones at open, forward only, under ``MIGRATION_LOCK`` (replicas starting together
  take turns); a database written by a newer server is refused (``StoreError``).
- A ``PgDatabase`` is one autocommit connection used by one thread only; every write is an
  explicit ``transaction``.
- A password never appears in a message or a log line (``redact``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from .sqlite import StoreError

_TABLE = """CREATE TABLE {name} (
    key TEXT PRIMARY KEY, owner TEXT NOT NULL, blob BYTEA NOT NULL, nbytes BIGINT NOT NULL,
    written_at DOUBLE PRECISION NOT NULL, used BIGINT NOT NULL, deadline DOUBLE PRECISION,
    data BYTEA, uploaded BIGINT NOT NULL)"""

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        "CREATE SEQUENCE mlx_use",
        _TABLE.format(name="responses"),
        _TABLE.format(name="conversations"),
        _TABLE.format(name="files"),
        "CREATE INDEX responses_used ON responses (used)",
        "CREATE INDEX conversations_used ON conversations (used)",
        "CREATE INDEX files_used ON files (used)",
        "CREATE INDEX files_owner ON files (owner, uploaded)",
        """CREATE TABLE replicas (
            id TEXT PRIMARY KEY, started_at DOUBLE PRECISION NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL)""",
        """CREATE TABLE jobs (
            key TEXT PRIMARY KEY, blob BYTEA NOT NULL, started_at DOUBLE PRECISION NOT NULL,
            replica TEXT NOT NULL, snapshot BYTEA)""",
        """CREATE TABLE job_events (
            key TEXT NOT NULL REFERENCES jobs (key) ON DELETE CASCADE, seq INTEGER NOT NULL,
            event BYTEA NOT NULL, PRIMARY KEY (key, seq))""",
    ),
)
"""Forward-only schema migrations; ``MIGRATIONS[n]`` takes a database from version n to n+1."""
SCHEMA_VERSION = len(MIGRATIONS)

MIGRATION_LOCK = 7_150_001
LEASE_LOCK = 7_150_002
TABLE_LOCKS = {"responses": 7_150_011, "conversations": 7_150_012, "files": 7_150_013}
PROGRESS_CHANNEL = "mlx_progress"
CANCEL_CHANNEL = "mlx_cancel"
NOW = "EXTRACT(EPOCH FROM clock_timestamp())::double precision"

LEASE_MESSAGE = (
    "The replica running this background response stopped before it finished (its lease "
    "expired); it was not resumed. Create it again."
)


def connect(url: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise StoreError(f"cannot open the store {redact(url)}: {exc}") from exc


def redact(url: str) -> str:
    """``url`` without its password (for messages and logs)."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    return f"{scheme}{sep}{credentials.split(':', 1)[0]}:***@{host}"


class PgDatabase:
    """One connection to the shared database, migrated; used by one thread only."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn = connect(url)
        try:
            self._migrate()
        except BaseException as exc:
            self.conn.close()
            if isinstance(exc, psycopg.Error):
                raise StoreError(f"cannot use the store {redact(url)}: {exc}") from exc
            raise

    def _migrate(self) -> None:
        with self.transaction() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute("CREATE TABLE IF NOT EXISTS mlx_schema (version INTEGER NOT NULL)")
            row = conn.execute("SELECT version FROM mlx_schema").fetchone()
            if row is None:
                conn.execute("INSERT INTO mlx_schema (version) VALUES (0)")
            version = 0 if row is None else int(row[0])
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"the store {redact(self.url)} has schema version {version}, newer than "
                    f"this server's {SCHEMA_VERSION}; upgrade mlx-responses or use another store"
                )
            for step in MIGRATIONS[version:]:
                for statement in step:
                    conn.execute(statement)
            conn.execute("UPDATE mlx_schema SET version = %s", (SCHEMA_VERSION,))

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """One transaction, committed on leaving, rolled back on an error (a savepoint when
        nested)."""
        with self.conn.transaction():
            yield self.conn

    def close(self) -> None:
        self.conn.close()
