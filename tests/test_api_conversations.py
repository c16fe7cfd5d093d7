"""``/v1/conversations`` end to end: the real server, the official SDK, every body validated strictly.

Each JSON body is read raw (``with_raw_response``) and validated with the pinned SDK's model in
strict mode plus a walk for keys the model does not define; refusals are OpenAI's envelope,
name the offending path, and leave the store exactly as it was.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import httpx2 as httpx
import openai
import pydantic
import pytest
import trio
from openai import AsyncOpenAI
from openai.types.conversations import (
    Conversation,
    ConversationDeletedResource,
    ConversationItem,
    ConversationItemList,
)

from mlx_responses.server import ServerHandle, serve
from mlx_responses.storage.interface import StoreLimits

from .conformance import unknown_keys
from .conftest import MODEL, START_DEADLINE, server_settings

DEADLINE = 30

_ITEM = pydantic.TypeAdapter[Any](ConversationItem)

# One of every accepted item form; the stored forms are checked in test_items_are_normalised.
MIXED_ITEMS: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]},
    {"type": "message", "role": "user", "content": "What is 2+2?", "status": "completed"},
    {"role": "assistant", "content": "Let me check.", "phase": "commentary"},
    {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a":2,"b":2}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "4"},
    {
        "type": "message",
        "role": "assistant",
        "id": "msg_from_elsewhere",
        "status": "completed",
        "content": [
            {"type": "output_text", "text": "It is 4.", "annotations": [], "logprobs": []},
            {"type": "refusal", "refusal": "No more."},
        ],
    },
]


def strict(cls: Any, data: Any, what: str) -> Any:
    """Validate JSON ``data`` with an SDK model (or union) strictly; no undeclared keys."""
    adapter = cls if isinstance(cls, pydantic.TypeAdapter) else pydantic.TypeAdapter(cls)
    model = adapter.validate_json(json.dumps(data), strict=True)
    extra = unknown_keys(model)
    assert not extra, f"{what}: keys the SDK model does not define: {extra}"
    return model


def strict_list(data: dict[str, Any], what: str) -> list[dict[str, Any]]:
    strict(ConversationItemList, data, what)
    if not data["data"]:  # the SDK types first_id/last_id as str (OpenAI's schema: nullable)
        assert data == {
            "object": "list",
            "data": [],
            "first_id": "",
            "last_id": "",
            "has_more": False,
        }
        return []
    assert data["first_id"] == data["data"][0]["id"]
    assert data["last_id"] == data["data"][-1]["id"]
    return list(data["data"])


async def create_conversation(client: AsyncOpenAI, **kwargs: Any) -> dict[str, Any]:
    raw = await client.conversations.with_raw_response.create(**kwargs)
    data: dict[str, Any] = json.loads(raw.text)
    strict(Conversation, data, "created conversation")
    return data


async def list_items(client: AsyncOpenAI, conversation_id: str, **query: Any) -> dict[str, Any]:
    raw = await client.conversations.items.with_raw_response.list(conversation_id, **query)
    data: dict[str, Any] = json.loads(raw.text)
    strict_list(data, f"items of {conversation_id} {query}")
    return data


def envelope(reply: httpx.Response, status: int, param: str | None) -> str:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    return str(error["message"])


async def test_conversation_create_retrieve_update_delete(client: AsyncOpenAI) -> None:
    with trio.fail_after(DEADLINE):
        created = await create_conversation(client, metadata={"topic": "math"}, items=MIXED_ITEMS)
        assert created["object"] == "conversation"
        assert created["id"].startswith("conv_")
        assert created["metadata"] == {"topic": "math"}
        assert type(created["created_at"]) is int
        cid = created["id"]

        raw = await client.conversations.with_raw_response.retrieve(cid)
        assert strict(Conversation, json.loads(raw.text), "retrieved").model_dump() == (
            Conversation.model_validate(created).model_dump()
        )

        raw = await client.conversations.with_raw_response.update(cid, metadata={"a": "1"})
        updated = json.loads(raw.text)
        strict(Conversation, updated, "updated")
        assert updated == {**created, "metadata": {"a": "1"}}
        assert (await client.conversations.retrieve(cid)).metadata == {"a": "1"}
        assert len((await list_items(client, cid))["data"]) == len(MIXED_ITEMS)  # items kept

        deleted = json.loads((await client.conversations.with_raw_response.delete(cid)).text)
        strict(ConversationDeletedResource, deleted, "deleted")
        assert deleted == {"id": cid, "object": "conversation.deleted", "deleted": True}

        for call in (
            client.conversations.retrieve(cid),
            client.conversations.delete(cid),
            client.conversations.update(cid, metadata={}),
            client.conversations.items.list(cid),
        ):
            with pytest.raises(openai.NotFoundError) as caught:
                await call
            assert cid in caught.value.message


async def test_create_without_a_body_and_sdk_defaults(
    client: AsyncOpenAI, server: ServerHandle
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        with trio.fail_after(DEADLINE):
            bare = await http.post("/v1/conversations")
            assert bare.status_code == 200, bare.text
            strict(Conversation, bare.json(), "bodiless create")
            assert bare.json()["metadata"] == {}
            empty = await create_conversation(client, items=[])  # what the Agents SDK sends
            assert (await list_items(client, empty["id"]))["data"] == []
            cleared = await client.conversations.update(empty["id"], metadata=None)
            assert cleared.metadata == {}


async def test_items_are_normalised_and_retrievable(client: AsyncOpenAI) -> None:
    with trio.fail_after(DEADLINE):
        cid = (await create_conversation(client, items=MIXED_ITEMS))["id"]
        items = (await list_items(client, cid, order="asc"))["data"]
        for item in items:
            raw = await client.conversations.items.with_raw_response.retrieve(
                item["id"], conversation_id=cid
            )
            assert json.loads(raw.text) == item
            strict(_ITEM, json.loads(raw.text), f"item {item['id']}")
            model = await client.conversations.items.retrieve(item["id"], conversation_id=cid)
            assert model.id == item["id"]
    assert [i["id"].split("_")[0] for i in items] == ["msg"] * 4 + ["fc", "fc", "msg"]
    assert len({i["id"] for i in items}) == len(items)
    assert "msg_from_elsewhere" not in {i["id"] for i in items}  # ids are always fresh
    assert {i["status"] for i in items} == {"completed"}
    assert [i.get("role") for i in items[:4]] == ["system", "developer", "user", "assistant"]
    assert items[0]["content"] == [{"type": "input_text", "text": "Be brief."}]
    assert items[2]["content"] == [{"type": "input_text", "text": "What is 2+2?"}]
    assert items[3]["content"] == [
        {"type": "output_text", "text": "Let me check.", "annotations": [], "logprobs": []}
    ]
    assert items[3]["phase"] == "commentary"
    assert {k: v for k, v in items[4].items() if k != "id"} == {
        "type": "function_call",
        "call_id": "call_1",
        "name": "add",
        "arguments": '{"a":2,"b":2}',
        "status": "completed",
    }
    assert {k: v for k, v in items[5].items() if k != "id"} == {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": "4",
        "status": "completed",
    }
    assert items[6]["content"][1] == {"type": "refusal", "refusal": "No more."}


async def test_items_create_appends_and_answers_the_created_list(client: AsyncOpenAI) -> None:
    with trio.fail_after(DEADLINE):
        cid = (await create_conversation(client, items=[{"role": "user", "content": "one"}]))["id"]
        raw = await client.conversations.items.with_raw_response.create(
            cid,
            items=[
                {"role": "assistant", "content": "two"},
                {"role": "user", "content": "three"},
            ],
            include=["message.output_text.logprobs"],
        )
        created = json.loads(raw.text)
        assert strict_list(created, "created items")
        assert created["has_more"] is False
        listed = (await list_items(client, cid, order="asc"))["data"]
    assert listed[1:] == created["data"]
    assert [item["content"][0]["text"] for item in listed] == ["one", "two", "three"]


async def test_pagination_with_limit_after_and_order(client: AsyncOpenAI) -> None:
    texts = [f"m{i}" for i in range(7)]
    with trio.fail_after(DEADLINE):
        cid = (await create_conversation(client))["id"]
        for start in (0, 4):
            await client.conversations.items.create(
                cid, items=[{"role": "user", "content": t} for t in texts[start : start + 4]]
            )
        everything = (await list_items(client, cid, order="asc", limit=100))["data"]
        ids = [item["id"] for item in everything]
        assert [i["content"][0]["text"] for i in everything] == texts

        default = await list_items(client, cid)  # desc, as OpenAI
        assert [i["id"] for i in default["data"]] == ids[::-1]
        assert default["has_more"] is False

        pages, after = [], None
        while True:
            query: dict[str, Any] = {"limit": 3, "order": "asc"}
            if after is not None:
                query["after"] = after
            page = await list_items(client, cid, **query)
            pages.append([i["id"] for i in page["data"]])
            if not page["has_more"]:
                break
            after = page["last_id"]
        assert pages == [ids[0:3], ids[3:6], ids[6:7]]

        desc = await list_items(client, cid, limit=2, after=ids[4], order="desc")
        assert [i["id"] for i in desc["data"]] == [ids[3], ids[2]]
        assert desc["has_more"] is True
        tail = await list_items(client, cid, after=ids[-1], order="asc")
        assert tail["data"] == []

        walked = [item.id async for item in client.conversations.items.list(cid, limit=2)]
        assert walked == ids[::-1]  # the SDK's cursor page follows last_id until has_more ends

        with pytest.raises(openai.NotFoundError) as caught:
            await client.conversations.items.list(cid, after="msg_nope")
        assert "msg_nope" in caught.value.message


async def test_deleting_an_item_answers_the_conversation(client: AsyncOpenAI) -> None:
    with trio.fail_after(DEADLINE):
        created = await create_conversation(client, metadata={"k": "v"}, items=MIXED_ITEMS[:3])
        cid = created["id"]
        ids = [i["id"] for i in (await list_items(client, cid, order="asc"))["data"]]
        raw = await client.conversations.items.with_raw_response.delete(ids[1], conversation_id=cid)
        answer = json.loads(raw.text)
        strict(Conversation, answer, "conversation after item delete")
        assert answer == created
        remaining = [i["id"] for i in (await list_items(client, cid, order="asc"))["data"]]
        assert remaining == [ids[0], ids[2]]
        for call in (
            client.conversations.items.retrieve(ids[1], conversation_id=cid),
            client.conversations.items.delete(ids[1], conversation_id=cid),
        ):
            with pytest.raises(openai.NotFoundError) as caught:
                await call
            assert ids[1] in caught.value.message
        with pytest.raises(openai.NotFoundError) as caught:
            await client.conversations.items.delete(ids[0], conversation_id="conv_missing")
        assert "conv_missing" in caught.value.message
        assert caught.value.body["param"] == "conversation_id"  # type: ignore[index]


# (name, method, path under the conversation or None for /v1/conversations, body, param)
REFUSALS: list[tuple[str, str, str | None, Any, str | None]] = [
    ("body not an object", "POST", None, [1], None),
    ("unknown top-level key", "POST", None, {"itemz": []}, "itemz"),
    ("items not an array", "POST", None, {"items": "hi"}, "items"),
    ("21 items", "POST", None, {"items": [{"role": "user", "content": "x"}] * 21}, "items"),
    (
        "hosted tool item",
        "POST",
        None,
        {"items": [*MIXED_ITEMS[:2], {"type": "web_search_call", "id": "ws_1"}]},
        "items[2].type",
    ),
    ("item without type", "POST", None, {"items": [{"content": "x"}]}, "items[0].type"),
    ("bad role", "POST", None, {"items": [{"role": "tool", "content": "x"}]}, "items[0].role"),
    (
        "unknown item key",
        "POST",
        None,
        {"items": [{"role": "user", "content": "x", "name": "bob"}]},
        "items[0].name",
    ),
    (
        "output_text in a user message",
        "POST",
        None,
        {"items": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]},
        "items[0].content[0].type",
    ),
    (
        "image part",
        "POST",
        None,
        {"items": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "items[0].content[0].type",
    ),
    (
        "function_call without call_id",
        "POST",
        None,
        {"items": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
        "items[0].call_id",
    ),
    (
        "function_call_output output a number",
        "POST",
        None,
        {"items": [{"type": "function_call_output", "call_id": "c", "output": 4}]},
        "items[0].output",
    ),
    (
        "17 metadata pairs",
        "POST",
        None,
        {"metadata": {f"k{i}": "v" for i in range(17)}},
        "metadata",
    ),
    ("metadata value a number", "POST", None, {"metadata": {"k": 1}}, "metadata.k"),
    ("metadata value too long", "POST", None, {"metadata": {"k": "v" * 513}}, "metadata.k"),
    ("metadata key too long", "POST", None, {"metadata": {"k" * 65: "v"}}, "metadata"),
    ("update without metadata", "POST", "", {}, "metadata"),
    ("update unknown key", "POST", "", {"metadata": {}, "name": "x"}, "name"),
    ("update metadata not an object", "POST", "", {"metadata": [1]}, "metadata"),
    ("items.create empty", "POST", "/items", {"items": []}, "items"),
    ("items.create missing items", "POST", "/items", {}, "items"),
    (
        "items.create bad part",
        "POST",
        "/items",
        {"items": [{"role": "assistant", "content": [{"type": "output_text"}]}]},
        "items[0].content[0].text",
    ),
    ("limit 0", "GET", "/items?limit=0", None, "limit"),
    ("limit 101", "GET", "/items?limit=101", None, "limit"),
    ("limit not a number", "GET", "/items?limit=ten", None, "limit"),
    ("order sideways", "GET", "/items?order=sideways", None, "order"),
    ("include unknown", "GET", "/items?include[]=everything", None, "include"),
]


@pytest.mark.parametrize(
    ("name", "method", "path", "body", "param"), REFUSALS, ids=[r[0] for r in REFUSALS]
)
async def test_refused_requests_change_nothing(
    server: ServerHandle, name: str, method: str, path: str | None, body: Any, param: str | None
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        with trio.fail_after(DEADLINE):
            record = await server.conversations.create({"keep": "me"}, ())
            ok = await http.post(
                f"/v1/conversations/{record.id}/items",
                json={"items": [{"role": "user", "content": "kept"}]},
            )
            assert ok.status_code == 200
            before = await server.conversations.get(record.id)
            entries = server.conversations.statistics().entries
            url = "/v1/conversations" + ("" if path is None else f"/{record.id}{path}")
            reply = await http.request(method, url, json=body)
            message = envelope(reply, 400, param)
            if param is not None:
                assert param.split("[")[0].split(".")[0] in message
            after = await server.conversations.get(record.id)
            assert server.conversations.statistics().entries == entries
    assert after == before


@pytest.mark.parametrize(
    "raw",
    [b"{", b'{"metadata": {}, "metadata": {}}', b'{"metadata": {"k": NaN}}', b"\xff"],
    ids=["truncated", "duplicate key", "NaN", "not utf-8"],
)
async def test_malformed_json_is_400(server: ServerHandle, raw: bytes) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        with trio.fail_after(DEADLINE):
            record = await server.conversations.create({}, ())
            for url in ("/v1/conversations", f"/v1/conversations/{record.id}"):
                reply = await http.post(url, content=raw)
                # A NaN names the key holding it (issue 13); the others have no key to name.
                envelope(reply, 400, "metadata.k" if b"NaN" in raw else None)


async def test_routes_without_v1_prefix(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        with trio.fail_after(DEADLINE):
            created = (await http.post("/conversations", json={"metadata": {"a": "b"}})).json()
            cid = created["id"]
            assert (await http.get(f"/conversations/{cid}")).json() == created
            added = await http.post(
                f"/conversations/{cid}/items", json={"items": [{"role": "user", "content": "x"}]}
            )
            item_id = added.json()["first_id"]
            assert (await http.get(f"/conversations/{cid}/items")).json()["first_id"] == item_id
            got = await http.get(f"/conversations/{cid}/items/{item_id}")
            assert got.json()["id"] == item_id
            assert (await http.delete(f"/conversations/{cid}/items/{item_id}")).status_code == 200
            assert (await http.delete(f"/conversations/{cid}")).json()["deleted"] is True
            missing = await http.get(f"/conversations/{cid}")
            assert cid in envelope(missing, 404, "conversation_id")


async def test_responses_turns_list_as_strict_conversation_items(client: AsyncOpenAI) -> None:
    with trio.fail_after(DEADLINE):
        cid = (await create_conversation(client, items=[{"role": "system", "content": "Hi."}]))[
            "id"
        ]
        await client.responses.create(
            model=MODEL, input="Reply with: hello", conversation=cid, max_output_tokens=4
        )
        items = (await list_items(client, cid, order="asc"))["data"]
    assert [item["role"] for item in items] == ["system", "user", "assistant"]


async def test_disabled_store_refuses_every_route(nursery: trio.Nursery) -> None:
    settings = dataclasses.replace(
        server_settings(), conversation_store=StoreLimits(0, 1 << 20, 3600)
    )
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    routes: list[tuple[str, str, Any]] = [
        ("POST", "/v1/conversations", {}),
        ("GET", "/v1/conversations/conv_x", None),
        ("POST", "/v1/conversations/conv_x", {"metadata": {}}),
        ("DELETE", "/v1/conversations/conv_x", None),
        ("GET", "/v1/conversations/conv_x/items", None),
        ("POST", "/v1/conversations/conv_x/items", {"items": []}),
        ("GET", "/v1/conversations/conv_x/items/msg_x", None),
        ("DELETE", "/conversations/conv_x/items/msg_x", None),
    ]
    async with httpx.AsyncClient(base_url=handle.base_url, timeout=30) as http:
        with trio.fail_after(DEADLINE):
            for method, url, body in routes:
                reply = await http.request(method, url, json=body)
                assert "conversation store is disabled" in envelope(reply, 400, None)
    assert handle.conversations.statistics().entries == 0


def _agents_session_scenario(base_url: str) -> dict[str, Any]:
    """Runs on its own thread under asyncio: the Agents SDK uses asyncio locks."""
    from agents.memory import OpenAIConversationsSession

    async def scenario() -> dict[str, Any]:
        async with AsyncOpenAI(base_url=f"{base_url}/v1", api_key="sk-local") as client:
            session = OpenAIConversationsSession(openai_client=client)
            turns: list[Any] = [
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4"},
                *[{"role": "user", "content": f"more {i}"} for i in range(22)],
            ]
            await session.add_items(turns)
            everything = await session.get_items()
            last_two = await session.get_items(limit=2)
            popped = await session.pop_item()
            after_pop = await session.get_items()
            replayed = OpenAIConversationsSession(
                conversation_id=session.session_id, openai_client=client
            )
            await replayed.add_items(after_pop[:2])  # items read back are valid input again
            replayed_items = await replayed.get_items()
            conversation_id = session.session_id
            await session.clear_session()
            return {
                "id": conversation_id,
                "everything": everything,
                "last_two": last_two,
                "popped": popped,
                "after_pop": after_pop,
                "replayed": replayed_items,
            }

    return asyncio.run(scenario())


async def test_openai_agents_conversations_session(server: ServerHandle) -> None:
    pytest.importorskip("agents.memory")
    with trio.fail_after(DEADLINE):
        seen = await trio.to_thread.run_sync(_agents_session_scenario, server.base_url)
        gone = await server.conversations.get(seen["id"])
    texts = [item["content"][0]["text"] for item in seen["everything"]]
    assert texts == ["What is 2+2?", "4", *[f"more {i}" for i in range(22)]]
    assert [item["content"][0]["text"] for item in seen["last_two"]] == ["more 20", "more 21"]
    assert seen["popped"]["content"][0]["text"] == "more 21"
    assert seen["after_pop"] == seen["everything"][:-1]
    assert [i["content"][0]["text"] for i in seen["replayed"][-2:]] == ["What is 2+2?", "4"]
    assert gone is None  # clear_session deleted the conversation
