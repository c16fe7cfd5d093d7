"""The replica link's queries on the shared PostgreSQL store: a running job's live
events and snapshot, a follower's reads, and cancels between replicas.

Invariants:
- Each runs on a connection of the replica link's own threads (``actors/replica_link.py``),
  never on the store actor's.
- A job's events are written by the one replica running it, in sequence order, while its
  ``jobs`` row exists; a read returns only the unbroken run of events from ``start``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from .interface import JsonObject, StoredResponse
from .memory import encode_json
from .postgres_schema import CANCEL_CHANNEL, PROGRESS_CHANNEL
from .sqlite import compress, decompress_json


def publish_events(
    conn: psycopg.Connection[Any],
    key: str,
    first: int,
    events: Sequence[JsonObject],
    snapshot: JsonObject,
) -> bool:
    """Append a running job's events from sequence ``first`` and its snapshot, and notify
    ``mlx_progress``; False when the job has ended (its row is gone: nothing is written)."""
    try:
        with conn.transaction():
            conn.execute("SET LOCAL synchronous_commit = off")
            updated = conn.execute(
                "UPDATE jobs SET snapshot = %s WHERE key = %s",
                (compress(encode_json(snapshot)), key),
            )
            if updated.rowcount == 0:
                return False
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO job_events (key, seq, event) VALUES (%s, %s, %s) "
                    "ON CONFLICT DO NOTHING",
                    [(key, first + n, encode_json(e)) for n, e in enumerate(events)],
                )
            last = first + len(events) - 1
            conn.execute("SELECT pg_notify(%s, %s)", (PROGRESS_CHANNEL, f"{key}\t{last}"))
    except pg_errors.ForeignKeyViolation:
        return False  # the job ended between the update and the insert
    return True


def read_events(conn: psycopg.Connection[Any], key: str, start: int) -> tuple[list[Any], bool]:
    """A job's published events from ``start`` on, and whether the job is still running."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        running = conn.execute("SELECT 1 FROM jobs WHERE key = %s", (key,)).fetchone()
        rows = conn.execute(
            "SELECT seq, event FROM job_events WHERE key = %s AND seq >= %s ORDER BY seq",
            (key, start),
        ).fetchall()
    events: list[Any] = []
    for seq, event in rows:
        if int(seq) != start + len(events):
            break
        events.append(json.loads(event))
    return events, running is not None


def read_job(conn: psycopg.Connection[Any], key: str) -> tuple[str, JsonObject] | None:
    """A running job's replica and its latest snapshot (its queued object before any)."""
    row = conn.execute("SELECT replica, snapshot, blob FROM jobs WHERE key = %s", (key,)).fetchone()
    if row is None:
        return None
    if row[1] is not None:
        return str(row[0]), decompress_json(row[1])
    return str(row[0]), StoredResponse.from_json(decompress_json(row[2])).response


def send_cancel(conn: psycopg.Connection[Any], key: str, owner: str, response_id: str) -> bool:
    """Ask the replica running job ``key`` to cancel it; False if no such job is running."""
    with conn.transaction():
        row = conn.execute("SELECT replica FROM jobs WHERE key = %s", (key,)).fetchone()
        if row is None:
            return False
        payload = json.dumps({"replica": row[0], "owner": owner, "id": response_id})
        conn.execute("SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, payload))
    return True
