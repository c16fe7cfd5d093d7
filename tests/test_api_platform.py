"""Spec 001's platform surface: strict JSON, keys and tenants, body limits, the retired route."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx2 as httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import response_create_params

from mlx_responses.http.auth import load_api_keys
from mlx_responses.server import ServerHandle, serve

from .conftest import MODEL, START_DEADLINE, server_settings, wait_until

DEADLINE = 60
ALICE, BOB = "sk-alice", "sk-bob"
COUNT = {"model": MODEL, "input": "Count from 1 to 110.", "temperature": 0}
HELLO = {"model": MODEL, "input": "Reply with: hello", "temperature": 0, "max_output_tokens": 4}


async def keyed_server(nursery: trio.Nursery, **changes: Any) -> ServerHandle:
    settings = dataclasses.replace(
        server_settings(), api_keys=load_api_keys([ALICE, BOB]), **changes
    )
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    return handle


def as_(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_keys_are_required_except_on_health(nursery: trio.Nursery) -> None:
    server = await keyed_server(nursery)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            missing = await http.post("/v1/responses", json=HELLO)
            wrong = await http.post("/v1/responses", json=HELLO, headers=as_("sk-mallory"))
            models = await http.get("/v1/models")
            health = await http.get("/health")
            ok = await http.post("/v1/responses", json=HELLO, headers=as_(ALICE))
            anthropic_style = await http.get("/v1/models", headers={"x-api-key": BOB})
            # The batch snapshot is published by the generation thread after its step.
            await wait_until(lambda: server.model.statistics().sequences_finished >= 1)
    for refused in (missing, wrong, models):
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "authentication_error"
    assert health.status_code == 200
    assert ok.status_code == 200
    assert anthropic_style.status_code == 200
    assert server.model.statistics().sequences_finished == 1


async def test_tenants_never_see_each_others_objects(nursery: trio.Nursery) -> None:
    server = await keyed_server(nursery)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            mine = (await http.post("/v1/responses", json=HELLO, headers=as_(ALICE))).json()
            conv = (await http.post("/v1/conversations", json={}, headers=as_(ALICE))).json()
            job = (
                await http.post(
                    "/v1/responses", json={**COUNT, "background": True}, headers=as_(ALICE)
                )
            ).json()
            rid, cid, jid = mine["id"], conv["id"], job["id"]
            attempts = [
                await http.get(f"/v1/responses/{rid}", headers=as_(BOB)),
                await http.get(f"/v1/responses/{rid}?stream=true", headers=as_(BOB)),
                await http.get(f"/v1/responses/{rid}/input_items", headers=as_(BOB)),
                await http.delete(f"/v1/responses/{rid}", headers=as_(BOB)),
                await http.post(f"/v1/responses/{jid}/cancel", headers=as_(BOB)),
                await http.get(f"/v1/responses/{jid}", headers=as_(BOB)),
                await http.get(f"/v1/conversations/{cid}", headers=as_(BOB)),
                await http.get(f"/v1/conversations/{cid}/items", headers=as_(BOB)),
                await http.delete(f"/v1/conversations/{cid}", headers=as_(BOB)),
            ]
            chained = await http.post(
                "/v1/responses", json={**HELLO, "previous_response_id": rid}, headers=as_(BOB)
            )
            in_conv = await http.post(
                "/v1/responses", json={**HELLO, "conversation": cid}, headers=as_(BOB)
            )
            # The owner still sees everything, untouched.
            still = await http.get(f"/v1/responses/{rid}", headers=as_(ALICE))
            conv_still = await http.get(f"/v1/conversations/{cid}", headers=as_(ALICE))
            await http.post(f"/v1/responses/{jid}/cancel", headers=as_(ALICE))
    for attempt in attempts:
        assert attempt.status_code == 404, attempt.text
    assert chained.status_code == 400
    assert chained.json()["error"]["code"] == "previous_response_not_found"
    assert in_conv.status_code == 404
    assert still.status_code == 200
    assert conv_still.status_code == 200


@pytest.mark.parametrize(
    "key", sorted(response_create_params.ResponseCreateParamsBase.__annotations__)
)
async def test_every_sdk_create_key_is_known(server: ServerHandle, key: str) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            reply = await http.post("/v1/responses", json={**HELLO, key: HELLO.get(key)})
    if reply.status_code == 400:
        assert "Unknown parameter" not in reply.json()["error"]["message"]


JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.text(max_size=5)


def _json_value(depth: int) -> st.SearchStrategy[Any]:
    if depth == 0:
        return JSON_SCALARS
    inner = _json_value(depth - 1)
    return (
        JSON_SCALARS
        | st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    )


def _with_duplicate(body: dict[str, Any]) -> bytes:
    text = json.dumps(body)
    # Repeat the first key of the outer object (or of a nested one): a duplicate at some depth.
    return text.replace("{", '{"model": 1, ', 1).replace(", }", "}").encode()


malformed = st.one_of(
    st.builds(
        lambda body: _with_duplicate(body),
        st.fixed_dictionaries({"model": st.just(MODEL), "input": st.just("hi")}),
    ),
    st.builds(
        lambda v: json.dumps({**HELLO, "metadata": {"k": "v", "n": v}}, allow_nan=True).encode(),
        st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    ),
    st.builds(
        lambda name, v: json.dumps({**HELLO, f"x_{name}": v}).encode(),
        st.text("abcdefgh", min_size=1, max_size=6),
        _json_value(2),
    ),
    st.builds(
        lambda key, v: json.dumps({**HELLO, key: v}).encode(),
        st.sampled_from(["max_output_tokens", "temperature", "stream", "store", "top_p"]),
        st.text(max_size=4) | st.lists(st.integers(), max_size=2),
    ),
    st.builds(
        lambda v: json.dumps(v).encode(), st.lists(_json_value(1), max_size=3) | JSON_SCALARS
    ),
)


@settings(max_examples=40, deadline=None)
@given(bodies=st.lists(malformed, min_size=1, max_size=8))
def test_malformed_bodies_are_400_and_never_reach_the_model(bodies: list[bytes]) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            with trio.fail_after(DEADLINE):
                server: ServerHandle = await nursery.start(serve, server_settings())
                async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
                    for body in bodies:
                        reply = await http.post(
                            "/v1/responses",
                            content=body,
                            headers={"content-type": "application/json"},
                        )
                        assert reply.status_code == 400, (body, reply.text)
                        assert reply.json()["error"]["type"] == "invalid_request_error"
                stats = server.model.statistics()
                assert stats.sequences_finished == stats.sequences_cancelled == 0
                assert stats.prompt_tokens_processed == 0
                assert server.store.statistics().entries == 0
            nursery.cancel_scope.cancel()

    trio.run(main)


async def test_a_body_over_the_limit_is_413(nursery: trio.Nursery) -> None:
    settings = dataclasses.replace(server_settings(), max_request_bytes=1000)
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, settings)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            big = await http.post("/v1/responses", json={**HELLO, "input": "x" * 2000})
            small = await http.post("/v1/responses", json=HELLO)
    assert big.status_code == 413
    assert "error" in big.json()
    assert small.status_code == 200


async def test_chat_completions_is_retired(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            for path in ("/v1/chat/completions", "/chat/completions"):
                reply = await http.post(path, json={"model": MODEL, "messages": []})
                assert reply.status_code == 404
                error = reply.json()["error"]
                assert error["code"] == "chat_completions_retired"
                assert "/v1/responses" in error["message"]
