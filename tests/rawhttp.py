"""A bare HTTP/1.1 client on a Trio socket, for tests that must hang up at an exact moment.

httpx's nested async generators cannot be abandoned mid-stream without leaking generators
(the test suite turns that warning into an error), and a raw socket makes "the client
disconnected" literal: we close the TCP connection.
"""

from __future__ import annotations

import json
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
