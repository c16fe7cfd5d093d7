"""``input_file`` parts: uploaded or inline files reach the model as text (decision 13)."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import httpx2 as httpx
import trio
from openai import AsyncOpenAI

from mlx_responses.http.auth import load_api_keys
from mlx_responses.server import ServerHandle, serve

from .conftest import MODEL, START_DEADLINE, server_settings
from .test_files_protocol import make_pdf

DEADLINE = 60


def with_file(part: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Read this."},
                {"type": "input_file", **part},
            ],
        }
    ]


async def count(http: httpx.AsyncClient, items: Any, **headers: str) -> httpx.Response:
    return await http.post(
        "/v1/responses/input_tokens", json={"model": MODEL, "input": items}, headers=headers
    )


async def test_an_uploaded_text_file_is_read_as_text(
    client: AsyncOpenAI, server: ServerHandle
) -> None:
    sentence = "The lighthouse keeper counts ships every night."
    with trio.fail_after(DEADLINE):
        uploaded = await client.files.create(
            file=("notes.md", sentence.encode(), "text/markdown"), purpose="user_data"
        )
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
            plain = (await count(http, [{"role": "user", "content": "Read this."}])).json()
            read = (await count(http, with_file({"file_id": uploaded.id}))).json()
            created = await http.post(
                "/v1/responses",
                json={
                    "model": MODEL,
                    "input": with_file({"file_id": uploaded.id}),
                    "max_output_tokens": 4,
                },
            )
            items = (await http.get(f"/v1/responses/{created.json()['id']}/input_items")).json()
    assert read["input_tokens"] > plain["input_tokens"] + 5
    text = "".join(p["text"] for p in items["data"][0]["content"])
    assert sentence in text
    assert 'name="notes.md"' in text


async def test_an_inline_pdf_is_read_as_its_text(server: ServerHandle) -> None:
    sentence = "Quarterly results improved in every region."
    data = "data:application/pdf;base64," + base64.b64encode(make_pdf([[sentence]])).decode()
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            created = await http.post(
                "/v1/responses",
                json={
                    "model": MODEL,
                    "input": with_file({"filename": "report.pdf", "file_data": data}),
                    "max_output_tokens": 4,
                },
            )
            assert created.status_code == 200, created.text
            items = (await http.get(f"/v1/responses/{created.json()['id']}/input_items")).json()
    assert sentence in "".join(p["text"] for p in items["data"][0]["content"])


async def test_unknown_and_unreadable_files_are_400_and_change_nothing(
    server: ServerHandle,
) -> None:
    binary = "data:application/octet-stream;base64," + base64.b64encode(bytes(range(256))).decode()
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            unknown = await count(http, with_file({"file_id": "file-missing"}))
            unreadable = await http.post(
                "/v1/responses",
                json={
                    "model": MODEL,
                    "input": with_file({"filename": "x.bin", "file_data": binary}),
                },
            )
            by_url = await count(http, with_file({"file_url": "https://example.com/a.pdf"}))
    assert unknown.status_code == 400
    assert unknown.json()["error"]["code"] == "file_not_found"
    assert unknown.json()["error"]["param"] == "input[0].content[1].file_id"
    assert unreadable.status_code == 400
    assert by_url.status_code == 400
    assert server.store.statistics().entries == 0
    assert server.model.statistics().sequences_finished == 0


async def test_another_tenants_file_is_not_found(nursery: trio.Nursery) -> None:
    settings = dataclasses.replace(server_settings(), api_keys=load_api_keys(["sk-a", "sk-b"]))
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, settings)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            uploaded = await http.post(
                "/v1/files",
                files={"file": ("a.txt", b"secret text", "text/plain")},
                data={"purpose": "user_data"},
                headers={"Authorization": "Bearer sk-a"},
            )
            file_id = uploaded.json()["id"]
            mine = await count(http, with_file({"file_id": file_id}), Authorization="Bearer sk-a")
            theirs = await count(http, with_file({"file_id": file_id}), Authorization="Bearer sk-b")
    assert mine.status_code == 200
    assert theirs.status_code == 400
    assert theirs.json()["error"]["code"] == "file_not_found"
