"""The Open Responses WebSocket compliance checks (tests/websocket_compliance.py) pass against
the real server; ``make conformance`` runs the same checks against ``mlx-responses serve``."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import trio

from mlx_responses.server import ServerHandle, serve

from .conftest import MODEL, START_DEADLINE, server_settings
from .websocket_compliance import CHECKS, Server, run_checks

DEADLINE = 120


@pytest.mark.parametrize("name", sorted(CHECKS))
async def test_the_open_responses_websocket_check_passes(server: ServerHandle, name: str) -> None:
    check = CHECKS[name]
    with trio.fail_after(DEADLINE):
        errors = await trio.to_thread.run_sync(check, Server(server.base_url, "sk-local", MODEL))
    assert errors == []


async def test_the_summary_counts_every_check(server: ServerHandle) -> None:
    with trio.fail_after(DEADLINE):
        summary = await trio.to_thread.run_sync(run_checks, server.base_url, "sk-local", MODEL)
    assert summary["total"] == 7
    assert summary["passed"] == 7, summary["failures"]


async def test_every_check_passes_with_the_background_key_on(nursery: trio.Nursery) -> None:
    """Issue 28: `make conformance` runs the server with `--background-key always`; the same
    checks, with every Response required to carry `background`, pass there."""
    settings = dataclasses.replace(server_settings(), background_key=True)
    with trio.fail_after(START_DEADLINE):
        keyed: ServerHandle = await nursery.start(serve, settings)
    with trio.fail_after(DEADLINE):
        summary = await trio.to_thread.run_sync(
            functools.partial(run_checks, keyed.base_url, "sk-local", MODEL, background_key=True)
        )
    assert summary["passed"] == 7, summary["failures"]
