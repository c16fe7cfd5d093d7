"""Limits hold while the body streams in: a chunked body over ``--max-request-bytes`` is 413
at the limit, the rest is not read into memory, and the server keeps serving."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2 as httpx
import trio

from mlx_responses.server import ServerHandle

from .conftest import MODEL
from .memory import PeakGrowth
from .rawhttp import send_chunked

DEADLINE = 120
MIB = 1024 * 1024
BOUNDARY = "hostileboundary"


def multipart_upload(total: int, chunk: int = MIB) -> Iterator[bytes]:
    """A multipart ``/v1/files`` body with a ``total``-byte file part, made as it is sent."""
    yield (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nuser_data\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="big.bin"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    block = b"x" * chunk
    for _ in range(total // chunk):
        yield block
    yield f"\r\n--{BOUNDARY}--\r\n".encode()


async def assert_still_serving(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        ok = await http.post(
            "/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2}
        )
        assert ok.status_code == 200
        listed = await http.get("/v1/files")
        assert listed.json()["data"] == []


async def test_a_200_mib_chunked_upload_is_413_without_reading_it(server: ServerHandle) -> None:
    limit = 32 * MIB  # the server's default --max-request-bytes
    total = 200 * MIB
    with trio.fail_after(DEADLINE):
        with PeakGrowth() as growth:
            reply, sent = await send_chunked(
                server.base_url,
                "/v1/files",
                {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"},
                multipart_upload(total),
            )
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413"), reply[:300]
        assert b"file_too_large" in body
        # The server stopped reading near the limit (socket buffers hold a few MiB more)...
        assert sent < total // 2, sent
        # ... and held none of it in memory: growth far below the body (and the limit).
        assert growth.bytes < limit // 2, growth.bytes // MIB
        assert server.files.statistics().entries == 0
        await assert_still_serving(server)


def json_chunks(total: int) -> Iterator[bytes]:
    yield b'{"model": "' + MODEL.encode() + b'", "input": "'
    block = b"a" * MIB
    for _ in range(total // MIB):
        yield block
    yield b'"}'


async def test_a_chunked_json_body_over_the_limit_is_413(server: ServerHandle) -> None:
    with trio.fail_after(DEADLINE):
        before = server.store.statistics().entries
        reply, sent = await send_chunked(
            server.base_url,
            "/v1/responses",
            {"Content-Type": "application/json"},
            json_chunks(100 * MIB),
        )
        assert reply.startswith(b"HTTP/1.1 413"), reply[:300]
        assert b'"invalid_request_error"' in reply
        assert sent < 60 * MIB
        assert server.store.statistics().entries == before
        await assert_still_serving(server)
