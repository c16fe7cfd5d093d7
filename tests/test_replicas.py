"""Replicas over one PostgreSQL store (issue 15), end to end: real servers (the bundled model)
sharing a real PostgreSQL database share responses, chains, input items, conversations and
files; a cancel sent to one replica frees the batch of the replica running the job; a stream
followed on one replica is the running replica's stream, live; a SIGKILLed replica's jobs end
``failed`` once its lease expires; tenants stay apart across replicas."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import httpx2 as httpx
import trio

from mlx_responses.http.auth import load_api_keys
from mlx_responses.server import ServerHandle, ServerSettings, serve
from mlx_responses.storage.choice import StoreChoice
from mlx_responses.storage.postgres import LEASE_MESSAGE
from tests.conformance import assert_strict_response, parse_sse

from .conftest import MODEL, START_DEADLINE, server_settings, wait_until
from .test_durable_store import Cli

DEADLINE = 120
ALICE, BOB = "sk-alice-replicas", "sk-bob-replicas"
HELLO = {"model": MODEL, "input": "Reply with: hello", "temperature": 0}
COUNT = {"model": MODEL, "input": "Count from 1 to 500.", "temperature": 0}
LONG_JOB = {**COUNT, "background": True, "max_output_tokens": 3000}


def replica_settings(url: str, **changes: Any) -> ServerSettings:
    return dataclasses.replace(
        server_settings(),
        store=StoreChoice("postgresql", url),
        api_keys=load_api_keys([ALICE, BOB]),
        replica_lease_seconds=2.0,
        **changes,
    )


async def start_replica(nursery: trio.Nursery, url: str) -> ServerHandle:
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, replica_settings(url))
    return handle


def client(server: ServerHandle | str, key: str = ALICE) -> httpx.AsyncClient:
    base = server if isinstance(server, str) else server.base_url
    return httpx.AsyncClient(base_url=base, timeout=60, headers={"Authorization": f"Bearer {key}"})


async def status_past(http: httpx.AsyncClient, path: str, status: str) -> dict[str, Any]:
    """The response at ``path`` once its status is no longer ``status`` (polled). Polling is
    what the callers test: what a GET on the other replica answers for a job it does not run,
    read from the shared store (A's published progress; a lease found expired on reading),
    with no event of that job on this replica to wait on."""
    while True:
        seen: dict[str, Any] = (await http.get(path)).json()
        if seen["status"] != status:
            return seen
        await trio.sleep(0.02)


async def test_two_replicas_share_state_and_keep_tenants_apart(
    nursery: trio.Nursery, postgresql_url: str
) -> None:
    a, b = (
        await start_replica(nursery, postgresql_url),
        await start_replica(nursery, postgresql_url),
    )
    with trio.fail_after(DEADLINE):
        async with client(a) as on_a, client(b) as on_b, client(b, BOB) as bob_on_b:
            first = (await on_a.post("/v1/responses", json=HELLO)).json()
            assert (await on_b.get(f"/v1/responses/{first['id']}")).json() == first
            # A chain continued on B from A's response; its input items listed on A.
            second = await on_b.post(
                "/v1/responses", json={**HELLO, "previous_response_id": first["id"]}
            )
            assert second.status_code == 200, second.text
            second_id = second.json()["id"]
            items_a = (await on_a.get(f"/v1/responses/{second_id}/input_items")).json()
            items_b = (await on_b.get(f"/v1/responses/{second_id}/input_items")).json()
            assert items_a == items_b
            assert len(items_a["data"]) == 3  # first's input and output, then the new input
            assert (await on_a.get(f"/v1/responses/{second_id}")).json() == second.json()
            # A conversation made on A, continued on B, read on A.
            conv = (await on_a.post("/v1/conversations", json={"metadata": {"k": "v"}})).json()
            turn = await on_b.post("/v1/responses", json={**HELLO, "conversation": conv["id"]})
            assert turn.status_code == 200, turn.text
            conv_items = (await on_a.get(f"/v1/conversations/{conv['id']}/items")).json()
            assert len(conv_items["data"]) == 2
            # A file uploaded on A, read on B.
            upload = await on_a.post(
                "/v1/files",
                files={"file": ("notes.txt", b"shared bytes", "text/plain")},
                data={"purpose": "user_data"},
            )
            file_id = upload.json()["id"]
            assert (await on_b.get(f"/v1/files/{file_id}")).json() == upload.json()
            assert (await on_b.get(f"/v1/files/{file_id}/content")).content == b"shared bytes"
            listed = (await on_b.get("/v1/files")).json()["data"]
            assert [f["id"] for f in listed] == [file_id]
            # Another tenant on B sees none of it.
            for path in (
                f"/v1/responses/{first['id']}",
                f"/v1/responses/{second_id}/input_items",
                f"/v1/conversations/{conv['id']}",
                f"/v1/files/{file_id}",
            ):
                assert (await bob_on_b.get(path)).status_code == 404, path
            assert (await bob_on_b.get("/v1/files")).json()["data"] == []
            chained = await bob_on_b.post(
                "/v1/responses", json={**HELLO, "previous_response_id": first["id"]}
            )
            assert chained.status_code == 400
            # A delete on B is a delete on A.
            assert (await on_b.delete(f"/v1/responses/{first['id']}")).status_code == 200
            assert (await on_a.get(f"/v1/responses/{first['id']}")).status_code == 404
    nursery.cancel_scope.cancel()


async def test_cancel_and_live_stream_across_replicas(
    nursery: trio.Nursery, postgresql_url: str
) -> None:
    """B follows A's running job live (the same events as A's own stream), another tenant on
    B can neither see nor cancel it, and B's cancel frees A's batch."""
    a, b = (
        await start_replica(nursery, postgresql_url),
        await start_replica(nursery, postgresql_url),
    )
    model = a.model
    with trio.fail_after(DEADLINE):
        async with client(a) as on_a, client(b) as on_b, client(b, BOB) as bob_on_b:
            job = (await on_a.post("/v1/responses", json=LONG_JOB)).json()
            path = f"/v1/responses/{job['id']}"
            await wait_until(lambda: model.statistics().tokens_generated > 3, poll=0.01)
            running = await status_past(on_b, path, "queued")  # A's first events published
            assert running["status"] == "in_progress", running
            assert (await bob_on_b.get(path)).status_code == 404
            assert (await bob_on_b.get(f"{path}?stream=true")).status_code == 404
            assert (await bob_on_b.post(f"{path}/cancel")).status_code == 404
            assert (await on_b.delete(path)).status_code == 400  # running: cancel it first
            assert model.statistics().sequences_cancelled == 0
            on_a_events: list[Any] = []
            on_b_raw: list[bytes] = []
            live: list[str] = []

            async def follow_on_a() -> None:
                async with on_a.stream("GET", f"{path}?stream=true") as reply:
                    raw = b"".join([chunk async for chunk in reply.aiter_bytes()])
                on_a_events.extend(parse_sse(raw))

            async def follow_on_b() -> None:
                async with on_b.stream("GET", f"{path}?stream=true&starting_after=1") as reply:
                    assert reply.status_code == 200
                    async for chunk in reply.aiter_bytes():
                        on_b_raw.append(chunk)
                        if len(on_b_raw) == 3:  # seen on B while A still generates
                            live.append((await on_a.get(path)).json()["status"])

            async with trio.open_nursery() as followers:
                followers.start_soon(follow_on_a)
                followers.start_soon(follow_on_b)
                await wait_until(lambda: len(on_b_raw) >= 5, poll=0.01)
                cancelled = await on_b.post(f"{path}/cancel")
            await model.wait_idle()
            after = (await on_b.get(path)).json()
            stored = parse_sse((await on_b.get(f"{path}?stream=true")).content)
    assert live == ["in_progress"]
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert after == cancelled.json()
    assert_strict_response(after)
    stats = model.statistics()
    assert stats.sequences_cancelled == 1  # A's batch freed by B's cancel
    assert stats.active == 0
    on_b_events = parse_sse(b"".join(on_b_raw))
    assert on_b_events == on_a_events[2:]
    assert on_a_events == stored
    assert on_b_events[-1][0] == "response.cancelled"
    assert [event["sequence_number"] for _, event in on_b_events] == list(
        range(2, 2 + len(on_b_events))
    )
    nursery.cancel_scope.cancel()


async def test_a_killed_replicas_jobs_are_failed_by_lease(
    nursery: trio.Nursery, postgresql_url: str, tmp_path: Path
) -> None:
    killed = Cli(postgresql_url, tmp_path / "data")
    killed.env["MLX_RESPONSES_REPLICA_LEASE_SECS"] = "2"
    killed.env["MLX_RESPONSES_API_KEY"] = ALICE
    b = await start_replica(nursery, postgresql_url)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as process:
            url = await killed.start(process)
            async with client(url) as on_a, client(b) as on_b:
                job = (await on_a.post("/v1/responses", json=LONG_JOB)).json()
                path = f"/v1/responses/{job['id']}"
                running = await status_past(on_b, path, "queued")
                assert running["status"] == "in_progress", running
            await killed.kill()
            process.cancel_scope.cancel()
        async with client(b) as on_b:
            seen = await status_past(on_b, path, "in_progress")
            replay = parse_sse((await on_b.get(f"{path}?stream=true")).content)
    assert_strict_response(seen)
    assert seen["status"] == "failed"
    assert seen["error"] == {"code": "server_error", "message": LEASE_MESSAGE}
    assert [name for name, _ in replay] == [
        "response.created",
        "response.queued",
        "response.failed",
    ]
    nursery.cancel_scope.cancel()
