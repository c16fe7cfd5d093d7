"""The prompt-prefix KV cache end to end: real model, real HTTP, every way a history returns.

Each test compares against a server that never saw the prefix (``prompt_cache_bytes=0``):
greedy text with a cache hit must equal greedy text cold.
"""

from __future__ import annotations

import dataclasses
from itertools import pairwise
from typing import Any

import anthropic
import httpx2 as httpx
import trio

from mlx_responses.http.auth import load_api_keys
from mlx_responses.server import ServerHandle, serve

from .conftest import MODEL, START_DEADLINE, output_text, server_settings

DEADLINE = 90
ALICE, BOB = "sk-alice", "sk-bob"
GREEDY = {"temperature": 0}
TURNS = ["Reply with: hello", "Reply with: goodbye", "Say something short.", "Say yes."]


async def start(nursery: trio.Nursery, keys: list[str] | None = None, **model: Any) -> ServerHandle:
    settings = server_settings(**model)
    if keys:
        settings = dataclasses.replace(settings, api_keys=load_api_keys(keys))
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    return handle


async def create(http: httpx.AsyncClient, key: str | None = None, **body: Any) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = {"model": MODEL, "temperature": 0, "max_output_tokens": 40, **body}
    reply = await http.post("/v1/responses", json=request, headers=headers)
    assert reply.status_code == 200, reply.text
    data: dict[str, Any] = reply.json()
    # Undocumented histories may run to max_output_tokens: still greedy, still comparable.
    assert data["status"] in ("completed", "incomplete"), data
    return data


def cached(data: dict[str, Any]) -> int:
    return int(data["usage"]["input_tokens_details"]["cached_tokens"])


async def replay_loop(
    http: httpx.AsyncClient, turns: list[str], key: str | None = None
) -> list[dict[str, Any]]:
    """A Codex-shaped loop: ``store: false``, the whole history resent every turn, the
    server's own previous outputs replayed as they came."""
    history: list[dict[str, Any]] = []
    responses = []
    for text in turns:
        history.append({"role": "user", "content": text})
        data = await create(http, key, input=history, store=False)
        history.extend(data["output"])
        responses.append(data)
    return responses


async def health(http: httpx.AsyncClient) -> dict[str, Any]:
    reply = await http.get("/health")
    stats: dict[str, Any] = reply.json()["prompt_cache"]
    return stats


async def test_a_store_false_replay_hits_and_answers_as_cold(nursery: trio.Nursery) -> None:
    warm = await start(nursery)
    cold = await start(nursery, prompt_cache_bytes=0)
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(base_url=warm.base_url, timeout=60) as http:
            hot = await replay_loop(http, TURNS)
            stats = await health(http)
        async with httpx.AsyncClient(base_url=cold.base_url, timeout=60) as http:
            fresh = await replay_loop(http, TURNS)
            cold_stats = await health(http)
    assert [output_text(r) for r in hot] == [output_text(r) for r in fresh]
    assert output_text(hot[1]) == "goodbye"  # the bundled model's documented multi-turn answer
    assert cached(hot[0]) == 0
    for previous, turn in pairwise(hot):
        # Reuse reaches at least the end of the previous prompt, every turn.
        assert cached(turn) >= previous["usage"]["input_tokens"]
        assert cached(turn) < turn["usage"]["input_tokens"]
    assert all(cached(r) == 0 for r in fresh)
    assert stats["enabled"]
    assert stats["hits"] >= len(TURNS) - 1
    assert stats["tokens_reused"] >= sum(cached(r) for r in hot)
    assert 0 < stats["bytes"] <= stats["max_bytes"]
    assert not cold_stats["enabled"]
    assert cold_stats["hits"] == 0


async def test_a_previous_response_id_chain_hits_and_the_stored_object_says_so(
    server: ServerHandle,
) -> None:
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
            first = await create(http, input=TURNS[0])
            second = await create(http, input=TURNS[1], previous_response_id=first["id"])
            stored = (await http.get(f"/v1/responses/{second['id']}")).json()
    assert output_text(second) == "goodbye"
    assert cached(second) >= first["usage"]["input_tokens"]
    assert stored["usage"] == second["usage"]


async def test_tenants_never_hit_each_others_prefixes(nursery: trio.Nursery) -> None:
    server = await start(nursery, keys=[ALICE, BOB])
    body = {"input": [{"role": "user", "content": "Name three colors."}], "store": False}
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
            alice_1 = await create(http, ALICE, **body)
            alice_2 = await create(http, ALICE, **body)
            bob_1 = await create(http, BOB, **body)
            bob_2 = await create(http, BOB, **body)
    assert cached(alice_1) == 0
    assert cached(alice_2) > 0
    # Bob sends the very prompt Alice has cached: a miss, then his own hit.
    assert cached(bob_1) == 0
    assert cached(bob_2) > 0
    texts = {output_text(r) for r in (alice_1, alice_2, bob_1, bob_2)}
    assert texts == {"Red, green and blue."}


async def test_a_tiny_budget_evicts_and_keeps_answering(nursery: trio.Nursery) -> None:
    # The bundled model holds 1 KiB of KV per token: this budget holds one short history at a time, and not the longest.
    budget = 50_000
    small = await start(nursery, prompt_cache_bytes=budget)
    cold = await start(nursery, prompt_cache_bytes=0)
    conversations = [TURNS[:3], ["Name three colors.", "Say yes.", "Reply with: hello"]]
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(base_url=small.base_url, timeout=60) as http:
            hot = [await replay_loop(http, turns) for turns in conversations * 2]
            stats = await health(http)
        async with httpx.AsyncClient(base_url=cold.base_url, timeout=60) as http:
            fresh = [await replay_loop(http, turns) for turns in conversations * 2]
    assert [[output_text(r) for r in c] for c in hot] == [
        [output_text(r) for r in c] for c in fresh
    ]
    assert stats["evictions"] > 0, stats
    assert stats["bytes"] <= budget
    assert stats["hits"] > 0, stats


async def test_four_interleaved_conversations_each_keep_their_hits(
    nursery: trio.Nursery,
) -> None:
    warm = await start(nursery)
    cold = await start(nursery, prompt_cache_bytes=0)
    # Four agents, each its own history, all running at once in one batch.
    loops = [TURNS[i:] + TURNS[:i] for i in range(4)]
    results: dict[int, list[dict[str, Any]]] = {}

    async def agent(http: httpx.AsyncClient, i: int) -> None:
        results[i] = await replay_loop(http, loops[i])

    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(base_url=warm.base_url, timeout=60) as http:
            async with trio.open_nursery() as agents:
                for i in range(4):
                    agents.start_soon(agent, http, i)
        hot = dict(results)
        async with httpx.AsyncClient(base_url=cold.base_url, timeout=60) as http:
            fresh = {i: await replay_loop(http, loops[i]) for i in range(4)}
    for i in range(4):
        assert [output_text(r) for r in hot[i]] == [output_text(r) for r in fresh[i]]
        for previous, turn in pairwise(hot[i]):
            assert cached(turn) >= previous["usage"]["input_tokens"]


async def test_messages_report_cache_reads(server: ServerHandle) -> None:
    client = anthropic.AsyncAnthropic(
        base_url=server.base_url, api_key="sk-local", max_retries=0, timeout=60
    )
    first_turn: list[Any] = [{"role": "user", "content": TURNS[0]}]
    with trio.fail_after(DEADLINE):
        async with client:
            first = await client.messages.create(
                model=MODEL, max_tokens=40, messages=first_turn, extra_body=GREEDY
            )
            reply = "".join(block.text for block in first.content if block.type == "text")
            second = await client.messages.create(
                model=MODEL,
                max_tokens=40,
                extra_body=GREEDY,
                messages=[
                    *first_turn,
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": TURNS[1]},
                ],
            )
    assert (first.usage.cache_read_input_tokens or 0) == 0
    reads = second.usage.cache_read_input_tokens or 0
    assert reads >= first.usage.input_tokens
    assert "".join(block.text for block in second.content if block.type == "text") == "goodbye"


async def test_a_streamed_message_start_reports_the_cache_read(server: ServerHandle) -> None:
    """Anthropic's SDK streaming a follow-up turn: ``message_start`` already carries the
    cache read and the split the final usage has (issue 12)."""
    client = anthropic.AsyncAnthropic(
        base_url=server.base_url, api_key="sk-local", max_retries=0, timeout=60
    )
    first_turn: list[Any] = [{"role": "user", "content": TURNS[0]}]

    async def streamed(messages: list[Any]) -> tuple[Any, Any, list[str]]:
        async with client.messages.stream(
            model=MODEL, max_tokens=40, messages=messages, extra_body=GREEDY
        ) as stream:
            kinds = []
            start = None
            async for event in stream:
                kinds.append(event.type)
                if event.type == "message_start":
                    start = event.message.usage
            final = await stream.get_final_message()
        return start, final, kinds

    with trio.fail_after(DEADLINE):
        async with client:
            start_1, first, kinds = await streamed(first_turn)
            reply = "".join(block.text for block in first.content if block.type == "text")
            history = [
                *first_turn,
                {"role": "assistant", "content": reply},
                {"role": "user", "content": TURNS[1]},
            ]
            start_2, second, _ = await streamed(history)
    assert kinds[0] == "message_start"
    assert start_1 is not None
    assert start_2 is not None
    assert (start_1.cache_read_input_tokens or 0) == 0
    assert start_1.input_tokens == first.usage.input_tokens
    # The hit is in message_start, and message_start's split is the final one.
    reads = start_2.cache_read_input_tokens or 0
    assert reads >= first.usage.input_tokens
    assert reads == second.usage.cache_read_input_tokens
    assert start_2.input_tokens == second.usage.input_tokens
    assert "".join(block.text for block in second.content if block.type == "text") == "goodbye"


async def test_prompt_cache_key_keeps_each_keys_latest_entry(nursery: trio.Nursery) -> None:
    """Two agents in one tenant, a tight byte budget: agent "a" runs three new conversations
    between agent "b"'s turns. Without prompt_cache_key plain LRU evicts b's entry and b's
    next turn re-prefills; with the keys, b's latest entry outlives a's older ones, so both
    agents keep their hits (and the text is the same either way)."""
    b_first = [{"role": "user", "content": TURNS[0]}]
    a_prompts = ["Name three colors.", "Say yes.", "Say something short."]

    async def traffic(http: httpx.AsyncClient, keyed: bool) -> list[dict[str, Any]]:
        def key(name: str) -> dict[str, Any]:
            return {"prompt_cache_key": name} if keyed else {}

        first = await create(http, input=b_first, store=False, **key("b"))
        done = [first]
        for text in a_prompts:
            done.append(
                await create(
                    http, input=[{"role": "user", "content": text}], store=False, **key("a")
                )
            )
        # a's latest conversation comes back: its entry is the most recent, it hits.
        a_last = [{"role": "user", "content": a_prompts[-1]}]
        done.append(await create(http, input=a_last, store=False, **key("a")))
        history = [*b_first, *first["output"], {"role": "user", "content": TURNS[1]}]
        done.append(await create(http, input=history, store=False, **key("b")))
        return done

    # Measure each entry's size on a roomy server, then leave room for b's entry and a's
    # last one plus half of another: a plain LRU must drop b's to fit a's second and third.
    probe = await start(nursery)
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(base_url=probe.base_url, timeout=60) as http:
            sizes = []
            before = 0
            for step in range(4):
                body = b_first if step == 0 else [{"role": "user", "content": a_prompts[step - 1]}]
                await create(http, input=body, store=False)
                now = (await health(http))["bytes"]
                sizes.append(now - before)
                before = now
    size_b, _, size_a2, size_a3 = sizes
    assert min(sizes) > 0
    budget = size_b + size_a3 + size_a2 // 2
    plain_server = await start(nursery, prompt_cache_bytes=budget)
    keyed_server = await start(nursery, prompt_cache_bytes=budget)
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(base_url=plain_server.base_url, timeout=60) as http:
            plain = await traffic(http, keyed=False)
            plain_stats = await health(http)
        async with httpx.AsyncClient(base_url=keyed_server.base_url, timeout=60) as http:
            keyed = await traffic(http, keyed=True)
            keyed_stats = await health(http)
    assert [output_text(r) for r in plain] == [output_text(r) for r in keyed]
    b_prompt = keyed[0]["usage"]["input_tokens"]
    assert cached(keyed[-1]) >= b_prompt  # b kept its entry
    assert cached(plain[-1]) < b_prompt  # without keys it was evicted (the template's
    # first tokens may still be shared with a's entries)
    for run in (plain, keyed):
        a_again = run[-2]
        assert cached(a_again) == a_again["usage"]["input_tokens"] - 1
    for stats in (plain_stats, keyed_stats):
        assert stats["evictions"] > 0, stats
        assert stats["bytes"] <= budget


async def test_a_stop_sequence_keeps_the_reply_for_the_next_turn(server: ServerHandle) -> None:
    """A stop *text* ends the sequence mid-batch: what it computed, reply included, is still
    stored, so the next turn reuses past the end of the first prompt (issue 12)."""
    first_turn = [{"role": "user", "content": "Count from 1 to 110."}]
    body = {"model": MODEL, "max_tokens": 1000, **GREEDY}
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
            one = await http.post(
                "/v1/messages", json={**body, "messages": first_turn, "stop_sequences": ["9 10"]}
            )
            assert one.status_code == 200, one.text
            first = one.json()
            reply = "".join(block["text"] for block in first["content"])
            history = [
                *first_turn,
                {"role": "assistant", "content": reply},
                {"role": "user", "content": TURNS[1]},
            ]
            two = await http.post("/v1/messages", json={**body, "messages": history})
            assert two.status_code == 200, two.text
            second = two.json()
    assert first["stop_reason"] == "stop_sequence"
    assert reply == "1 2 3 4 5 6 7 8 "
    # The first prompt and the reply's tokens up to where the replay re-tokenizes differently.
    assert second["usage"]["cache_read_input_tokens"] > first["usage"]["input_tokens"] + 4
