"""previous_response_id chains, conversations, input_items, input_tokens and stream replay."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx2 as httpx
import openai
import pytest
import trio
from openai import AsyncOpenAI
from openai.types.responses import ResponseItemList

from mlx_responses.server import ServerHandle, serve
from mlx_responses.storage.interface import StoreLimits
from tests.conformance import assert_stream_invariants, assert_strict_response, parse_sse

from .conftest import MODEL, START_DEADLINE, server_settings
from .rawhttp import open_stream, read_until

DEADLINE = 60


async def create(client: AsyncOpenAI, text: str, **extra: Any) -> dict[str, Any]:
    raw = await client.responses.with_raw_response.create(
        model=MODEL, input=text, temperature=0, max_output_tokens=40, **extra
    )
    data: dict[str, Any] = raw.http_response.json()
    assert_strict_response(data)
    return data


async def input_tokens(http: httpx.AsyncClient, body: dict[str, Any]) -> int:
    reply = await http.post("/v1/responses/input_tokens", json=body)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["object"] == "response.input_tokens"
    return int(data["input_tokens"])


def texts(items: list[dict[str, Any]]) -> list[str]:
    return ["".join(p.get("text", "") for p in item["content"]) for item in items]


async def test_a_four_turn_chain_renders_every_earlier_turn(
    client: AsyncOpenAI, server: ServerHandle
) -> None:
    turns = [
        "Reply with: hello",
        "Reply with: goodbye",
        "Say something short.",
        "Reply with: hello",
    ]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            previous: str | None = None
            responses = []
            for text in turns:
                extra = {"previous_response_id": previous} if previous else {}
                body = {"model": MODEL, "input": text, **extra}
                counted = await input_tokens(http, body)
                data = await create(client, text, **extra)
                assert data["usage"]["input_tokens"] == counted
                assert data["previous_response_id"] == previous
                responses.append(data)
                previous = data["id"]
            # Turn two is the bundled model's documented multi-turn prompt: it answers exactly.
            assert responses[1]["output"][0]["content"][0]["text"] == "goodbye"
            raw = await client.responses.input_items.with_raw_response.list(
                previous, limit=100, order="asc"
            )
    listing = raw.http_response.json()
    ResponseItemList.model_validate(listing, strict=True)
    items = listing["data"]
    # Every earlier input and output, in order, then this turn's input.
    expected: list[str] = []
    for text, data in zip(turns, responses, strict=True):
        expected.append(text)
        if data is not responses[-1]:
            expected.append(data["output"][0]["content"][0]["text"])
    assert texts(items) == expected
    earlier_ids = {item["id"] for data in responses[:-1] for item in data["output"]}
    assert earlier_ids <= {item["id"] for item in items}
    counts = [r["usage"]["input_tokens"] for r in responses]
    assert counts == sorted(counts)


async def test_a_branch_keeps_both_lines_apart(client: AsyncOpenAI) -> None:
    with trio.fail_after(DEADLINE):
        root = await create(client, "Reply with: hello")
        left = await create(client, "Reply with: goodbye", previous_response_id=root["id"])
        right = await create(client, "Name three colors.", previous_response_id=root["id"])
        tip = await create(client, "Say something short.", previous_response_id=left["id"])
        items = (await client.responses.input_items.list(tip["id"], order="asc")).data
    seen = texts([i.model_dump() for i in items])
    assert "Reply with: goodbye" in seen
    assert "Name three colors." not in seen
    assert right["output"][0]["id"] not in {i.id for i in items}


async def test_store_false_is_404_and_cannot_be_chained(client: AsyncOpenAI) -> None:
    with trio.fail_after(DEADLINE):
        gone = await create(client, "Reply with: hello", store=False)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(gone["id"])
        with pytest.raises(openai.BadRequestError) as refused:
            await create(client, "Reply with: goodbye", previous_response_id=gone["id"])
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["param"] == "previous_response_id"
    assert error["code"] == "previous_response_not_found"
    assert gone["id"] in error["message"]


async def test_previous_response_and_conversation_together_is_400(
    client: AsyncOpenAI, server: ServerHandle
) -> None:
    with trio.fail_after(DEADLINE):
        root = await create(client, "Reply with: hello")
        conversation = await server.conversations.create({})
        before = server.store.statistics().entries
        with pytest.raises(openai.BadRequestError):
            await create(
                client, "hi", previous_response_id=root["id"], conversation=conversation.id
            )
    assert server.store.statistics().entries == before


async def test_conversation_turns_accumulate_only_on_success(
    client: AsyncOpenAI, server: ServerHandle
) -> None:
    with trio.fail_after(DEADLINE):
        conversation = await server.conversations.create({"topic": "test"})
        first = await create(client, "Reply with: hello", conversation=conversation.id)
        assert first["conversation"] == {"id": conversation.id}
        # A refused request (bad max_output_tokens) appends nothing.
        with pytest.raises(openai.BadRequestError):
            await client.responses.create(
                model=MODEL, input="x", conversation=conversation.id, max_output_tokens=0
            )
        second = await create(client, "Reply with: goodbye", conversation={"id": conversation.id})
        record = await server.conversations.get(conversation.id)
    assert record is not None
    assert texts(list(record.items)) == [
        "Reply with: hello",
        "hello",
        "Reply with: goodbye",
        "goodbye",
    ]
    assert second["output"][0]["content"][0]["text"] == "goodbye"
    with trio.fail_after(DEADLINE):
        with pytest.raises(openai.NotFoundError):
            await create(client, "hi", conversation="conv_unknown")


async def test_input_items_pagination(client: AsyncOpenAI, server: ServerHandle) -> None:
    with trio.fail_after(DEADLINE):
        a = await create(client, "Reply with: hello")
        b = await create(client, "Reply with: goodbye", previous_response_id=a["id"])
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
            full = (await http.get(f"/v1/responses/{b['id']}/input_items?order=asc")).json()
            first = (
                await http.get(f"/v1/responses/{b['id']}/input_items?order=asc&limit=2")
            ).json()
            rest = (
                await http.get(
                    f"/v1/responses/{b['id']}/input_items?order=asc&after={first['last_id']}"
                )
            ).json()
            newest = (await http.get(f"/v1/responses/{b['id']}/input_items?limit=1")).json()
            bad = await http.get(f"/v1/responses/{b['id']}/input_items?limit=0")
    assert len(full["data"]) == 3
    assert first["has_more"] is True
    assert first["first_id"] == full["data"][0]["id"]
    assert [i["id"] for i in first["data"] + rest["data"]] == [i["id"] for i in full["data"]]
    assert rest["has_more"] is False
    assert newest["data"][0]["id"] == full["data"][-1]["id"]
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "limit"


async def test_delete_answers_openai_shape_and_get_is_404_after(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            body = {"model": MODEL, "input": "Reply with: hello", "max_output_tokens": 3}
            created = (await http.post("/v1/responses", json=body)).json()
            deleted = await http.delete(f"/v1/responses/{created['id']}")
            after = await http.get(f"/v1/responses/{created['id']}")
    assert deleted.json() == {"id": created["id"], "object": "response", "deleted": True}
    assert after.status_code == 404


async def test_stored_stream_replays_from_created_and_resumes_after_n(
    client: AsyncOpenAI, server: ServerHandle
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            body = {"model": MODEL, "input": "Name three colors.", "temperature": 0}
            async with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
                original = parse_sse(b"".join([c async for c in r.aiter_bytes()]))
            final = assert_stream_invariants(original)
            replay = await http.get(f"/v1/responses/{final['id']}?stream=true")
            resumed = await http.get(f"/v1/responses/{final['id']}?stream=true&starting_after=3")
            # The SDK's own resume call.
            sdk_events = []
            stream = await client.responses.retrieve(final["id"], stream=True, starting_after=3)
            async for event in stream:
                sdk_events.append(event.type)
    assert parse_sse(replay.content) == original
    assert parse_sse(resumed.content) == original[4:]
    assert sdk_events == [name for name, _ in original[4:]]


async def test_a_running_response_is_followed_live_until_its_terminal_event(
    server: ServerHandle,
) -> None:
    body = {"model": MODEL, "input": "Count from 1 to 110.", "temperature": 0, "stream": True}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            async with await open_stream(server.base_url, "/v1/responses", body) as stream:
                head = await read_until(stream, b"event: response.output_text.delta", count=2)
                response_id = head.split(b'"id":"', 1)[1].split(b'"', 1)[0].decode()
                snapshot = (await http.get(f"/v1/responses/{response_id}")).json()
                assert snapshot["status"] == "in_progress"
                assert_strict_response(snapshot)
                followed = await http.get(
                    f"/v1/responses/{response_id}?stream=true&starting_after=1"
                )
                await read_until(stream, b"event: response.completed")
            stored = await http.get(f"/v1/responses/{response_id}?stream=true")
    tail = parse_sse(followed.content)
    everything = parse_sse(stored.content)
    assert_stream_invariants(everything)
    assert tail[0][1]["sequence_number"] == 2
    assert tail[-1][0] == "response.completed"
    assert tail == everything[2:]


async def test_persistence_disabled_makes_get_delete_and_chains_400(nursery: trio.Nursery) -> None:
    settings = dataclasses.replace(
        server_settings(),
        responses_store=StoreLimits(0, 1 << 20, 3600),
        conversation_store=StoreLimits(0, 1 << 20, 3600),
    )
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    async with httpx.AsyncClient(base_url=handle.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            body = {"model": MODEL, "input": "Reply with: hello", "max_output_tokens": 3}
            created = await http.post("/v1/responses", json=body)
            assert created.status_code == 200
            rid = created.json()["id"]
            for reply in (
                await http.get(f"/v1/responses/{rid}"),
                await http.delete(f"/v1/responses/{rid}"),
                await http.post("/v1/responses", json={**body, "previous_response_id": rid}),
                await http.post("/v1/responses", json={**body, "conversation": "conv_x"}),
            ):
                assert reply.status_code == 400, reply.text
                assert reply.json()["error"]["type"] == "invalid_request_error"
