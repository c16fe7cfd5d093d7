"""Background responses and the cancel endpoint, checked on the API and on the model's batch."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx2 as httpx
import trio

from mlx_responses.server import ServerHandle, serve
from mlx_responses.storage.interface import StoreLimits
from tests.conformance import assert_stream_invariants, assert_strict_response, parse_sse

from .conftest import MODEL, START_DEADLINE, server_settings, until_terminal, wait_until
from .faults import ThreadFaults
from .rawhttp import open_stream, read_until

DEADLINE = 60
TERMINAL = {"completed", "incomplete", "failed", "cancelled"}
COUNT = {"model": MODEL, "input": "Count from 1 to 110.", "temperature": 0}


async def start_server(nursery: trio.Nursery, **changes: Any) -> ServerHandle:
    model_changes = changes.pop("model", {})
    settings = server_settings(**model_changes)
    settings = dataclasses.replace(settings, **changes)
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    return handle


async def poll_until_terminal(http: httpx.AsyncClient, response_id: str) -> list[dict[str, Any]]:
    """Every object a poller sees until the terminal one. Polling is what the test using this
    tests (what a poll shows mid-job), so it polls, paced by a short sleep; tests that only
    wait for the end use ``until_terminal`` (the live stream's terminal event)."""
    seen = []
    while True:
        data = (await http.get(f"/v1/responses/{response_id}")).json()
        seen.append(data)
        if data["status"] in TERMINAL:
            return seen
        await trio.sleep(0.002)


async def test_background_create_answers_queued_then_polls_to_completed(
    server: ServerHandle,
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            created = await http.post("/v1/responses", json={**COUNT, "background": True})
            body = created.json()
            polls = await poll_until_terminal(http, body["id"])
    assert created.status_code == 200
    assert_strict_response(body)
    assert body["status"] == "queued"
    assert body["background"] is True
    assert body["output"] == []
    final = polls[-1]
    assert_strict_response(final)
    assert final["status"] == "completed"
    assert final["background"] is True
    assert final["output"][0]["content"][0]["text"].startswith("1 2 3")
    for poll in polls[:-1]:
        # Polling never exposes partial output.
        assert poll["output"] == []
        assert poll["usage"] is None or poll["usage"]["output_tokens"] == 0
        assert poll["background"] is True
    # The job's sequence left the batch (the generation thread publishes its snapshot just
    # after the step that finished it, which may be after the job stored its answer).
    await wait_until(lambda: server.model.statistics().active == 0)


async def test_background_refusals(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            both = await http.post(
                "/v1/responses", json={**COUNT, "background": True, "stream": True}
            )
            bad = await http.post(
                "/v1/responses", json={**COUNT, "background": True, "max_output_tokens": 0}
            )
    assert both.status_code == 400
    assert both.json()["error"]["param"] == "stream"
    assert bad.status_code == 400
    assert server.responses.statistics().jobs_started == 0


async def test_cancel_running_job_frees_the_batch(server: ServerHandle) -> None:
    model = server.model
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            body = (await http.post("/v1/responses", json={**COUNT, "background": True})).json()
            await wait_until(lambda: model.statistics().tokens_generated > 5)
            cancelled = await http.post(f"/v1/responses/{body['id']}/cancel")
            await model.wait_idle()
            after = (await http.get(f"/v1/responses/{body['id']}")).json()
            again = await http.post(f"/v1/responses/{body['id']}/cancel")
            unknown = await http.post("/v1/responses/resp_nope/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    assert after["status"] == "cancelled"
    assert_strict_response(after)
    stats = model.statistics()
    assert stats.sequences_cancelled == 1
    assert stats.active == 0
    assert again.status_code == 400
    assert again.json()["error"]["code"] == "response_not_cancellable"
    assert unknown.status_code == 404


async def test_cancel_during_prefill_and_delete_of_unfinished_job(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, model={"prefill_step_size": 4})
    model = server.model
    long_input = {**COUNT, "input": "Reply with: hello. " * 150, "background": True}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            body = (await http.post("/v1/responses", json=long_input)).json()
            await wait_until(lambda: model.statistics().prompt_tokens_processed > 0)
            delete = await http.delete(f"/v1/responses/{body['id']}")
            chained = await http.post(
                "/v1/responses", json={**COUNT, "previous_response_id": body["id"]}
            )
            cancelled = (await http.post(f"/v1/responses/{body['id']}/cancel")).json()
            await model.wait_idle()
    assert delete.status_code == 400
    assert chained.status_code == 400
    assert "has not finished" in chained.json()["error"]["message"]
    assert cancelled["status"] == "cancelled"
    stats = model.statistics()
    assert stats.tokens_generated == 0
    assert stats.sequences_cancelled == 1


async def test_job_limit_gives_429_until_a_job_finishes(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, background_max_jobs=2)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            first = (await http.post("/v1/responses", json={**COUNT, "background": True})).json()
            await http.post("/v1/responses", json={**COUNT, "background": True})
            refused = await http.post("/v1/responses", json={**COUNT, "background": True})
            await http.post(f"/v1/responses/{first['id']}/cancel")
            await wait_until(lambda: server.responses.statistics().jobs_active < 2)
            admitted = await http.post("/v1/responses", json={**COUNT, "background": True})
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert admitted.status_code == 200


async def test_store_false_job_is_readable_but_not_chainable(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            body = {**COUNT, "input": "Reply with: hello", "background": True, "store": False}
            created = (await http.post("/v1/responses", json=body)).json()
            final = await until_terminal(http, created["id"])
            chained = await http.post(
                "/v1/responses", json={**COUNT, "previous_response_id": created["id"]}
            )
    assert final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"] == "hello"
    assert chained.status_code == 400


async def test_two_subscribers_see_the_same_job_stream(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            created = (await http.post("/v1/responses", json={**COUNT, "background": True})).json()
            streams: list[bytes] = [b"", b""]

            async def watch(i: int) -> None:
                reply = await http.get(f"/v1/responses/{created['id']}?stream=true")
                streams[i] = reply.content

            async with trio.open_nursery() as n:
                n.start_soon(watch, 0)
                n.start_soon(watch, 1)
    first, second = parse_sse(streams[0]), parse_sse(streams[1])
    assert first == second
    final = assert_stream_invariants(first)
    assert [name for name, _ in first[:3]] == [
        "response.created",
        "response.queued",
        "response.in_progress",
    ]
    assert first[0][1]["response"]["status"] == "queued"
    assert final["status"] == "completed"


async def test_cancel_endpoint_ends_a_foreground_stream_with_cancelled(
    server: ServerHandle,
) -> None:
    body = {**COUNT, "stream": True}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            async with await open_stream(server.base_url, "/v1/responses", body) as stream:
                head = await read_until(stream, b"event: response.output_text.delta", count=2)
                response_id = head.split(b'"id":"', 1)[1].split(b'"', 1)[0].decode()
                cancelled = await http.post(f"/v1/responses/{response_id}/cancel")
                await read_until(stream, b"event: response.cancelled")
            await server.model.wait_idle()
            stored = (await http.get(f"/v1/responses/{response_id}")).json()
    assert cancelled.json()["status"] == "cancelled"
    assert stored["status"] == "cancelled"
    assert "background" not in stored
    assert server.model.statistics().sequences_cancelled == 1


async def test_zero_max_jobs_disables_background_mode(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, background_max_jobs=0)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            refused = await http.post("/v1/responses", json={**COUNT, "background": True})
            foreground = await http.post("/v1/responses", json={**COUNT, "max_output_tokens": 2})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "background"
    assert foreground.status_code == 200


async def test_a_worker_crash_fails_running_jobs_and_the_server_keeps_serving(
    server: ServerHandle, faults: ThreadFaults
) -> None:
    model = server.model
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            job = (await http.post("/v1/responses", json={**COUNT, "background": True})).json()
            await wait_until(lambda: model.statistics().tokens_generated > 5)
            faults.crash()
            failed = await until_terminal(http, job["id"])
            after = await http.post("/v1/responses", json={**COUNT, "input": "Reply with: hello"})
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "server_error"
    assert failed["output"] == []
    assert after.status_code == 200
    assert after.json()["output"][0]["content"][0]["text"] == "hello"
    assert model.restarts == 1
    with trio.fail_after(DEADLINE):
        await model.wait_idle()


async def test_active_jobs_bytes_are_bounded_by_the_store_budget(nursery: trio.Nursery) -> None:
    budget = StoreLimits(max_entries=100, max_bytes=40_000, ttl_seconds=3600)
    server = await start_server(nursery, responses_store=budget)
    job = {**COUNT, "background": True, "max_output_tokens": 1000}  # ~18 kB estimated each
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            first = await http.post("/v1/responses", json=job)
            second = await http.post("/v1/responses", json=job)
            third = await http.post("/v1/responses", json=job)
            for reply in (first, second):
                await http.post(f"/v1/responses/{reply.json()['id']}/cancel")
    assert first.status_code == second.status_code == 200
    assert third.status_code == 429
    assert "byte budget" in third.json()["error"]["message"]


async def test_a_final_object_over_the_budget_leaves_a_failed_answer(nursery: trio.Nursery) -> None:
    # Admitted (~8 kB estimated for 350 tokens), but the finished record cannot fit: its final
    # object alone holds five top logprobs per token (> 50 kB), however the deltas coalesce.
    budget = StoreLimits(max_entries=100, max_bytes=9_000, ttl_seconds=3600)
    server = await start_server(nursery, responses_store=budget)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            created = await http.post(
                "/v1/responses",
                json={
                    **COUNT,
                    "background": True,
                    "max_output_tokens": 350,
                    "top_logprobs": 5,
                    "include": ["message.output_text.logprobs"],
                },
            )
            final = await until_terminal(http, created.json()["id"])
    assert_strict_response(final)
    assert final["status"] == "failed"
    assert final["error"]["code"] == "server_error"
    assert final["output"] == []


async def test_sixty_four_active_jobs_then_the_sixty_fifth_is_429(server: ServerHandle) -> None:
    job = {**COUNT, "background": True, "max_output_tokens": 2000}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            ids = []
            for _ in range(64):
                reply = await http.post("/v1/responses", json=job)
                assert reply.status_code == 200, reply.text
                ids.append(reply.json()["id"])
            # The default limit (--responses-background-max-jobs 64) is reached while they run.
            assert server.responses.statistics().jobs_active == 64
            refused = await http.post("/v1/responses", json=job)
            await http.post(f"/v1/responses/{ids[0]}/cancel")
            await wait_until(lambda: server.responses.statistics().jobs_active < 64)
            admitted = await http.post("/v1/responses", json=job)
            ids.append(admitted.json()["id"])
            for response_id in ids:
                await http.post(f"/v1/responses/{response_id}/cancel")
            await server.model.wait_idle()
    assert refused.status_code == 429
    assert admitted.status_code == 200
    assert server.model.statistics().active == 0


async def test_deleting_a_finished_store_false_job_forgets_it(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            body = {**COUNT, "input": "Reply with: hello", "background": True, "store": False}
            created = (await http.post("/v1/responses", json=body)).json()
            await until_terminal(http, created["id"])
            deleted = await http.delete(f"/v1/responses/{created['id']}")
            after = await http.get(f"/v1/responses/{created['id']}")
    assert deleted.status_code == 200
    assert after.status_code == 404
