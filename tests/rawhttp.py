"""A bare HTTP/1.1 client on a Trio socket, for tests that must hang up at an exact moment.

httpx's nested async generators cannot be abandoned mid-stream without leaking generators
(the test suite turns that warning into an error), and a raw socket makes "the client
disconnected" literal: we close the TCP connection.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import trio


async def open_stream(base_url: str, path: str, body: dict[str, Any]) -> trio.SocketStream:
    """POST ``body`` as JSON and return the connection with the response still unread."""
    url = urlsplit(base_url)
    assert url.hostname is not None
    assert url.port is not None
    stream = await trio.open_tcp_stream(url.hostname, url.port)
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nAccept: text/event-stream\r\n\r\n"
    ).encode()
    await stream.send_all(head + payload)
    return stream


async def read_until(stream: trio.SocketStream, marker: bytes, count: int = 1) -> bytes:
    """Read until ``marker`` has been seen ``count`` times; returns everything read."""
    seen = b""
    while seen.count(marker) < count:
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise AssertionError(f"connection closed before {marker!r}: {seen[-500:]!r}")
        seen += chunk
    return seen


async def send_chunked(
    base_url: str,
    path: str,
    headers: dict[str, str],
    chunks: Iterator[bytes],
) -> tuple[bytes, int]:
    """POST a ``Transfer-Encoding: chunked`` body generated lazily from ``chunks`` while
    reading the reply. Stops sending when the server answers or closes the connection;
    returns (everything the server sent, body bytes sent)."""
    url = urlsplit(base_url)
    assert url.hostname is not None
    assert url.port is not None
    stream = await trio.open_tcp_stream(url.hostname, url.port)
    head = f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nTransfer-Encoding: chunked\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
    reply = bytearray()
    sent = 0  # body bytes
    answered = trio.Event()

    async def receive() -> None:
        try:
            while chunk := await stream.receive_some(65536):
                reply.extend(chunk)
                answered.set()
        except trio.BrokenResourceError:
            pass  # a reset after the reply: what was read stays
        answered.set()

    async with stream, trio.open_nursery() as nursery:
        nursery.start_soon(receive)
        try:
            await stream.send_all(head.encode())
            for chunk in chunks:
                if answered.is_set():
                    break
                await stream.send_all(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
            else:
                await stream.send_all(b"0\r\n\r\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the server closed the connection: it stopped reading
        with trio.move_on_after(10):
            await answered.wait()
        # The rest of the reply, until the server closes (or a moment passes, keep-alive).
        nursery.cancel_scope.deadline = trio.current_time() + 2
    return bytes(reply), sent
