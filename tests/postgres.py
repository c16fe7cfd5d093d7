"""A real PostgreSQL server for the tests and the store benchmark (issue 15): Debian's
postgresql-15 binaries (``scripts/ensure-debian.sh``, called by ``make unit``), a fresh data
folder in a temporary directory, a free TCP port on 127.0.0.1 and the unix socket in the same
temporary directory. PostgreSQL refuses to run as root: as root it runs as the ``postgres``
system user (created by the Debian package), which then owns the temporary directory.

``PostgresServer`` is plain code (the benchmark uses it too); the ``postgresql_server`` fixture
starts one per test session and ``postgresql_url`` gives each test a database of its own.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

BIN = "/usr/lib/postgresql/15/bin"
START_DEADLINE = 60
STOP_DEADLINE = 20
USER = "mlx"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One PostgreSQL cluster in a temporary directory, started and stopped with ``pg_ctl``."""

    def __init__(self) -> None:
        if not os.path.exists(f"{BIN}/postgres"):
            raise RuntimeError(
                f"{BIN}/postgres is missing: run scripts/ensure-debian.sh "
                f"postgresql-15:{BIN}/postgres (make unit does)"
            )
        self.root = tempfile.mkdtemp(prefix="mlx-responses-pg-")
        self.data = os.path.join(self.root, "data")
        self.socket_dir = os.path.join(self.root, "sock")
        os.makedirs(self.socket_dir)
        self._as: list[str] = []
        if os.getuid() == 0:
            account = pwd.getpwnam("postgres")
            for path in (self.root, self.socket_dir):
                os.chown(path, account.pw_uid, account.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self.port = _free_port()
        self._names = itertools.count(1)
        self._run(
            f"{BIN}/initdb", "-D", self.data, "-U", USER, "-A", "trust", "-E", "UTF8",
            "--no-sync", "--no-instructions",
        )  # fmt: skip
        options = (
            f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            f"{BIN}/pg_ctl", "-D", self.data, "-l", os.path.join(self.root, "log"),
            "-o", options, "-w", "-t", str(START_DEADLINE), "start",
        )  # fmt: skip

    def _run(self, *command: str) -> None:
        done = subprocess.run(
            [*self._as, *command], capture_output=True, text=True, timeout=START_DEADLINE
        )
        if done.returncode != 0:
            raise RuntimeError(f"{command[0]} failed: {done.stdout}{done.stderr}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = f"test_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run(f"{BIN}/pg_ctl", "-D", self.data, "-m", "fast", "-w", "-t", str(STOP_DEADLINE), "stop")  # fmt: skip
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgresql_server() -> Iterator[PostgresServer]:
    started = time.monotonic()
    server = PostgresServer()
    assert time.monotonic() - started < START_DEADLINE
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgresql_url(postgresql_server: PostgresServer) -> str:
    """The URL of an empty database of this test's own, on the session's server."""
    return postgresql_server.new_database()
