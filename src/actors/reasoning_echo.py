"""The reasoning echo: remember the reasoning behind each plain reply, and give it
back when a later request replays that reply without its reasoning item.

Invariants:
- The store actor (``store.py``) owns the memory (``storage.memory.MemoryEchoStorage``): reply
  text -> reasoning text, per tenant, least recently used evicted first under a byte budget (``MLXCEL_REASONING_ECHO_MAX_BYTES``, default 16 MiB; 0
  disables the echo entirely).
- Only plain replies are remembered: a finished response whose output is reasoning followed by
  one message (no tool call). The key is the reply's visible text, so a client that replays the
  assistant message (string or parts) without its reasoning item still finds it.
- ``restore`` only ever inserts a reasoning item right before an assistant message that has none;
  it never changes or reorders anything else, so a turn renders as it was generated.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, assert_never

import trio

from ..protocol.items.images import text_of
from ..protocol.items.read import InputItem, InputMessage, Reasoning
from ..storage.interface import EchoStorage
from ..storage.memory import DEFAULT_ECHO_BYTES
from .kit import Reply
from .store_part import StoreAnswer, StorePart

DEFAULT_MAX_BYTES = DEFAULT_ECHO_BYTES


def _key(owner: str, reply_text: str) -> str:
    return hashlib.sha256(f"{owner}\0{reply_text}".encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Remember:
    """Sender: a response actor whose response finished as a plain reply."""

    key: str
    reasoning: str
    reply: Reply[StoreAnswer[None]]


@dataclass(frozen=True, slots=True)
class Recall:
    """Sender: a response actor rendering a history. Replies key -> reasoning for known keys."""

    keys: tuple[str, ...]
    reply: Reply[StoreAnswer[dict[str, str]]]


EchoMessage = Remember | Recall


def plain_reply(output: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """(reply text, reasoning text) when ``output`` is one reasoning item then one message."""
    if len(output) != 2 or output[0].get("type") != "reasoning":
        return None
    message = output[1]
    if message.get("type") != "message":
        return None
    reasoning = "".join(p.get("text", "") for p in output[0].get("content") or [])
    text = "".join(
        p.get("text", "") for p in message.get("content") or [] if p.get("type") == "output_text"
    )
    return (text, reasoning) if reasoning and text else None


class ReasoningEchoHandle(StorePart[EchoMessage]):
    """The store actor's handle for the reasoning echo (``Store.echo``)."""

    def __init__(self, mailbox: trio.MemorySendChannel[EchoMessage], max_bytes: int) -> None:
        super().__init__(mailbox)
        self.max_bytes = max_bytes

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    async def remember(self, owner: str, output: Sequence[Mapping[str, Any]]) -> None:
        found = plain_reply(output) if self.enabled else None
        if found is not None:
            key, reasoning = _key(owner, found[0]), found[1]
            await self._tell(lambda reply: Remember(key, reasoning, reply))

    async def restore(self, owner: str, items: Sequence[InputItem]) -> list[InputItem]:
        """``items`` with the remembered reasoning put back before assistant replies lacking it."""
        wanted = [
            i
            for i, item in enumerate(items)
            if isinstance(item, InputMessage)
            and item.role == "assistant"
            and item.text
            and not (i > 0 and isinstance(items[i - 1], Reasoning))
        ]
        if not self.enabled or not wanted:
            return list(items)
        keys = tuple(_key(owner, text_of(items[i].text)) for i in wanted)  # type: ignore[union-attr]
        known: dict[str, str] = await self._ask(lambda reply: Recall(keys, reply))
        restored: list[InputItem] = []
        slots = dict(zip(wanted, keys, strict=True))
        for i, item in enumerate(items):
            reasoning = known.get(slots[i]) if i in slots else None
            if reasoning is not None:
                restored.append(Reasoning(reasoning))
            restored.append(item)
        return restored


def answer(backend: EchoStorage, message: EchoMessage) -> object:
    """Apply one request to the echo's memory; the reply's value."""
    match message:
        case Remember(key, reasoning, _):
            backend.remember(key, reasoning)
            return None
        case Recall(keys, _):
            return backend.recall(keys)
        case _:
            assert_never(message)
