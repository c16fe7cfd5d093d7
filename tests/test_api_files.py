"""``/v1/files`` end to end with the official SDK, and the file store actor with a fake clock.

HTTP tests run the real server (``serve``); every JSON body is read raw and validated with the
SDK's ``FileObject`` / ``FileDeleted`` in strict mode plus a walk for keys they do not define.
Refusals are OpenAI's envelope, name the offending parameter, and store nothing.
"""

from __future__ import annotations

import dataclasses
import json
from functools import partial
from typing import Any

import httpx2 as httpx
import openai
import pytest
import trio
from openai import AsyncOpenAI
from openai.types import FileDeleted, FileObject

from mlx_responses.actors.file_store import FileStoreHandle
from mlx_responses.actors.store import Store, run_store
from mlx_responses.cli import build_parser, settings_from_args
from mlx_responses.http.auth import load_api_keys
from mlx_responses.protocol.files import extract_text
from mlx_responses.server import ServerHandle, serve
from mlx_responses.settings import DEFAULT_CONVERSATION_LIMITS, DEFAULT_RESPONSE_LIMITS
from mlx_responses.storage.choice import Budgets, memory_backends
from mlx_responses.storage.files import (
    FileLimits,
    MemoryFileStorage,
    StoredFile,
    charged_bytes,
)
from mlx_responses.storage.interface import StoreStatistics

from .conformance import unknown_keys
from .conftest import START_DEADLINE, server_settings
from .test_files_protocol import SENTENCE, make_pdf

DEADLINE = 30
WEEK = 604800
BINARY = bytes(range(256)) * 4 + b"\x00\xff\r\n"


def strict_file(data: dict[str, Any]) -> FileObject:
    model = FileObject.model_validate_json(json.dumps(data), strict=True)
    assert not unknown_keys(model), unknown_keys(model)
    assert set(data) == set(FileObject.model_fields)
    assert data["object"] == "file"
    assert data["status"] == "processed"
    assert data["id"].startswith("file-")
    return model


async def start(nursery: trio.Nursery, files: FileLimits | None = None) -> ServerHandle:
    settings = server_settings()
    if files is not None:
        settings = dataclasses.replace(settings, files=files)
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    return handle


def sdk(server: ServerHandle) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=f"{server.base_url}/v1", api_key="sk-local", max_retries=0, timeout=30
    )


async def upload(
    client: AsyncOpenAI, name: str, data: bytes, content_type: str | None = None, **kw: Any
) -> dict[str, Any]:
    """Upload through the SDK; the raw JSON body, validated strictly."""
    file = (name, data) if content_type is None else (name, data, content_type)
    raw = await client.files.with_raw_response.create(
        file=file, purpose=kw.pop("purpose", "user_data"), **kw
    )
    body: dict[str, Any] = json.loads(raw.http_response.content)
    strict_file(body)
    return body


def envelope(reply: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    error: dict[str, Any] = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param, error
    return error


# -- the routes, with the SDK --------------------------------------------------------------------


async def test_upload_retrieve_content_delete_round_trip(nursery: trio.Nursery) -> None:
    server = await start(nursery)
    async with sdk(server) as client:
        with trio.fail_after(DEADLINE):
            text = "# Notes\n\nÜnïcödé ✓\n".encode()
            notes = await upload(client, "notes.md", text, "text/markdown")
            blob = await upload(client, "blob.bin", BINARY)
            assert notes["bytes"] == len(text)
            assert blob["bytes"] == len(BINARY)
            assert notes["filename"] == "notes.md"
            assert notes["purpose"] == "user_data"
            assert notes["expires_at"] == notes["created_at"] + WEEK

            fetched = await client.files.with_raw_response.retrieve(notes["id"])
            assert json.loads(fetched.http_response.content) == notes

            for record, data, content_type in (
                (notes, text, "text/markdown"),
                (blob, BINARY, "application/octet-stream"),
            ):
                content = await client.files.content(record["id"])
                assert content.content == data  # byte for byte, binary included
                assert content.response.headers["content-type"] == content_type
                assert content.response.headers["x-content-type-options"] == "nosniff"

            deleted = await client.files.with_raw_response.delete(notes["id"])
            body = json.loads(deleted.http_response.content)
            model = FileDeleted.model_validate_json(json.dumps(body), strict=True)
            assert not unknown_keys(model)
            assert body == {"id": notes["id"], "object": "file", "deleted": True}

            for call in (
                client.files.retrieve,
                client.files.content,
                client.files.delete,
            ):
                with pytest.raises(openai.NotFoundError) as missing:
                    await call(notes["id"])
                assert notes["id"] in str(missing.value)
            assert (await client.files.retrieve(blob["id"])).id == blob["id"]
    stats = server.files.statistics()
    assert (stats.entries, stats.bytes) == (1, charged_bytes_of(blob, BINARY))


def charged_bytes_of(body: dict[str, Any], data: bytes) -> int:
    return charged_bytes(
        StoredFile(
            id=body["id"],
            filename=body["filename"],
            purpose=body["purpose"],
            content_type="application/octet-stream",
            data=data,
            created_at=0,
            expires_at=None,
        )
    )


async def test_list_pages_in_order_and_filters_by_purpose(nursery: trio.Nursery) -> None:
    server = await start(nursery)
    async with sdk(server) as client:
        with trio.fail_after(DEADLINE):
            uploaded = [
                await upload(client, f"f{i}.txt", f"file {i}".encode(), purpose=purpose)
                for i, purpose in enumerate(["user_data", "vision", "user_data", "assistants"])
            ]
            ids = [f["id"] for f in uploaded]
            # The SDK follows `after` from page to page.
            newest_first = [f.id async for f in client.files.list(limit=1)]
            assert newest_first == ids[::-1]
            oldest_first = [f.id async for f in client.files.list(limit=3, order="asc")]
            assert oldest_first == ids
            user_data = [f.id async for f in client.files.list(purpose="user_data")]
            assert user_data == [ids[2], ids[0]]
            assert [f.id async for f in client.files.list(purpose="batch")] == []

        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            with trio.fail_after(DEADLINE):
                page = (await http.get("/v1/files", params={"limit": 2})).json()
                after = (await http.get("/files", params={"limit": 2, "after": ids[2]})).json()
                default = (await http.get("/v1/files")).json()
                bad_after = await http.get("/v1/files", params={"after": "file-nope"})
                bad_limit = await http.get("/v1/files", params={"limit": "0"})
                bad_order = await http.get("/v1/files", params={"order": "sideways"})
                bad_purpose = await http.get("/v1/files", params={"purpose": "nonsense"})
    assert set(page) == {"object", "data", "first_id", "last_id", "has_more"}
    assert page["object"] == "list"
    assert [f["id"] for f in page["data"]] == [ids[3], ids[2]]
    assert (page["first_id"], page["last_id"], page["has_more"]) == (ids[3], ids[2], True)
    assert [f["id"] for f in after["data"]] == [ids[1], ids[0]]
    assert after["has_more"] is False
    assert [f["id"] for f in default["data"]] == ids[::-1]
    for item in page["data"] + default["data"]:
        strict_file(item)
    assert "file-nope" in envelope(bad_after, 404, "after")["message"]
    envelope(bad_limit, 400, "limit")
    envelope(bad_order, 400, "order")
    envelope(bad_purpose, 400, "purpose")


async def test_refused_uploads_are_400_and_store_nothing(nursery: trio.Nursery) -> None:
    server = await start(nursery)
    async with sdk(server) as client, httpx.AsyncClient(base_url=server.base_url) as http:
        with trio.fail_after(DEADLINE):
            with pytest.raises(openai.BadRequestError) as bad_purpose:
                await client.files.create(file=("a.txt", b"x"), purpose="batch")
            bad_anchor = await http.post(
                "/v1/files",
                files={"file": ("a.txt", b"x")},
                data={"expires_after[anchor]": "never", "expires_after[seconds]": "3600"},
            )
            too_long = await http.post(
                "/v1/files",
                files={"file": ("a.txt", b"x")},
                data={"expires_after[anchor]": "created_at", "expires_after[seconds]": "2592000"},
            )
            unknown = await http.post(
                "/v1/files", files={"file": ("a.txt", b"x")}, data={"purpose": "vision", "x": "1"}
            )
            other_part = await http.post("/v1/files", files={"document": ("a.txt", b"x")})
            no_file = await http.post("/v1/files", files={"purpose": (None, b"user_data")})
            two_files = await http.post(
                "/v1/files", files=[("file", ("a.txt", b"x")), ("file", ("b.txt", b"y"))]
            )
            field_not_file = await http.post("/v1/files", files={"file": (None, b"inline text")})
            urlencoded = await http.post("/v1/files", data={"file": "inline text"})
            json_body = await http.post("/v1/files", json={"file": "x", "purpose": "user_data"})
            listed = (await http.get("/v1/files")).json()
    error = bad_purpose.value.body
    assert isinstance(error, dict)
    assert error["param"] == "purpose"
    assert "'batch'" in error["message"]
    envelope(bad_anchor, 400, "expires_after.anchor")
    assert str(WEEK) in envelope(too_long, 400, "expires_after.seconds")["message"]
    assert "'x'" in envelope(unknown, 400, "x")["message"]
    envelope(other_part, 400, "document")
    envelope(no_file, 400, "file")
    envelope(two_files, 400, "file")
    envelope(field_not_file, 400, "file")
    assert "application/x-www-form-urlencoded" in envelope(urlencoded, 400, None)["message"]
    assert "multipart/form-data" in envelope(json_body, 400, None)["message"]
    assert listed["data"] == []
    assert server.files.statistics() == StoreStatistics()


async def test_purpose_defaults_to_user_data_and_routes_work_without_v1(
    nursery: trio.Nursery,
) -> None:
    server = await start(nursery)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        with trio.fail_after(DEADLINE):
            created = await http.post("/files", files={"file": ("data.csv", b"a,b\n1,2\n")})
            assert created.status_code == 200, created.text
            body = created.json()
            strict_file(body)
            evals = await http.post(
                "/v1/files", files={"file": ("e.jsonl", b"{}\n")}, data={"purpose": "evals"}
            )
            content = await http.get(f"/files/{body['id']}/content")
            deleted = await http.delete(f"/files/{body['id']}")
    assert body["purpose"] == "user_data"
    assert content.content == b"a,b\n1,2\n"
    assert content.headers["content-type"] == "text/csv"  # httpx's guess from the name
    assert "filename*=UTF-8''data.csv" in content.headers["content-disposition"]
    assert deleted.json()["deleted"] is True
    # `evals` is a purpose of spec 001 that the pinned SDK's FileObject literal lacks: the
    # object shows it as `user_data`, so it validates strictly as it is.
    assert evals.status_code == 200, evals.text
    assert evals.json()["purpose"] == "user_data"
    strict_file(evals.json())


async def test_expires_after_shortens_the_lifetime(nursery: trio.Nursery) -> None:
    server = await start(nursery)
    async with sdk(server) as client:
        with trio.fail_after(DEADLINE):
            short = await upload(
                client,
                "a.txt",
                b"x",
                expires_after={"anchor": "created_at", "seconds": 3600},
            )
    assert short["expires_at"] == short["created_at"] + 3600


async def test_per_file_limit_is_413(nursery: trio.Nursery) -> None:
    server = await start(nursery, FileLimits(max_file_bytes=1000))
    async with sdk(server) as client:
        with trio.fail_after(DEADLINE):
            fits = await upload(client, "fits.bin", b"x" * 1000)
            with pytest.raises(openai.APIStatusError) as refused:
                await client.files.create(file=("big.bin", b"x" * 1001), purpose="user_data")
            listed = [f.id async for f in client.files.list()]
    assert fits["bytes"] == 1000
    assert refused.value.status_code == 413
    error = refused.value.body
    assert isinstance(error, dict)
    assert (error["code"], error["param"]) == ("file_too_large", "file")
    assert "1001" in error["message"]
    assert "--files-max-file-bytes" in error["message"]
    assert listed == [fits["id"]]


async def test_a_body_over_the_request_limit_is_413_file_too_large(nursery: trio.Nursery) -> None:
    settings = dataclasses.replace(server_settings(), max_request_bytes=10_000)
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, settings)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        with trio.fail_after(DEADLINE):
            refused = await http.post("/v1/files", files={"file": ("a.bin", b"x" * 20_000)})
    assert envelope(refused, 413, "file")["code"] == "file_too_large"
    assert server.files.statistics().entries == 0


async def test_the_byte_budget_evicts_least_recently_used_files(nursery: trio.Nursery) -> None:
    size = 2000
    one = charged_bytes_of(
        {"id": "file-" + "0" * 48, "filename": "f0.bin", "purpose": "user_data"}, b"x" * size
    )
    server = await start(nursery, FileLimits(max_bytes=2 * one + 10, max_file_bytes=4 * size))
    async with sdk(server) as client:
        with trio.fail_after(DEADLINE):
            a, b = [await upload(client, f"f{i}.bin", bytes([i]) * size) for i in range(2)]
            assert (await client.files.retrieve(a["id"])).id == a["id"]  # a most recent now
            c = await upload(client, "f2.bin", b"\x02" * size)
            with pytest.raises(openai.NotFoundError):
                await client.files.retrieve(b["id"])
            held = [f.id async for f in client.files.list(order="asc")]
            assert held == [a["id"], c["id"]]
            assert (await client.files.content(c["id"])).content == b"\x02" * size
            # Larger than the whole budget (but not than the per-file limit): 413, nothing lost.
            with pytest.raises(openai.APIStatusError) as refused:
                await client.files.create(file=("huge.bin", b"x" * 3 * size), purpose="user_data")
            assert [f.id async for f in client.files.list(order="asc")] == held
    assert refused.value.status_code == 413
    assert "--files-max-bytes" in str(refused.value)
    stats = server.files.statistics()
    assert (stats.entries, stats.evictions, stats.rejections) == (2, 1, 1)
    assert stats.bytes == 2 * one


# -- the actor, with a fake clock ----------------------------------------------------------------


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def start_actor(
    nursery: trio.Nursery, limits: FileLimits, clock: FakeClock, wall: FakeClock
) -> FileStoreHandle:
    budgets = Budgets(DEFAULT_RESPONSE_LIMITS, DEFAULT_CONVERSATION_LIMITS, limits)
    storage = MemoryFileStorage(limits, clock=clock)
    backends = memory_backends(budgets, files=storage)
    store: Store = await nursery.start(partial(run_store, budgets, backends, wall_clock=wall))
    return store.files


async def put(store: FileStoreHandle, owner: str = "", **kw: Any) -> StoredFile:
    record = await store.put(
        filename="a.txt",
        purpose="user_data",
        content_type="text/plain",
        data=b"hi",
        owner=owner,
        **kw,
    )
    assert record is not None
    return record


async def test_actor_ttl_expires_files_with_a_fake_clock(nursery: trio.Nursery) -> None:
    clock, wall = FakeClock(50.0), FakeClock(1_700_000_000.5)
    with trio.fail_after(DEADLINE):
        store = await start_actor(nursery, FileLimits(ttl_seconds=100), clock, wall)
        long = await put(store)
        short = await put(store, expires_after=40)
        assert (long.created_at, long.expires_at) == (1_700_000_000, 1_700_000_100)
        assert short.expires_at == 1_700_000_040
        clock.now += 39.9
        assert await store.get(short.id) is not None
        clock.now += 0.1
        assert await store.get(short.id) is None
        assert [f.id for f in await store.list()] == [long.id]
        clock.now += 59.9
        assert await store.get(long.id) is not None  # reading does not extend the TTL
        clock.now += 0.1
        assert await store.get(long.id) is None
        assert not await store.delete(long.id)
        assert store.statistics().expirations == 2
        assert store.statistics().entries == 0


async def test_actor_without_ttl_has_no_expiry(nursery: trio.Nursery) -> None:
    clock, wall = FakeClock(0.0), FakeClock(1_700_000_000)
    with trio.fail_after(DEADLINE):
        store = await start_actor(nursery, FileLimits(ttl_seconds=0), clock, wall)
        forever = await put(store)
        bounded = await put(store, expires_after=3600)
        assert forever.expires_at is None
        assert bounded.expires_at == 1_700_003_600
        clock.now += 10**9
        assert [f.id for f in await store.list()] == [forever.id]


async def test_actor_owner_isolation(nursery: trio.Nursery) -> None:
    with trio.fail_after(DEADLINE):
        store = await start_actor(nursery, FileLimits(), FakeClock(0), FakeClock(0))
        alice = await put(store, "alice")
        assert alice.owner == "alice"
        assert await store.get(alice.id, "bob") is None
        assert await store.get(alice.id) is None
        assert await store.list("bob") == ()
        assert not await store.delete(alice.id, "bob")
        assert await store.get(alice.id, "alice") == alice
        assert await store.delete(alice.id, "alice")


async def test_actor_refusals_store_nothing_and_errors_reach_the_asker(
    nursery: trio.Nursery,
) -> None:
    class Broken(MemoryFileStorage):
        def list(self, owner: str = "", purpose: str | None = None) -> tuple[StoredFile, ...]:
            raise RuntimeError("backend down")

    limits = FileLimits(max_bytes=10_000, max_file_bytes=100)
    with trio.fail_after(DEADLINE):
        budgets = Budgets(DEFAULT_RESPONSE_LIMITS, DEFAULT_CONVERSATION_LIMITS, limits)
        backends = memory_backends(budgets, files=Broken(limits))
        store = (await nursery.start(run_store, budgets, backends)).files
        too_big = await store.put(
            filename="a", purpose="user_data", content_type="text/plain", data=b"x" * 101
        )
        assert too_big is None
        with pytest.raises(RuntimeError, match="backend down"):
            await store.list()
        kept = await put(store)  # the actor is still serving
        assert await store.get(kept.id) == kept
        assert store.statistics().rejections == 0  # the per-file limit is not a budget refusal
        assert store.statistics().entries == 1


async def test_a_pdf_round_trips_and_the_handle_gives_its_text(nursery: trio.Nursery) -> None:
    server = await start(nursery)
    pdf = make_pdf([[SENTENCE]])
    async with sdk(server) as client:
        with trio.fail_after(DEADLINE):
            record = await upload(client, "report.pdf", pdf)
            content = await client.files.content(record["id"])
            stored = await server.files.get(record["id"])  # what input_file will use
            other = await server.files.get(record["id"], "another-tenant")
    assert content.content == pdf
    assert content.response.headers["content-type"] == "application/pdf"
    assert stored is not None
    assert other is None
    assert (stored.filename, stored.purpose, stored.content_type) == (
        "report.pdf",
        "user_data",
        "application/pdf",
    )
    text = extract_text(stored.data, filename=stored.filename, content_type=stored.content_type)
    assert text == SENTENCE


async def test_another_tenants_file_is_404_on_every_route(nursery: trio.Nursery) -> None:
    settings = dataclasses.replace(server_settings(), api_keys=load_api_keys(["sk-a", "sk-b"]))
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, settings)
    url = f"{server.base_url}/v1"
    async with (
        AsyncOpenAI(base_url=url, api_key="sk-a", max_retries=0, timeout=30) as alice,
        AsyncOpenAI(base_url=url, api_key="sk-b", max_retries=0, timeout=30) as bob,
    ):
        with trio.fail_after(DEADLINE):
            mine = await upload(alice, "secret.txt", b"alice only")
            for call in (bob.files.retrieve, bob.files.content, bob.files.delete):
                with pytest.raises(openai.NotFoundError):
                    await call(mine["id"])
            assert [f.id async for f in bob.files.list()] == []
            assert [f.id async for f in alice.files.list()] == [mine["id"]]
            assert (await alice.files.content(mine["id"])).content == b"alice only"


def test_file_flags_defaults_environment_and_command_line() -> None:
    defaults = settings_from_args(build_parser({}).parse_args(["serve"])).files
    assert defaults == FileLimits(1 << 30, 32 << 20, WEEK)
    env = {
        "MLX_RESPONSES_FILES_MAX_BYTES": "5000",
        "MLX_RESPONSES_FILES_MAX_FILE_BYTES": "100",
        "MLX_RESPONSES_FILES_TTL_SECS": "0",
    }
    from_env = settings_from_args(build_parser(env).parse_args(["serve"])).files
    assert from_env == FileLimits(5000, 100, 0)
    argv = ["serve", "--files-max-file-bytes", "7", "--files-ttl-secs", "60"]
    assert settings_from_args(build_parser(env).parse_args(argv)).files == FileLimits(5000, 7, 60)
    with pytest.raises(SystemExit, match="--files-max-bytes must not be negative"):
        settings_from_args(build_parser({}).parse_args(["serve", "--files-max-bytes", "-1"]))
