"""Fixtures: the real server (real model actor, real mlx-lm, real Hypercorn) on a free port."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import trio
from hypothesis import settings as hypothesis_settings
from openai import AsyncOpenAI

from mlx_responses.actors.model import ModelSettings
from mlx_responses.blas import openblas_loaded
from mlx_responses.engine.bundled_model import BUNDLED_ALIAS, BUNDLED_MODEL_PATH
from mlx_responses.server import ServerHandle, ServerSettings, serve
from mlx_responses.storage.choice import MEMORY, StoreChoice

from .faults import ThreadFaults
from .postgres import postgresql_server, postgresql_url  # noqa: F401  (issue 15: real PostgreSQL)
from .slow_marks import is_slow, starts_real_parts

MODEL = BUNDLED_ALIAS

# The fast loop (``make test-fast`` sets this) draws a fifth of every property's examples: the
# same properties, checked a little less thoroughly; ``make test`` draws them all.
FAST_LOOP = os.environ.get("MLX_RESPONSES_FAST_LOOP") == "1"
FAST_SHARE = 5
# Tests never assert timings: Hypothesis' per-example deadline would fail a property on a slow,
# shared machine for no behaviour a user sees, so it is off for every property test.
hypothesis_settings.register_profile("mlx-responses", deadline=None)
hypothesis_settings.load_profile("mlx-responses")
# Start-up, including the first-run JIT of MLX's CPU kernels, stays well under this.
START_DEADLINE = 60
# Every server the suite starts samples from this seed (``--seed``), in this process and in
# the ones it spawns: a request that gives no temperature samples at the API's 1.0, and with
# MLX's own start (the clock's, once per process) an answer could change from one run of the
# suite to the next. A test that needs another seed passes its own.
TEST_SEED = 0
os.environ.setdefault("MLX_RESPONSES_SEED", str(TEST_SEED))


def server_settings(**model_overrides: object) -> ServerSettings:
    model_overrides.setdefault("seed", TEST_SEED)
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


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    # The fast loop does not even import a module that imports a real part (every test in it
    # is slow): importing mlx-lm and transformers was half its time.
    if FAST_LOOP and collection_path.name.startswith("test_") and collection_path.suffix == ".py":
        return starts_real_parts(collection_path.resolve()) or None
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The ``slow`` marker is set here, never by hand (tests/slow_marks.py, docs/testing.md).
    scaled: set[int] = set()
    for item in items:
        if is_slow(item.path, getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        elif FAST_LOOP:
            _fewer_examples(item, scaled)


def _fewer_examples(item: pytest.Item, scaled: set[int]) -> None:
    """A property's own ``@settings`` (or a state machine's ``TestCase.settings``) with a
    ``FAST_SHARE``th of its examples, once per test function (a parametrized one is collected
    once per case). Where Hypothesis keeps a test's settings is its own business: if it moves
    them, this does nothing and the fast loop only takes longer."""
    for owner, name in (
        (getattr(item, "obj", None), "_hypothesis_internal_use_settings"),
        (getattr(item, "cls", None), "settings"),
    ):
        chosen = getattr(owner, name, None)
        if isinstance(chosen, hypothesis_settings) and id(owner) not in scaled:
            scaled.add(id(owner))
            fewer = max(10, chosen.max_examples // FAST_SHARE)
            setattr(owner, name, hypothesis_settings(chosen, max_examples=fewer))


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


# A condition a test waits for holds within this, or the test fails naming it (not a hang).
WAIT_DEADLINE = 60


async def wait_until(
    predicate: Callable[[], bool], poll: float = 0.001, *, deadline: float = WAIT_DEADLINE
) -> None:
    """Wait for a condition on state another thread publishes (the model's batch snapshot,
    which the generation thread replaces after each step with no event to wait on), by
    polling it, at most ``deadline`` seconds."""
    try:
        with trio.fail_after(deadline):
            while not predicate():  # noqa: ASYNC110 - the state is published by the MLX thread
                await trio.sleep(poll)
    except trio.TooSlowError:
        code = getattr(predicate, "__code__", None)
        where = f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}" if code else ""
        raise AssertionError(f"wait_until: not true within {deadline} s ({where})") from None


async def until_terminal(http: httpx.AsyncClient, response_id: str) -> dict[str, Any]:
    """A background job's final object: its live event stream is followed to its end (the
    server ends it after the terminal event, so this waits on that event, not on a clock),
    then the response is read back; a reader of the terminal event finds the record."""
    async with http.stream("GET", f"/v1/responses/{response_id}?stream=true") as events:
        assert events.status_code == 200, await events.aread()
        async for _ in events.aiter_bytes():
            pass
    final: dict[str, Any] = (await http.get(f"/v1/responses/{response_id}")).json()
    return final


async def assert_nothing_more_generated(server: ServerHandle, generated: int) -> None:
    """The batch generates nothing more for sequences that left it, once it had generated
    ``generated`` tokens in all. Shown by a barrier, not a pause: another request (not stored)
    runs to its length limit, taking the generation thread through further steps, and the
    count then grew by that request's tokens alone."""
    body = {"model": MODEL, "input": "Count from 1 to 110.", "temperature": 0}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=WAIT_DEADLINE) as http:
        reply = await http.post(
            "/v1/responses", json={**body, "store": False, "max_output_tokens": 8}
        )
    assert reply.status_code == 200, reply.text
    expected = generated + reply.json()["usage"]["output_tokens"]
    await wait_until(lambda: server.model.statistics().tokens_generated >= expected)
    with trio.fail_after(WAIT_DEADLINE):
        await server.model.wait_idle()
    assert server.model.statistics().tokens_generated == expected


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
