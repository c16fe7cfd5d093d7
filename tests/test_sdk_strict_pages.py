"""Every 200 body validates against the pinned SDK's types in strict mode, empty pages included
(``first_id``/``last_id`` are ``""``, not null) and files whose purpose the SDK lacks."""

from __future__ import annotations

import json
from typing import Any

import httpx2 as httpx
import pydantic
import trio
from openai.types import FileObject, Model
from openai.types.conversations import Conversation, ConversationItemList
from openai.types.responses import ResponseItemList

from mlx_responses.server import ServerHandle

from .conformance import assert_strict_response, unknown_keys
from .conftest import MODEL

DEADLINE = 60


# Documented extensions of a Model entry (docs/api.md): what Codex CLI and others read.
MODEL_EXTENSIONS = {
    "$.context_window",
    "$.max_output_tokens",
    "$.input_modalities",
    "$.output_modalities",
    "$.supports_reasoning",
    "$.supports_tools",
    "$.tool_call_format",
}


def strict(cls: Any, data: Any, extensions: frozenset[str] | set[str] = frozenset()) -> Any:
    model = pydantic.TypeAdapter(cls).validate_json(json.dumps(data), strict=True)
    unknown = set(unknown_keys(model)) - set(extensions)
    assert not unknown, unknown
    return model


async def test_empty_and_full_pages_validate_strictly(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        with trio.fail_after(DEADLINE):
            created = await http.post(
                "/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2}
            )
            assert created.status_code == 200
            response = created.json()
            assert_strict_response(response)
            items = (await http.get(f"/v1/responses/{response['id']}/input_items")).json()
            strict(ResponseItemList, items)
            after = items["last_id"]
            past_the_end = await http.get(
                f"/v1/responses/{response['id']}/input_items?after={after}"
            )
            assert past_the_end.status_code == 200
            empty = strict(ResponseItemList, past_the_end.json())
            assert (empty.data, empty.first_id, empty.last_id) == ([], "", "")

            conversation = (await http.post("/v1/conversations", json={})).json()
            strict(Conversation, conversation)
            no_items = (await http.get(f"/v1/conversations/{conversation['id']}/items")).json()
            page = strict(ConversationItemList, no_items)
            assert (page.data, page.first_id, page.last_id, page.has_more) == ([], "", "", False)

            files = (await http.get("/v1/files")).json()
            assert files == {
                "object": "list",
                "data": [],
                "first_id": "",
                "last_id": "",
                "has_more": False,
            }
            uploaded = await http.post(
                "/v1/files", files={"file": ("e.jsonl", b"{}\n")}, data={"purpose": "evals"}
            )
            strict(FileObject, uploaded.json())
            listed = (await http.get("/v1/files?purpose=evals")).json()
            assert [f["id"] for f in listed["data"]] == [uploaded.json()["id"]]
            for item in listed["data"]:
                strict(FileObject, item)

            models = (await http.get("/v1/models")).json()
            for item in models["data"]:
                strict(Model, item, MODEL_EXTENSIONS)
            strict(Model, (await http.get(f"/v1/models/{MODEL}")).json(), MODEL_EXTENSIONS)
