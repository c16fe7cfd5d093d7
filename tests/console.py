"""The installed console script, for tests that start the server as a user does."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

SCRIPT = Path(sys.executable).with_name("mlx-responses")


async def read_base_url(stream: Any) -> str:
    """The server's base URL from its start-up line on ``stream`` (its stderr)."""
    seen = b""
    while True:
        chunk = await stream.receive_some(4096)
        assert chunk, f"server exited before serving: {seen.decode(errors='replace')}"
        seen += chunk
        found = re.search(rb"serving \S+ at (http://[\d.:]+)", seen)
        if found:
            return found.group(1).decode()


@asynccontextmanager
async def serving(env: Mapping[str, str]) -> AsyncIterator[tuple[trio.Process, str]]:
    """``mlx-responses serve`` with ``env``, and its base URL once it serves; killed at the
    end unless it exited already (its stderr is read only up to the start-up line)."""
    process = await trio.lowlevel.open_process(
        [str(SCRIPT), "serve"], env=dict(env), stderr=subprocess.PIPE
    )
    try:
        assert process.stderr is not None
        yield process, await read_base_url(process.stderr)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
