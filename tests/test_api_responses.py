"""POST/GET/DELETE /v1/responses through the openai SDK against the real server and model."""

from __future__ import annotations

import httpx2 as httpx
import openai
import pytest
import trio
from openai import AsyncOpenAI

from mlx_responses.engine.bundled_model import load_bundled_prompts
from mlx_responses.server import ServerHandle
from tests.conformance import assert_strict_response

from .conftest import MODEL

DEADLINE = 60


def prompt(name: str) -> tuple[str, str]:
    """(user text, expected greedy answer) of a documented single-user-message prompt."""
    for p in load_bundled_prompts():
        if p.name == name:
            return p.messages[-1]["content"], p.expected
    raise KeyError(name)


async def test_create_returns_strict_response_with_the_documented_answer(
    client: AsyncOpenAI,
) -> None:
    text, expected = prompt("hello")
    with trio.fail_after(DEADLINE):
        raw = await client.responses.with_raw_response.create(
            model=MODEL, input=text, temperature=0, max_output_tokens=64
        )
    data = raw.http_response.json()
    assert_strict_response(data)
    response = raw.parse()
    assert response.status == "completed"
    assert response.output_text == expected
    assert isinstance(data["created_at"], int)
    assert isinstance(data["completed_at"], int)
    assert data["output"][0]["content"][0]["annotations"] == []
    usage = data["usage"]
    assert usage["input_tokens"] > 0
    assert usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["input_tokens_details"]["cached_tokens"] == 0
    assert usage["output_tokens_details"]["reasoning_tokens"] == 0
    assert "background" not in data


async def test_message_array_and_instructions_are_accepted(client: AsyncOpenAI) -> None:
    text, expected = prompt("hello")
    with trio.fail_after(DEADLINE):
        response = await client.responses.create(
            model=MODEL,
            input=[{"role": "user", "content": [{"type": "input_text", "text": text}]}],
            temperature=0,
            max_output_tokens=64,
        )
    assert response.output_text == expected
    with trio.fail_after(DEADLINE):
        with_instructions = await client.responses.create(
            model=MODEL,
            instructions="You are a helpful assistant.",
            input=text,
            temperature=0,
            max_output_tokens=64,
            metadata={"k": "v"},
        )
    assert with_instructions.instructions == "You are a helpful assistant."
    assert with_instructions.metadata == {"k": "v"}
    # The rendered prompt grows by the system message.
    assert with_instructions.usage is not None
    assert response.usage is not None
    assert with_instructions.usage.input_tokens > response.usage.input_tokens


async def test_retrieve_equals_created_and_delete_removes(client: AsyncOpenAI) -> None:
    text, _ = prompt("hello")
    with trio.fail_after(DEADLINE):
        created = await client.responses.with_raw_response.create(
            model=MODEL, input=text, temperature=0, max_output_tokens=16
        )
        body = created.http_response.json()
        fetched = await client.responses.with_raw_response.retrieve(body["id"])
        assert fetched.http_response.json() == body
        assert_strict_response(fetched.http_response.json())
        await client.responses.delete(body["id"])
        with pytest.raises(openai.NotFoundError) as missing:
            await client.responses.retrieve(body["id"])
        assert missing.value.body["param"] == "response_id"  # type: ignore[index]
        with pytest.raises(openai.NotFoundError):
            await client.responses.delete(body["id"])


async def test_store_false_is_not_retrievable(client: AsyncOpenAI) -> None:
    text, _ = prompt("hello")
    with trio.fail_after(DEADLINE):
        response = await client.responses.create(
            model=MODEL, input=text, temperature=0, max_output_tokens=16, store=False
        )
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(response.id)


async def test_max_output_tokens_makes_an_incomplete_response(client: AsyncOpenAI) -> None:
    text, expected = prompt("count")
    with trio.fail_after(DEADLINE):
        raw = await client.responses.with_raw_response.create(
            model=MODEL, input=text, temperature=0, max_output_tokens=5
        )
    data = raw.http_response.json()
    assert_strict_response(data)
    assert data["status"] == "incomplete"
    assert data["incomplete_details"] == {"reason": "max_output_tokens"}
    assert data["usage"]["output_tokens"] == 5
    out = raw.parse().output_text
    assert out
    assert expected.startswith(out)


async def test_models_and_health(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        with trio.fail_after(DEADLINE):
            models = (await http.get("/v1/models")).json()
            assert [m["id"] for m in models["data"]] == [MODEL]
            assert (await http.get(f"/models/{MODEL}")).json()["id"] == MODEL
            missing = await http.get("/v1/models/nope")
            assert missing.status_code == 404
            assert missing.json()["error"]["code"] == "model_not_found"
            health = (await http.get("/health")).json()
    assert health["status"] == "ok"
    assert health["batch"]["active"] == 0


async def test_routes_without_v1_prefix(server: ServerHandle) -> None:
    text, expected = prompt("hello")
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            created = await http.post(
                "/responses",
                json={"model": MODEL, "input": text, "temperature": 0, "max_output_tokens": 16},
            )
            assert created.status_code == 200
            body = created.json()
            assert body["output"][0]["content"][0]["text"] == expected
            assert (await http.get(f"/responses/{body['id']}")).json() == body
            assert (await http.delete(f"/responses/{body['id']}")).json()["deleted"] is True
