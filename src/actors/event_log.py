"""One response's event log: the events its task published, for every subscriber.

Invariants:
- An ``EventLog`` has exactly one writer, the response task that owns it; any number of
  subscribers (an SSE body, a JSON answer, the Anthropic encoder, a replaying ``GET
  ?stream=true``) wait on it. Events are only appended, never changed; ``close`` is final,
  records the final object, and wakes every reader.
- Each event is encoded as SSE at most once (``encoded``), however many subscribers read it.
- A stored response's record is in the response store before its log closes, so a
  subscriber that saw the terminal event and then GETs the response finds it.
- Besides the events, the log carries the facts a transport needs back from its response
  (the request is a frozen value with no back-channel): the prompt-cache read of its
  first sequence (``cached_tokens``, final once any output was seen) and the prompt as rendered
  (``rendered``, when the request asked to keep it), both written by the owner only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import trio

from ..protocol.events.sse import encode_sse
from ..protocol.prompt_memo import RenderedPrompt
from ..storage.interface import scoped

JsonObject = dict[str, Any]


class EventLog:
    """The events of one response, in order (single writer, many readers)."""

    def __init__(
        self, response_id: str, snapshot: Callable[[], JsonObject], owner: str = ""
    ) -> None:
        self.response_id = response_id
        self.owner = owner
        self.key = scoped(owner, response_id)
        self._snapshot = snapshot
        # The Response as it was created: what a background create answers ("queued", spec
        # 000), however far its job has got by the time the route answers.
        self.created: JsonObject = snapshot()
        self._events: list[JsonObject] = []
        self._sse: list[bytes] = []  # the first len(_sse) events, SSE-encoded (filled lazily)
        self._closed = False
        self._changed = trio.Event()
        self.prompt_tokens = 0  # set by the owner once its prompt is admitted
        # What the status page shows: the lifecycle table's status, set by the owner's run as
        # it moves (``ResponseRun.step``), and the tokens generated so far.
        self.status = "queued"
        self.output_tokens = 0
        # Every item the response was generated from (history and input), set by the owner.
        self.input_items: tuple[JsonObject, ...] = ()
        self.final: JsonObject | None = None  # the final object, once closed
        # The stop sequence that ended the generation, once closed (the Anthropic encoding).
        self.stop_sequence: str | None = None
        # The prompt as rendered, kept for a WebSocket continuation (``keep_render``).
        self.rendered: RenderedPrompt | None = None
        # Reads the first sequence's prompt-cache hit (the generation thread writes
        # it when it consults the cache, before the sequence's first output).
        self._cache_read: Callable[[], int] | None = None

    def admitted(self, prompt_tokens: int, cached: Callable[[], int]) -> None:
        """Sender: the owner, as its first sequence is admitted: that prompt's tokens, and how
        to read its prompt-cache hit (a later sequence's reader is not kept)."""
        self.prompt_tokens = prompt_tokens
        if self._cache_read is None:
            self._cache_read = cached

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the prompt cache served the first sequence (0 before admission)."""
        return self._cache_read() if self._cache_read is not None else 0

    async def wait_closed(self) -> None:
        while not self._closed:
            await self._changed.wait()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def events(self) -> tuple[JsonObject, ...]:
        return tuple(self._events)

    def snapshot(self) -> JsonObject:
        """The response object as it stands now (a fresh copy); the final one once closed."""
        return dict(self.final) if self.final is not None else self._snapshot()

    def append(self, events: Sequence[JsonObject]) -> None:
        if self._closed:
            raise RuntimeError(f"event log of {self.response_id} is closed")
        if events:
            self._events.extend(events)
            self._wake()

    def close(self, final: JsonObject, stop_sequence: str | None = None) -> None:
        if not self._closed:
            self.final = final
            self.stop_sequence = stop_sequence
            self._closed = True
            self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def encoded(self, start: int, stop: int) -> bytes:
        """Events ``[start, stop)`` as one SSE chunk; each event is encoded once, for all."""
        sse, events = self._sse, self._events
        for index in range(len(sse), min(stop, len(events))):
            sse.append(encode_sse(events[index]))
        return b"".join(sse[start:stop])

    async def wait_after(self, position: int) -> list[JsonObject]:
        """Events from ``position`` on, waiting for some; ``[]`` once closed and read out."""
        while position >= len(self._events) and not self._closed:
            await self._changed.wait()
        return self._events[position:]
