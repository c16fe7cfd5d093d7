"""The prompt cache's disk tier end to end: real model, real HTTP, a restart in between.

Greedy text served from disk must equal greedy text cold (``prompt_cache_bytes=0``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import trio

from mlx_responses.engine.disk_tier import DiskTier
from mlx_responses.engine.kv_quant import KvQuant
from mlx_responses.server import ServerHandle, serve

from .conftest import MODEL, START_DEADLINE, output_text, server_settings, wait_until
from .test_api_prompt_cache import ALICE, BOB, cached, create, health, start

DEADLINE = 120
HISTORY = ["Reply with: hello", "Reply with: goodbye"]


def kv_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.kv"))


def corrupt(paths: list[Path]) -> None:
    """Flip a byte of each file's values (only the digest can see it)."""
    for path in paths:
        data = bytearray(path.read_bytes())
        data[-3] ^= 0xFF
        path.write_bytes(bytes(data))


async def run_session(folder: Path, work: Any, keys: list[str] | None = None, **model: Any) -> Any:
    """Start a server over ``folder`` (``model``: more model settings), run
    ``work(handle, http)``, shut it down cleanly (its RAM tier reaches the disk) and return
    what ``work`` returned."""
    from mlx_responses.http.auth import load_api_keys

    settings = server_settings(
        prompt_cache_dir=str(folder), prompt_cache_disk_bytes=1 << 30, **model
    )
    if keys:
        import dataclasses

        settings = dataclasses.replace(settings, api_keys=load_api_keys(keys))
    async with trio.open_nursery() as nursery:
        with trio.fail_after(START_DEADLINE):
            handle: ServerHandle = await nursery.start(serve, settings)
        with trio.fail_after(DEADLINE):
            async with httpx.AsyncClient(base_url=handle.base_url, timeout=60) as http:
                result = await work(handle, http)
        handle.shutdown()
    return result


async def first_turns(key: str | None = None) -> Any:
    async def work(_handle: ServerHandle, http: httpx.AsyncClient) -> list[dict[str, Any]]:
        history: list[dict[str, Any]] = []
        for text in HISTORY:
            history.append({"role": "user", "content": text})
            data = await create(http, key, input=history, store=False)
            history.extend(data["output"])
        history.append({"role": "user", "content": "Say yes."})
        return history

    return work


def next_turn(history: list[dict[str, Any]], key: str | None = None) -> Any:
    async def work(_handle: ServerHandle, http: httpx.AsyncClient) -> dict[str, Any]:
        data = await create(http, key, input=history, store=False)
        return {"data": data, "health": await health(http)}

    return work


async def cold_text(nursery: trio.Nursery, history: list[dict[str, Any]]) -> str:
    cold = await start(nursery, prompt_cache_bytes=0)
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(base_url=cold.base_url, timeout=60) as http:
            return output_text(await create(http, input=history, store=False))


async def test_a_restart_hits_the_disk_and_answers_as_cold(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    history = await run_session(tmp_path, await first_turns())
    assert kv_files(tmp_path)  # the shutdown wrote what RAM held
    after = await run_session(tmp_path, next_turn(history))
    assert cached(after["data"]) > 0
    disk = after["health"]["disk"]
    assert disk["hits"] == 1
    assert disk["skipped"] == 0
    assert output_text(after["data"]) == await cold_text(nursery, history)


async def test_entries_are_read_only_by_a_server_quantizing_alike(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """Entries stored under ``--kv-bits 8`` hold quantized layers: a server quantizing alike
    hits them after a restart; a full-precision server over the same folder does not see them
    (the layout fingerprint differs: a miss, never an error) and answers as cold."""
    eight = KvQuant(8, 32)  # the bundled model's heads are 32 wide
    history = await run_session(tmp_path, await first_turns(), kv_quant=eight)
    again = await run_session(tmp_path, next_turn(history), kv_quant=eight)
    assert again["health"]["disk"]["hits"] == 1, again["health"]
    assert kv_files(tmp_path)
    plain = await run_session(tmp_path, next_turn(history))
    assert plain["health"]["disk"]["hits"] == 0
    assert cached(plain["data"]) == 0
    assert output_text(plain["data"]) == await cold_text(nursery, history)


async def test_a_corrupt_file_is_skipped_and_the_answer_is_right(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    history = await run_session(tmp_path, await first_turns())
    corrupt(kv_files(tmp_path))
    after = await run_session(tmp_path, next_turn(history))
    disk = after["health"]["disk"]
    assert disk["hits"] == 0
    assert disk["skipped"] >= 1
    assert cached(after["data"]) == 0
    assert output_text(after["data"]) == await cold_text(nursery, history)


async def test_tenants_cannot_hit_each_others_files(tmp_path: Path) -> None:
    keys = [ALICE, BOB]
    history = await run_session(tmp_path, await first_turns(ALICE), keys)

    async def both(_handle: ServerHandle, http: httpx.AsyncClient) -> list[dict[str, Any]]:
        bob = await create(http, BOB, input=history, store=False)
        alice = await create(http, ALICE, input=history, store=False)
        return [bob, alice]

    bob, alice = await run_session(tmp_path, both, keys)
    assert cached(bob) == 0
    assert cached(alice) > 0


async def test_a_cancel_during_a_disk_load_leaves_nothing_in_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = await run_session(tmp_path, await first_turns())
    loading, release = threading.Event(), threading.Event()
    load = DiskTier._load

    def held_load(self: DiskTier, *args: Any) -> Any:
        loading.set()
        release.wait(DEADLINE)  # the generation thread is inside the load until the hang-up
        return load(self, *args)

    monkeypatch.setattr(DiskTier, "_load", held_load)

    async def cancel(handle: ServerHandle, http: httpx.AsyncClient) -> dict[str, Any]:
        body = {"model": MODEL, "input": history, "store": False, "stream": True}
        body |= {"temperature": 0, "max_output_tokens": 200}

        async def stream() -> None:
            async with http.stream("POST", "/v1/responses", json=body) as reply:
                async for _ in reply.aiter_bytes():
                    pass

        async with trio.open_nursery() as client:
            client.start_soon(stream)
            await wait_until(loading.is_set, 0.01)
            client.cancel_scope.cancel()  # hang up while the thread loads the entry
        # The server saw the hang-up (the response ended) before the load is let go.
        await wait_until(lambda: handle.responses.statistics().running == 0, 0.01)
        release.set()
        with trio.fail_after(30):
            await handle.model.wait_idle()
        stats = handle.model.statistics()
        assert stats.sequences_cancelled == 1
        # The same prompt again: whatever the cancel left in RAM still serves it.
        data = await create(http, input=history, store=False)
        return {"active": stats.active, "data": data, "health": await health(http)}

    after = await run_session(tmp_path, cancel)
    assert after["active"] == 0
    assert after["health"]["disk"]["hits"] >= 1
    assert cached(after["data"]) > 0
