"""Which store backs the server (``--store``, ``--data-dir``), and the backends it opens.

Invariants:
- ``memory`` is the in-memory behaviour of docs/stores.md exactly: no file is touched, a
  restart forgets everything. ``sqlite`` (the command line's default) is one SQLite file,
  ``store.sqlite3`` in the data directory, or the file named by ``sqlite:PATH``.
- ``postgresql://...`` (or ``postgres://...``) is one PostgreSQL database shared by every
  replica that names it (``storage/postgres.py``); no lock file, each replica holds a lease.
- The opener returned (``backends_opener``) runs on the store actor's own thread
  (``StorageThread``), which is the thread that then uses every backend; memory backends
  (``memory_backends``) are served in the actor's own task.
- One server process per store file: ``backends_opener`` locks ``PATH.lock`` for the process's life;
  a second server on the same file stops at start with a message.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from .files import DEFAULT_FILE_LIMITS, FileLimits, FileStorage, MemoryFileStorage
from .interface import ConversationStorage, EchoStorage, ResponseStorage, StoreLimits
from .memory import (
    DEFAULT_ECHO_BYTES,
    MemoryConversationStorage,
    MemoryEchoStorage,
    MemoryResponseStorage,
)

STORE_FILE = "store.sqlite3"
APP_DIR = "mlx-responses"


@dataclass(frozen=True, slots=True)
class StoreChoice:
    kind: Literal["memory", "sqlite", "postgresql"]
    path: str = ""  # the SQLite file, or the PostgreSQL URL

    def describe(self) -> str:
        if self.kind == "postgresql":
            from .postgres_schema import redact

            return redact(self.path)
        return "memory" if self.kind == "memory" else f"sqlite:{self.path}"


MEMORY = StoreChoice("memory")


def default_data_dir(environ: Mapping[str, str] | None = None) -> str:
    """The platform's user data directory for the server: ``~/Library/Application
    Support/mlx-responses`` on macOS, ``$XDG_DATA_HOME/mlx-responses`` (default
    ``~/.local/share/mlx-responses``) elsewhere."""
    env = os.environ if environ is None else environ
    home = env.get("HOME") or os.path.expanduser("~")
    if sys.platform == "darwin":
        return os.path.join(home, "Library", "Application Support", APP_DIR)
    base = env.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")
    return os.path.join(base, APP_DIR)


def parse_store(value: str, data_dir: str) -> StoreChoice:
    """``memory``, ``sqlite`` (in ``data_dir``) or ``sqlite:PATH``; ValueError otherwise."""
    text = value.strip()
    if text == "memory":
        return MEMORY
    if text == "sqlite":
        return StoreChoice("sqlite", os.path.join(data_dir, STORE_FILE))
    if text.startswith("sqlite:"):
        path = text.removeprefix("sqlite:")
        path = path.removeprefix("//") if path.startswith("///") else path
        if not path:
            raise ValueError("--store sqlite:PATH needs a file path")
        return StoreChoice("sqlite", os.path.expanduser(path))
    if text.startswith(("postgresql://", "postgres://")):
        if not text.split("://", 1)[1].strip("/"):
            raise ValueError("--store postgresql://... needs a host or a database")
        return StoreChoice("postgresql", text)
    raise ValueError(
        "--store must be 'memory', 'sqlite', 'sqlite:PATH' or 'postgresql://...' "
        f"(got {value!r}; docs/stores.md)"
    )


_HELD: dict[str, int] = {}
"""Store files this process has locked (path -> lock file descriptor), for its lifetime."""


def lock_store(path: str) -> None:
    """Take the store file for this process (``PATH.lock``, ``flock``): one server per file.
    Re-entrant within a process (a server restarted in-process); released by the OS when the
    process ends, however it ends. Raises ``StoreError`` naming the holder otherwise."""
    from .sqlite import StoreError

    key = os.path.abspath(path)
    if key in _HELD:
        return
    os.makedirs(os.path.dirname(key), exist_ok=True)
    fd = os.open(f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise StoreError(
            f"the store {path} is in use by another mlx-responses server (pid {holder}); "
            "run one server per store file (docs/deploy.md)"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _HELD[key] = fd


@dataclass(frozen=True, slots=True)
class Budgets:
    """The store's flags, one budget per kind of record (docs/stores.md)."""

    responses: StoreLimits
    conversations: StoreLimits
    files: FileLimits = DEFAULT_FILE_LIMITS
    echo_bytes: int = DEFAULT_ECHO_BYTES


@dataclass(frozen=True, slots=True)
class Backends:
    """What the store actor serves: one backend per kind of record, all used by its one task
    (or its one thread) only."""

    responses: ResponseStorage
    conversations: ConversationStorage
    files: FileStorage
    echo: EchoStorage

    def close(self) -> None:
        """Close every part (each one, even when another's close raises)."""
        with contextlib.ExitStack() as stack:
            for part in (self.echo, self.files, self.conversations, self.responses):
                stack.callback(part.close)


def memory_backends(
    budgets: Budgets,
    *,
    responses: ResponseStorage | None = None,
    conversations: ConversationStorage | None = None,
    files: FileStorage | None = None,
    echo: EchoStorage | None = None,
) -> Backends:
    """The backends given, and in-memory ones for the others."""
    return Backends(
        MemoryResponseStorage(budgets.responses) if responses is None else responses,
        MemoryConversationStorage(budgets.conversations)
        if conversations is None
        else conversations,
        MemoryFileStorage(budgets.files) if files is None else files,
        MemoryEchoStorage(budgets.echo_bytes) if echo is None else echo,
    )


def backends_opener(
    choice: StoreChoice,
    budgets: Budgets,
    *,
    replica_id: str = "",
    lease_seconds: float = 10.0,
    responses: Callable[[], ResponseStorage] | None = None,
) -> Callable[[], Backends] | None:
    """What the store actor opens on its own thread (``StorageThread``), the durable backends
    of ``choice`` (``responses``, a test's fault injection, replaces the response backend);
    None for ``memory`` without it: the actor then serves memory backends in its own task.
    A part that fails to open closes those opened before it."""
    if choice.kind == "memory" and responses is None:
        return None
    parts = _durable_parts(choice, budgets, replica_id, lease_seconds)
    if responses is not None:
        parts = (responses, *parts[1:])

    def open_all() -> Backends:
        with contextlib.ExitStack() as opened:
            response_part = parts[0]()
            opened.callback(response_part.close)
            conversation_part = parts[1]()
            opened.callback(conversation_part.close)
            file_part = parts[2]()
            opened.pop_all()
        return Backends(
            response_part, conversation_part, file_part, MemoryEchoStorage(budgets.echo_bytes)
        )

    return open_all


_Parts = tuple[
    Callable[[], ResponseStorage], Callable[[], ConversationStorage], Callable[[], FileStorage]
]


def _durable_parts(
    choice: StoreChoice, budgets: Budgets, replica_id: str, lease_seconds: float
) -> _Parts:
    if choice.kind == "memory":
        return (
            lambda: MemoryResponseStorage(budgets.responses),
            lambda: MemoryConversationStorage(budgets.conversations),
            lambda: MemoryFileStorage(budgets.files),
        )
    if choice.kind == "postgresql":
        from .postgres import PgConversationStorage, PgDatabase, PgFileStorage, PgResponseStorage

        url = choice.path
        return (
            lambda: PgResponseStorage(
                PgDatabase(url), budgets.responses, replica_id, lease_seconds=lease_seconds
            ),
            lambda: PgConversationStorage(PgDatabase(url), budgets.conversations),
            lambda: PgFileStorage(PgDatabase(url), budgets.files),
        )
    from .sqlite import (
        Database,
        SqliteConversationStorage,
        SqliteFileStorage,
        SqliteResponseStorage,
    )

    path = choice.path
    lock_store(path)
    return (
        lambda: SqliteResponseStorage(Database(path), budgets.responses),
        lambda: SqliteConversationStorage(Database(path), budgets.conversations),
        lambda: SqliteFileStorage(Database(path), budgets.files),
    )
