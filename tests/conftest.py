"""Fixtures: the real server (real model actor, real mlx-lm, real Hypercorn) on a free port."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio
from hypothesis import settings as hypothesis_settings
from openai import AsyncOpenAI

from mlx_responses.actors.model import ModelSettings
from mlx_responses.blas import openblas_loaded
from mlx_responses.model.bundled_model import BUNDLED_ALIAS, BUNDLED_MODEL_PATH
from mlx_responses.server import ServerHandle, ServerSettings, serve
from mlx_responses.storage.choice import MEMORY, StoreChoice

from .faults import ThreadFaults
from .postgres import postgresql_server, postgresql_url  # noqa: F401  (issue 15: real PostgreSQL)

MODEL = BUNDLED_ALIAS

# Tests never assert timings: Hypothesis' per-example deadline would fail a property on a slow,
# shared machine for no behaviour a user sees, so it is off for every property test.
hypothesis_settings.register_profile("mlx-responses", deadline=None)
hypothesis_settings.load_profile("mlx-responses")
# Start-up, including the first-run JIT of MLX's CPU kernels, stays well under this.
START_DEADLINE = 60


def server_settings(**model_overrides: object) -> ServerSettings:
    model = ModelSettings(
        model_path=str(BUNDLED_MODEL_PATH),
        alias=BUNDLED_ALIAS,
        **model_overrides,  # type: ignore[arg-type]
    )
    return ServerSettings(
        host="127.0.0.1", port=0, model=model, graceful_timeout=5, store=_test_store()
    )


def _test_store() -> StoreChoice:
    """``memory`` (spec 000's behaviour, each server forgets), unless
    ``MLX_RESPONSES_TEST_STORE=sqlite`` runs the suite over a fresh SQLite file per server."""
    if os.environ.get("MLX_RESPONSES_TEST_STORE", "memory") != "sqlite":
        return MEMORY
    folder = tempfile.mkdtemp(prefix="mlx-responses-test-")
    return StoreChoice("sqlite", os.path.join(folder, "store.sqlite3"))


def pytest_report_header() -> str:
    # Issue 16: importing mlx_responses preloaded OpenBLAS before MLX, when the system has it.
    return f"mlx-responses: OpenBLAS {'loaded' if openblas_loaded() else 'not loaded (reference BLAS)'}"


@pytest.fixture
def faults() -> ThreadFaults:
    return ThreadFaults()


@pytest.fixture
async def server(nursery: trio.Nursery, faults: ThreadFaults) -> ServerHandle:
    # Torn down by the fixture nursery's cancellation: the model thread stops cleanly.
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(
            serve, server_settings(thread_factory=faults.factory)
        )
    return handle


@pytest.fixture
async def client(server: ServerHandle) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(
        base_url=f"{server.base_url}/v1", api_key="sk-local", max_retries=0, timeout=60
    ) as c:
        yield c


async def wait_until(predicate: Callable[[], bool], poll: float = 0.001) -> None:
    """Poll a condition on another thread's state (the model's batch snapshot)."""
    while not predicate():  # noqa: ASYNC110 - the state is published by the MLX thread
        await trio.sleep(poll)


def split_reasoning(expected: str) -> tuple[str | None, str]:
    """A documented answer as the API returns it: (reasoning item text, visible text)."""
    if expected.startswith("<think>"):
        reasoning, _, text = expected.removeprefix("<think>").partition("</think>")
        return reasoning.strip("\n"), text.lstrip("\n")
    return None, expected


def output_text(response: dict[str, Any]) -> str:
    """The visible text of a Response object (what the SDK's ``output_text`` joins)."""
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )
