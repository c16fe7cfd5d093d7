"""What a run writes as it ends, before its terminal event is published: the final record in
the response store (with ``store``), what the client echoes back, the turn in its
conversation. ``ResponseRun`` (``run.py``) calls these shielded and bounded; the lifecycle
table (``protocol/lifecycle.py``) says whether they are written at all.

Invariants:
- Nothing here publishes: the run publishes the terminal event after these return, so a
  subscriber that read it and then GETs the response finds it.
- A background job whose final object alone exceeds the store's byte budget still leaves an
  answer for its pollers: the failed stand-in (``protocol.records.failed_unstarted``).
- Only a finished response (``completed``, ``incomplete``) is echoed or appended to its
  conversation.
"""

from __future__ import annotations

import logging

from ..protocol.objects import JsonObject
from ..protocol.records import failed_unstarted
from ..protocol.request import CreateRequest
from ..storage.interface import StoredResponse
from .prompt import PreparedPrompt
from .runtime import Actors

log = logging.getLogger(__name__)

TOO_LARGE = (
    "The response finished but its final object is larger than the response store's byte "
    "budget (--responses-store-max-bytes)."
)


async def write_records(
    actors: Actors,
    request: CreateRequest,
    prepared: PreparedPrompt,
    final: JsonObject,
    events: tuple[JsonObject, ...],
) -> None:
    """The records of a response that ends with ``final`` after ``events``; raises what the
    store raises."""
    config = request.config
    owner = request.owner
    if config.store and actors.store.enabled:
        record = StoredResponse(final, prepared.all_items, events, owner)
        await actors.store.put(record)
        if config.background and await actors.store.get(record.id, owner) is None:
            await actors.store.put(failed_unstarted(final, prepared.all_items, owner, TOO_LARGE))
    output = final.get("output") or []
    finished = final["status"] in ("completed", "incomplete")
    if finished and actors.echo is not None:
        await actors.echo.remember(owner, output)
    if config.conversation_id is not None and output and finished:
        await actors.conversations.append(
            config.conversation_id, prepared.new_items + tuple(output), owner
        )


async def write_failed(
    actors: Actors,
    request: CreateRequest,
    prepared: PreparedPrompt,
    final: JsonObject,
    events: tuple[JsonObject, ...],
) -> None:
    """After a write that timed out: the failed record, queued behind it in the store (it
    may still land), so the store ends agreeing with what the followers saw. Never raises."""
    config, store = request.config, actors.store
    if not (config.store and store.enabled):
        return
    try:
        await store.put(StoredResponse(final, prepared.all_items, events, request.owner))
    except Exception:
        log.exception("could not store failed response %s", final.get("id"))
