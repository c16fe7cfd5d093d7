"""Each HTTP request's lifetime as a channel: a response opened by the request subscribes to it.

Invariants:
- ``RequestLifetimes`` wraps the ASGI app: every HTTP request (and WebSocket) gets a
  ``RequestLifetime`` before Quart sees it, and its ``finally`` closes it however the request
  ends: answered, failed, or the client gone at any point (while the view runs, while the
  response start is sent, while the body streams). Quart's own hooks miss some of these (a
  body iterator that never started), this cannot.
- ``presence()`` is a receive channel that never carries a message and ends when the request
  does; a foreground response task watches it (``supervisor._watch_presence``), so a client
  that leaves cancels its response wherever the request was.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import trio

_current: ContextVar[RequestLifetime | None] = ContextVar("request_lifetime", default=None)


class RequestLifetime:
    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[None](0)

    def presence(self) -> trio.MemoryReceiveChannel[None]:
        """A channel that ends when this request ends."""
        return self._receive.clone()

    def close(self) -> None:
        self._send.close()
        self._receive.close()


def presence() -> trio.MemoryReceiveChannel[None]:
    """The current request's presence channel."""
    lifetime = _current.get()
    if lifetime is None:  # pragma: no cover - every request passes through RequestLifetimes
        raise RuntimeError("no request lifetime: the app is not wrapped in RequestLifetimes")
    return lifetime.presence()


class RequestLifetimes:
    """ASGI middleware: one ``RequestLifetime`` per HTTP request or WebSocket."""

    def __init__(self, app: Any) -> None:
        self._app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self._app(scope, receive, send)
            return
        lifetime = RequestLifetime()
        token = _current.set(lifetime)
        try:
            await self._app(scope, receive, send)
        finally:
            lifetime.close()
            _current.reset(token)
