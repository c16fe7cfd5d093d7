"""The store actor's responses and conversations through their handles, with a fake clock.

The store actor runs as a real Trio task with the in-memory backends; the backend's clock is a
``FakeClock`` the test moves by hand, so TTL expiry is tested without sleeping.
"""

from __future__ import annotations

import pytest
import trio

from mlx_responses.actors.conversation_store import ConversationStoreHandle
from mlx_responses.actors.response_store import ResponseStoreHandle
from mlx_responses.actors.store import Store, run_store
from mlx_responses.actors.store_part import StorePart
from mlx_responses.protocol.items.read import InputMessage, Reasoning
from mlx_responses.storage.choice import Budgets, memory_backends
from mlx_responses.storage.files import FileLimits
from mlx_responses.storage.interface import (
    ConversationRecord,
    StoredResponse,
    StoreLimits,
    StoreStatistics,
)
from mlx_responses.storage.memory import (
    MemoryConversationStorage,
    MemoryResponseStorage,
    serialized_size,
)

DEADLINE = 5
BIG = 1 << 20


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(response_id: str, text: str = "hello") -> StoredResponse:
    message = {
        "id": f"msg_{response_id}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return StoredResponse(
        {"id": response_id, "object": "response", "status": "completed", "output": [message]},
        input_items=({"id": "msg_in", "type": "message", "role": "user", "content": "hi"},),
        literal_events=({"type": "response.completed", "sequence_number": 0},),
    )


def user_item(item_id: str, text: str = "hi") -> dict[str, object]:
    return {"id": item_id, "type": "message", "role": "user", "content": text}


async def start_responses(
    nursery: trio.Nursery, limits: StoreLimits, clock: FakeClock
) -> ResponseStoreHandle:
    budgets = Budgets(limits, limits)
    storage = MemoryResponseStorage(limits, clock=clock)
    store: Store = await nursery.start(
        run_store, budgets, memory_backends(budgets, responses=storage)
    )
    return store.responses


async def start_conversations(
    nursery: trio.Nursery, limits: StoreLimits, clock: FakeClock
) -> ConversationStoreHandle:
    budgets = Budgets(limits, limits)
    storage = MemoryConversationStorage(limits, clock=clock)
    backends = memory_backends(budgets, conversations=storage)
    store: Store = await nursery.start(run_store, budgets, backends)
    return store.conversations


async def held(handle: ResponseStoreHandle, ids: list[str]) -> list[str]:
    """The ids among ``ids`` that a get finds (each get refreshes recency, in this order)."""
    return [i for i in ids if await handle.get(i) is not None]


# -- the response store --------------------------------------------------------------------------


async def test_entry_limit_evicts_the_least_recently_used_and_a_get_refreshes(
    nursery: trio.Nursery,
) -> None:
    with trio.fail_after(DEADLINE):
        store = await start_responses(nursery, StoreLimits(2, BIG, 0), FakeClock())
        await store.put(record("resp_1"))
        await store.put(record("resp_2"))
        assert await store.get("resp_1") is not None  # resp_1 is now the most recent
        await store.put(record("resp_3"))
        assert await store.get("resp_2") is None
        assert await held(store, ["resp_1", "resp_3"]) == ["resp_1", "resp_3"]
        await store.put(record("resp_4"))  # resp_1 was read before resp_3: it goes first
        assert await held(store, ["resp_1", "resp_3", "resp_4"]) == ["resp_3", "resp_4"]
        stats = store.statistics()
        assert (stats.entries, stats.evictions) == (2, 2)


async def test_byte_limit_evicts_until_the_budget_holds(nursery: trio.Nursery) -> None:
    size = serialized_size(record("resp_1").to_json())
    with trio.fail_after(DEADLINE):
        store = await start_responses(
            nursery, StoreLimits(100, 2 * size + size // 2, 0), FakeClock()
        )
        for i in (1, 2, 3):
            await store.put(record(f"resp_{i}"))
        assert await held(store, ["resp_1", "resp_2", "resp_3"]) == ["resp_2", "resp_3"]
        assert store.statistics().bytes == 2 * size
        # A response larger than the whole budget is not kept and evicts nothing.
        await store.put(record("resp_big", "x" * 3 * size))
        assert await store.get("resp_big") is None
        assert await held(store, ["resp_2", "resp_3"]) == ["resp_2", "resp_3"]
        assert store.statistics().rejections == 1


async def test_ttl_expires_from_the_put_and_a_get_does_not_extend_it(
    nursery: trio.Nursery,
) -> None:
    clock = FakeClock()
    with trio.fail_after(DEADLINE):
        store = await start_responses(nursery, StoreLimits(10, BIG, 60), clock)
        await store.put(record("resp_1"))
        clock.now += 30
        await store.put(record("resp_2"))
        clock.now += 29.9
        assert await held(store, ["resp_1", "resp_2"]) == ["resp_1", "resp_2"]
        clock.now += 0.1  # 60 s after resp_1 was stored
        assert await store.get("resp_1") is None
        assert await store.get("resp_2") is not None
        assert await store.delete("resp_1") is False
        clock.now += 30
        assert await store.get("resp_2") is None
        assert store.statistics().expirations == 2
        assert store.statistics().entries == 0


async def test_ttl_zero_never_expires(nursery: trio.Nursery) -> None:
    clock = FakeClock()
    with trio.fail_after(DEADLINE):
        store = await start_responses(nursery, StoreLimits(10, BIG, 0), clock)
        await store.put(record("resp_1"))
        clock.now += 10 * 365 * 86400
        assert await store.get("resp_1") is not None


async def test_max_bytes_zero_keeps_the_store_enabled_but_evicts_at_once(
    nursery: trio.Nursery,
) -> None:
    with trio.fail_after(DEADLINE):
        store = await start_responses(nursery, StoreLimits(10, 0, 3600), FakeClock())
        assert store.enabled
        await store.put(record("resp_1"))
        assert await store.get("resp_1") is None
        assert await store.delete("resp_1") is False
        assert store.statistics().entries == 0
        assert store.statistics().rejections == 1


async def test_max_entries_zero_disables_and_keeps_nothing(nursery: trio.Nursery) -> None:
    with trio.fail_after(DEADLINE):
        store = await start_responses(nursery, StoreLimits(0, BIG, 3600), FakeClock())
        assert not store.enabled
        await store.put(record("resp_1"))
        assert await store.get("resp_1") is None
        assert store.statistics().entries == 0


async def test_records_in_and_out_are_independent_copies(nursery: trio.Nursery) -> None:
    with trio.fail_after(DEADLINE):
        store = await start_responses(nursery, StoreLimits(10, BIG, 0), FakeClock())
        original = record("resp_1")
        await store.put(original)
        original.response["status"] = "mutated by the producer"
        first = await store.get("resp_1")
        assert first is not None
        first.response["output"][0]["content"][0]["text"] = "mutated by a reader"
        first.input_items[0]["content"] = "mutated"
        second = await store.get("resp_1")
        assert second is not None
        assert second == record("resp_1")
        assert second.response is not first.response


async def test_a_bad_record_fails_the_caller_and_the_actor_keeps_serving(
    nursery: trio.Nursery,
) -> None:
    with trio.fail_after(DEADLINE):
        store = await start_responses(nursery, StoreLimits(10, BIG, 0), FakeClock())
        with pytest.raises(TypeError):
            await store.put(StoredResponse({"id": "resp_bad", "when": {1, 2}}))
        await store.put(record("resp_1"))
        assert await store.get("resp_1") == record("resp_1")


# -- the conversation store ----------------------------------------------------------------------


async def test_conversations_evict_lru_and_any_request_refreshes(nursery: trio.Nursery) -> None:
    with trio.fail_after(DEADLINE):
        store = await start_conversations(nursery, StoreLimits(2, BIG, 0), FakeClock())
        a = await store.create({"name": "a"})
        b = await store.create({"name": "b"})
        assert await store.append(a.id, [user_item("msg_1")]) is not None  # a: most recent
        c = await store.create({"name": "c"})
        assert await store.get(b.id) is None
        found = await store.get(a.id)
        assert found is not None
        assert [item["id"] for item in found.items] == ["msg_1"]
        assert await store.get(c.id) is not None
        assert store.statistics().evictions == 1


async def test_conversation_ttl_restarts_at_every_write(nursery: trio.Nursery) -> None:
    clock = FakeClock()
    with trio.fail_after(DEADLINE):
        store = await start_conversations(nursery, StoreLimits(10, BIG, 100), clock)
        conv = await store.create({})
        clock.now += 90
        assert await store.append(conv.id, [user_item("msg_1")]) is not None
        clock.now += 90  # 180 s after create, 90 s after the append
        assert await store.get(conv.id) is not None
        clock.now += 10  # 100 s after the last write; the get above did not extend it
        assert await store.get(conv.id) is None
        assert await store.append(conv.id, [user_item("msg_2")]) is None
        assert store.statistics().expirations == 1


async def test_conversation_over_the_byte_budget_is_not_kept(nursery: trio.Nursery) -> None:
    with trio.fail_after(DEADLINE):
        store = await start_conversations(nursery, StoreLimits(10, 400, 0), FakeClock())
        conv = await store.create({"k": "v"}, [user_item("msg_1")])
        assert await store.get(conv.id) is not None
        # The append is answered, but the transcript no longer fits and is dropped whole.
        assert await store.append(conv.id, [user_item("msg_2", "x" * 400)]) is not None
        assert await store.get(conv.id) is None


async def test_conversation_limits_at_zero(nursery: trio.Nursery) -> None:
    with trio.fail_after(DEADLINE):
        no_bytes = await start_conversations(nursery, StoreLimits(10, 0, 3600), FakeClock())
        assert no_bytes.enabled
        conv = await no_bytes.create({"k": "v"})
        assert conv.id.startswith("conv_")
        assert await no_bytes.get(conv.id) is None
        disabled = await start_conversations(nursery, StoreLimits(0, BIG, 3600), FakeClock())
        assert not disabled.enabled
        conv = await disabled.create({})
        assert await disabled.get(conv.id) is None


async def test_conversation_copies_are_independent(nursery: trio.Nursery) -> None:
    with trio.fail_after(DEADLINE):
        store = await start_conversations(nursery, StoreLimits(10, BIG, 0), FakeClock())
        items = [user_item("msg_1")]
        conv = await store.create({"k": "v"}, items)
        items[0]["content"] = "mutated by the producer"
        conv.items[0]["content"] = "mutated by the creator"
        found = await store.get(conv.id)
        assert found is not None
        found.items[0]["content"] = "mutated by a reader"
        again = await store.get(conv.id)
        assert again is not None
        assert again.items[0]["content"] == "hi"
        assert again.metadata == {"k": "v"}


# -- one actor, every part -----------------------------------------------------------------------


class BrokenConversations(MemoryConversationStorage):
    def get(self, conversation_id: str) -> ConversationRecord | None:
        raise RuntimeError("conversations down")


async def test_one_actor_serves_every_part_and_each_reply_brings_its_statistics(
    nursery: trio.Nursery,
) -> None:
    limits = StoreLimits(10, BIG, 0)
    budgets = Budgets(limits, limits, FileLimits(), echo_bytes=BIG)
    backends = memory_backends(budgets, conversations=BrokenConversations(limits))
    with trio.fail_after(DEADLINE):
        store: Store = await nursery.start(run_store, budgets, backends)
        await store.responses.put(record("resp_1"))
        assert store.responses.statistics().entries == 1
        conv = await store.conversations.create({"k": "v"})
        assert store.conversations.statistics().entries == 1
        kept = await store.files.put(
            filename="a.txt", purpose="user_data", content_type="text/plain", data=b"hi"
        )
        assert kept is not None
        assert store.files.statistics().entries == 1
        reply = [
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "think"}]},
            {"type": "message", "content": [{"type": "output_text", "text": "answer"}]},
        ]
        await store.echo.remember("", reply)
        assert store.echo.statistics().entries == 1
        # A backend's failure reaches only its asker; every part is still served after it.
        with pytest.raises(RuntimeError, match="conversations down"):
            await store.conversations.get(conv.id)
        assert await store.responses.get("resp_1") == record("resp_1")
        assert await store.files.get(kept.id) == kept
        restored = await store.echo.restore("", [InputMessage("assistant", "answer")])
        assert restored == [Reasoning("think"), InputMessage("assistant", "answer")]
        # Each part's statistics are its own backend's, never another's.
        assert store.responses.statistics().entries == 1
        assert store.conversations.statistics().entries == 1


def test_a_reply_that_arrives_late_never_brings_older_statistics() -> None:
    send, _ = trio.open_memory_channel[object](1)
    part = StorePart(send)
    newer, older = StoreStatistics(entries=2), StoreStatistics(entries=1)
    part.observe(newer, 7)
    part.observe(older, 6)  # answered before, resumed after
    assert part.statistics() is newer
