"""Compaction end to end (issue 6): ``POST /v1/responses/compact``, replaying compaction items,
automatic compaction through ``context_management`` (foreground, streamed, background), and the
``context_length_exceeded`` refusals that change nothing.

The bundled model summarises poorly (it memorised a handful of chats): these tests check the
mechanics, with the summary bounded by ``max_output_tokens`` (or, for automatic compaction, by
1/16 of a small ``--ctx-size``) so that compaction shortens the context.
"""

from __future__ import annotations

from typing import Any

import httpx2 as httpx
import pytest
import trio
from openai import AsyncOpenAI
from openai.types.responses import CompactedResponse

from mlx_responses.cli import build_parser, settings_from_args
from mlx_responses.server import ServerHandle, serve
from tests.conformance import (
    assert_stream_invariants,
    assert_strict_compaction,
    assert_strict_response,
    parse_sse,
)

from .conftest import MODEL, START_DEADLINE, server_settings, until_terminal, wait_until

DEADLINE = 120


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def call(call_id: str, city: str) -> dict[str, Any]:
    arguments = f'{{"city": "{city}"}}'
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": "get_weather",
        "arguments": arguments,
    }


def result(call_id: str, text: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


COUNTED = " ".join(str(n) for n in range(1, 41))  # a long answer: about 110 tokens

HISTORY: list[dict[str, Any]] = [
    {"role": "developer", "content": "Answer briefly."},
    user("Count from 1 to 40."),
    assistant(COUNTED),
    user("Reply with: goodbye"),
    assistant("goodbye"),
    user("What is the weather in Paris and Rome?"),
    call("call_p", "Paris"),
    call("call_r", "Rome"),
    result("call_r", '{"temperature": 24, "condition": "clear"}'),
    result("call_p", '{"temperature": 18, "condition": "sunny"}'),
    assistant("Paris is sunny at 18 degrees, Rome clear at 24."),
    {"role": "system", "content": "Use metric units."},
    user("Say something short."),
]


async def start_server(nursery: trio.Nursery, **model: Any) -> ServerHandle:
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, server_settings(**model))
    return handle


@pytest.fixture
async def small(nursery: trio.Nursery) -> ServerHandle:
    """A 512-token window: automatic compaction keeps 32 tokens of turns and bounds the summary
    at 32 tokens, so it shortens the short histories these tests build."""
    return await start_server(nursery, context_size=512)


async def count(http: httpx.AsyncClient, body: dict[str, Any]) -> int:
    reply = await http.post("/v1/responses/input_tokens", json={"model": MODEL, **body})
    assert reply.status_code == 200, reply.text
    return int(reply.json()["input_tokens"])


async def compact(http: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await http.post("/v1/responses/compact", json={"model": MODEL, **body})


def text_of(item: dict[str, Any]) -> str:
    return "".join(part.get("text", "") for part in item.get("content") or [])


def call_ids(items: list[dict[str, Any]]) -> set[str]:
    return {item["call_id"] for item in items if "call_id" in item}


# --- POST /v1/responses/compact --------------------------------------------------------------


@pytest.mark.parametrize("keep_tokens", [40, 10_000])
async def test_compact_keeps_system_messages_and_whole_turns_and_replays_shorter(
    client: AsyncOpenAI, server: ServerHandle, keep_tokens: int
) -> None:
    stored = server.store.statistics().entries
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            raw = await client.responses.with_raw_response.compact(
                model=MODEL,
                input=HISTORY,  # type: ignore[arg-type]
                extra_body={"keep_tokens": keep_tokens, "max_output_tokens": 16},
            )
            data = raw.http_response.json()
            before = await count(http, {"input": HISTORY})
            after = await count(http, {"input": data["output"]})
            follow_up = {"input": [*data["output"], user("Reply with: hello")]}
            counted = await count(http, follow_up)
            reply = await http.post(
                "/v1/responses",
                json={"model": MODEL, "temperature": 0, "max_output_tokens": 8, **follow_up},
            )
            await server.model.wait_idle()  # nothing is left in the batch
    assert_strict_compaction(data)
    parsed = raw.parse()
    assert isinstance(parsed, CompactedResponse)
    assert parsed.object == "response.compaction"
    assert data["id"].startswith("cmpt_")
    assert data["model"] == MODEL
    output = data["output"]
    compaction = output[-1]
    assert compaction["type"] == "compaction"
    assert compaction["id"].startswith("cmp_")
    # The kept system and developer messages come first, in order.
    kept = [item for item in output if item.get("role") in ("system", "developer")]
    assert output[: len(kept)] == kept
    assert [text_of(item) for item in kept] == ["Answer briefly.", "Use metric units."]
    retained = output[len(kept) : -1]
    # The latest user message is kept; the tool group stays whole on one side.
    assert text_of(retained[0]) == "Say something short." or text_of(retained[-1]) == (
        "Say something short."
    )
    assert call_ids(retained) in (set(), {"call_p", "call_r"})
    if keep_tokens == 10_000:
        # Everything fits: only the oldest whole turn is summarized.
        assert [text_of(item) for item in retained[:2]] == ["Reply with: goodbye", "goodbye"]
        assert len(retained) == len(HISTORY) - 2 - 2
    assert 0 < data["usage"]["output_tokens"] <= 16
    assert data["usage"]["input_tokens"] > 0
    # Replaying the compaction output is shorter than the history it replaces.
    assert after < before
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["input_tokens"] == counted
    # Nothing was stored, nothing is left in the batch.
    assert server.store.statistics().entries == stored + 1  # only the follow-up response
    # (the generation thread publishes its snapshot just after the step that finished it)
    await wait_until(lambda: server.model.statistics().active == 0)


async def test_compact_a_previous_response_id_chain(
    client: AsyncOpenAI, server: ServerHandle
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            first = await client.responses.create(
                model=MODEL, input="Count from 1 to 110.", temperature=0, max_output_tokens=60
            )
            second = await client.responses.create(
                model=MODEL,
                input="Reply with: goodbye",
                previous_response_id=first.id,
                temperature=0,
                max_output_tokens=8,
            )
            stored = server.store.statistics().entries
            chained = await compact(
                http, previous_response_id=second.id, keep_tokens=1, max_output_tokens=8
            )
            with_input = await compact(
                http,
                previous_response_id=second.id,
                input="Say something short.",
                max_output_tokens=8,
            )
            alias = await http.post(
                "/responses/compact",
                json={"model": MODEL, "previous_response_id": second.id, "max_output_tokens": 8},
            )
            assert server.store.statistics().entries == stored
    for reply in (chained, with_input, alias):
        assert reply.status_code == 200, reply.text
        assert_strict_compaction(reply.json())
    retained = chained.json()["output"][:-1]
    assert len(retained) == 2  # the first turn is summarized, the second kept whole
    assert text_of(retained[0]) == "Reply with: goodbye"
    assert retained[1]["role"] == "assistant"
    assert text_of(with_input.json()["output"][-2]) == "Say something short."


async def test_compact_refusals(server: ServerHandle) -> None:
    body = {"model": MODEL, "input": HISTORY}
    cases: list[tuple[dict[str, Any], int, str | None]] = [
        ({"input": HISTORY}, 400, "model"),
        ({**body, "stream": True}, 400, "stream"),
        ({**body, "conversation": "conv_1"}, 400, "conversation"),
        ({**body, "keep_tokens": 0}, 400, "keep_tokens"),
        ({**body, "max_output_tokens": 0}, 400, "max_output_tokens"),
        ({**body, "max_output_tokens": 16385}, 400, "max_output_tokens"),
        ({**body, "temperature": 0}, 400, "temperature"),
        ({"model": MODEL}, 400, "input"),
        (
            {"model": MODEL, "input": [{"type": "compaction", "encrypted_content": "%"}]},
            400,
            "input[0].encrypted_content",
        ),
        ({**body, "model": "other"}, 404, "model"),
        (
            {"model": MODEL, "input": "x", "previous_response_id": "resp_nope"},
            400,
            "previous_response_id",
        ),
    ]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            replies = [await http.post("/v1/responses/compact", json=case) for case, _, _ in cases]
    for (case, status, param), reply in zip(cases, replies, strict=True):
        assert reply.status_code == status, (case, reply.text)
        assert reply.json()["error"]["param"] == param, (case, reply.text)
    assert server.store.statistics().entries == 0
    assert server.model.statistics().sequences_finished == 0


async def test_context_length_exceeded_cases_change_nothing(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, context_size=200)
    assert server.model.info.context_window == 200
    long_history = [user("Reply with: hello. " * 40)]
    no_room = [user("Reply with: hello. " * 12), assistant("hello " * 8), user("Reply with: bye")]
    too_short = [user("hi"), assistant("ok"), user("hello")]
    cases = [
        (long_history, "longer than the context window"),
        (no_room, "does not fit in the context window"),
        (too_short, "does not shorten the context"),
        ([user("hello")], "could not shorten the context"),
    ]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            assert await count(http, {"input": long_history}) > 200
            assert await count(http, {"input": no_room}) <= 200
            for history, says in cases:
                reply = await compact(http, input=history, max_output_tokens=64)
                automatic = await http.post(
                    "/v1/responses",
                    json={
                        "model": MODEL,
                        "input": history,
                        "context_management": [{"type": "compaction", "compact_threshold": 1}],
                    },
                )
                for answer in (reply, automatic):
                    assert answer.status_code == 400, answer.text
                    error = answer.json()["error"]
                    assert error["code"] == "context_length_exceeded"
                    assert error["type"] == "invalid_request_error"
                    assert error["param"] == "input"
                    assert says in error["message"], error["message"]
            await server.model.wait_idle()
    assert server.store.statistics().entries == 0
    assert server.model.statistics().active == 0


# --- replaying compaction items ---------------------------------------------------------------


async def test_a_malformed_compaction_item_is_a_400_naming_the_problem(
    server: ServerHandle,
) -> None:
    bad = [user("hi"), {"type": "compaction", "encrypted_content": "eyJ2IjoyfQ"}]  # {"v":2}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            created = await http.post("/v1/responses", json={"model": MODEL, "input": bad})
            counted = await http.post("/v1/responses/input_tokens", json={"input": bad})
    for reply in (created, counted):
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["param"] == "input[1].encrypted_content"
        assert "'items'" in error["message"]


# --- automatic compaction -----------------------------------------------------------------------


def managed(threshold: int) -> dict[str, Any]:
    return {"context_management": [{"type": "compaction", "compact_threshold": threshold}]}


async def test_context_management_values(server: ServerHandle) -> None:
    cases = [
        ({"type": "compaction", "compact_threshold": 0}, "context_management[0].compact_threshold"),
        (
            {"type": "compaction", "compact_threshold": 100_000_001},
            "context_management[0].compact_threshold",
        ),
        (
            {"type": "compaction", "compact_threshold": "9"},
            "context_management[0].compact_threshold",
        ),
        ({"type": "compaction"}, "context_management[0].compact_threshold"),
        ({"type": "truncate", "compact_threshold": 9}, "context_management[0].type"),
        ({"type": "compaction", "compact_threshold": 9, "x": 1}, "context_management[0].x"),
    ]
    bodies = [{"context_management": [entry]} for entry, _ in cases]
    bodies += [{"context_management": {"type": "compaction"}}, {"context_management": [{}, {}]}]
    params = [param for _, param in cases] + ["context_management", "context_management"]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            replies = [
                await http.post("/v1/responses", json={"model": MODEL, "input": "hi", **body})
                for body in bodies
            ]
            fine = await http.post(
                "/v1/responses",
                json={
                    "model": MODEL,
                    "input": "Reply with: hello",
                    "temperature": 0,
                    **managed(100_000_000),
                },
            )
            empty = await http.post(
                "/v1/responses",
                json={"model": MODEL, "input": "Reply with: hello", "context_management": []},
            )
    for param, reply in zip(params, replies, strict=True):
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == param
    # Below the threshold nothing is compacted.
    assert fine.status_code == 200, fine.text
    assert [item["type"] for item in fine.json()["output"]] == ["message"]
    assert empty.status_code == 200


async def test_a_chain_is_compacted_when_it_crosses_the_threshold_and_not_again_below_it(
    nursery: trio.Nursery,
) -> None:
    # A small window: compaction keeps 1/16 of it (32 tokens) and the summary is as bounded.
    server = await start_server(nursery, context_size=512)
    threshold = 200
    turns = ["Reply with: hello", "Reply with: goodbye", "Say something short."] * 8
    seen: list[tuple[int, dict[str, Any]]] = []
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            previous: str | None = None
            for text in turns:
                body: dict[str, Any] = {"input": text, **managed(threshold)}
                if previous is not None:
                    body["previous_response_id"] = previous
                counted = await count(http, body)
                reply = await http.post(
                    "/v1/responses",
                    json={"model": MODEL, "temperature": 0, "max_output_tokens": 12, **body},
                )
                assert reply.status_code == 200, reply.text
                data = reply.json()
                assert_strict_response(data)
                seen.append((counted, data))
                previous = data["id"]
                compacted_at = [i for i, (_, d) in enumerate(seen) if _compacted(d)]
                if len(compacted_at) == 2:  # compacted again later: over the earlier summary
                    break
            k = next(i for i, (_, d) in enumerate(seen) if _compacted(d))
            stored = (await http.get(f"/v1/responses/{seen[k][1]['id']}")).json()
    compacted_at = [i for i, (_, data) in enumerate(seen) if _compacted(data)]
    assert len(compacted_at) == 2, f"compacted at {compacted_at}: {[n for n, _ in seen]}"
    k = compacted_at[0]
    assert k >= 1
    # Compacted exactly when the rendered input reached the threshold.
    for counted, data in seen:
        assert _compacted(data) == (counted >= threshold), (counted, data["output"])
    counted_k, turn_k = seen[k]
    assert turn_k["output"][0]["type"] == "compaction"
    assert turn_k["output"][0]["id"].startswith("cmp_")
    assert turn_k["usage"]["input_tokens"] < counted_k
    assert stored == turn_k
    # The next hop replays the summary: below the threshold, so no compaction again.
    counted_next, turn_next = seen[k + 1]
    assert counted_next < threshold
    assert not _compacted(turn_next)
    assert turn_next["usage"]["input_tokens"] == counted_next
    assert counted_next < counted_k


def _compacted(data: dict[str, Any]) -> bool:
    return any(item["type"] == "compaction" for item in data["output"])


LONG_INPUT = [
    user("Count from 1 to 40."),
    assistant(COUNTED),
    user("Reply with: hello"),
    assistant("hello"),
    user("Reply with: goodbye"),
]


async def test_a_streamed_compaction_sends_both_events_in_order(small: ServerHandle) -> None:
    server = small
    body = {"model": MODEL, "input": LONG_INPUT, "temperature": 0, "max_output_tokens": 8}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            before = await count(http, {"input": LONG_INPUT})
            async with http.stream(
                "POST", "/v1/responses", json={**body, **managed(before), "stream": True}
            ) as reply:
                assert reply.status_code == 200
                raw = b"".join([chunk async for chunk in reply.aiter_bytes()])
            events = parse_sse(raw)
            final = assert_stream_invariants(events)
            stored = (await http.get(f"/v1/responses/{final['id']}")).json()
            client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
            async with (
                client,
                client.responses.stream(
                    model=MODEL,
                    input=LONG_INPUT,  # type: ignore[arg-type]
                    temperature=0,
                    max_output_tokens=8,
                    context_management=[{"type": "compaction", "compact_threshold": before}],
                ) as stream,
            ):
                # The SDK's helper passes our extension events through; the response ends
                # incomplete or completed, as the 8 output tokens allow.
                helper_events = [event async for event in stream]
    types = [data["type"] for _, data in events]
    assert types[:6] == [
        "response.created",
        "response.in_progress",
        "mlx.compaction.started",
        "mlx.compaction.completed",
        "response.output_item.added",
        "response.output_item.done",
    ]
    started, completed = events[2][1], events[3][1]
    assert started["input_tokens"] == completed["input_tokens_before"] == before
    assert completed["input_tokens_after"] == final["usage"]["input_tokens"] < before
    assert final["output"][0]["type"] == "compaction"
    assert stored == final
    helper_types = [event.type for event in helper_events]
    assert helper_types[2:4] == ["mlx.compaction.started", "mlx.compaction.completed"]
    last = helper_events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    assert last.response.output[0].type == "compaction"  # type: ignore[union-attr]


async def test_background_compaction_runs_in_the_job(small: ServerHandle) -> None:
    server = small
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            before = await count(http, {"input": LONG_INPUT})
            ok = await http.post(
                "/v1/responses",
                json={
                    "model": MODEL,
                    "input": LONG_INPUT,
                    "temperature": 0,
                    "max_output_tokens": 8,
                    "background": True,
                    **managed(before),
                },
            )
            # Nothing older than the latest user message: the compaction refuses, in the job.
            doomed = await http.post(
                "/v1/responses",
                json={"model": MODEL, "input": "hello", "background": True, **managed(1)},
            )
            assert ok.status_code == 200, ok.text
            assert doomed.status_code == 200, doomed.text
            assert doomed.json()["status"] == "queued"
            done = await until_terminal(http, ok.json()["id"])
            failed = await until_terminal(http, doomed.json()["id"])
            async with http.stream("GET", f"/v1/responses/{done['id']}?stream=true") as replay:
                done_events = parse_sse(b"".join([c async for c in replay.aiter_bytes()]))
            async with http.stream("GET", f"/v1/responses/{failed['id']}?stream=true") as replay:
                failed_events = parse_sse(b"".join([c async for c in replay.aiter_bytes()]))
            await server.model.wait_idle()
            await wait_until(lambda: server.responses.statistics().jobs_active == 0)
    assert_strict_response(done)
    assert done["status"] in ("completed", "incomplete")
    assert done["output"][0]["type"] == "compaction"
    assert done["usage"]["input_tokens"] < before
    assert assert_stream_invariants(done_events) == done
    assert_strict_response(failed)
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "invalid_prompt"
    assert "could not shorten" in failed["error"]["message"]
    assert failed["output"] == []
    assert assert_stream_invariants(failed_events) == failed
    assert server.model.statistics().active == 0
    assert server.responses.statistics().jobs_active == 0


async def test_conversation_turns_keep_the_compaction_item(small: ServerHandle) -> None:
    server = small
    client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
    async with client, httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            conversation = await client.conversations.create()
            body = {"model": MODEL, "temperature": 0, "max_output_tokens": 8}
            first = await http.post(
                "/v1/responses",
                json={**body, "input": LONG_INPUT, "conversation": conversation.id},
            )
            counted = await count(
                http, {"input": "Reply with: goodbye", "conversation": conversation.id}
            )
            second = await http.post(
                "/v1/responses",
                json={
                    **body,
                    "input": "Reply with: goodbye",
                    "conversation": conversation.id,
                    **managed(counted),
                },
            )
            third_count = await count(
                http, {"input": "Reply with: hello", "conversation": conversation.id}
            )
            items = await client.conversations.items.list(conversation.id, order="asc")
    assert first.status_code == second.status_code == 200
    assert second.json()["output"][0]["type"] == "compaction"
    assert "compaction" in [item.type for item in items.data]
    # The conversation now replays the summary instead of the turns it replaced.
    assert third_count < counted


def test_ctx_size_flag_and_environment() -> None:
    args = build_parser({"MLX_RESPONSES_CTX_SIZE": "300"}).parse_args(["serve"])
    assert settings_from_args(args).model.context_size == 300
    args = build_parser({"MLX_RESPONSES_CTX_SIZE": "300"}).parse_args(["serve", "--ctx-size", "99"])
    assert settings_from_args(args).model.context_size == 99
    assert settings_from_args(build_parser({}).parse_args(["serve"])).model.context_size is None
    with pytest.raises(SystemExit):
        settings_from_args(build_parser({}).parse_args(["serve", "--ctx-size", "0"]))


async def test_the_context_window_follows_ctx_size(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, context_size=40)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            reply = await http.post(
                "/v1/responses", json={"model": MODEL, "input": "Reply with: hello. " * 8}
            )
            fits = await http.post(
                "/v1/responses",
                json={"model": MODEL, "input": "Reply with: hello", "temperature": 0},
            )
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "context_length_exceeded"
    assert "40 tokens" in reply.json()["error"]["message"]
    assert fits.status_code == 200
    # Generation is capped at the room the prompt leaves in the window.
    usage = fits.json()["usage"]
    assert usage["input_tokens"] + usage["output_tokens"] <= 40


async def test_cancelling_a_background_job_while_it_compacts(nursery: trio.Nursery) -> None:
    # One prompt token per prefill step: the summary's prefill takes long enough to cancel in.
    server = await start_server(nursery, context_size=512, prefill_step_size=1)
    model = server.model
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            body = {"model": MODEL, "input": LONG_INPUT, "background": True, **managed(1)}
            created = (await http.post("/v1/responses", json=body)).json()
            # The summary sequence is prefilling: the job is still queued, compacting.
            await wait_until(lambda: model.statistics().prompt_tokens_processed > 0)
            assert (await http.get(f"/v1/responses/{created['id']}")).json()["status"] == "queued"
            cancelled = await http.post(f"/v1/responses/{created['id']}/cancel")
            await model.wait_idle()
            await wait_until(lambda: server.responses.statistics().jobs_active == 0)
            after = (await http.get(f"/v1/responses/{created['id']}")).json()
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert after["status"] == "cancelled"
    assert after["output"] == []
    assert_strict_response(after)
    stats = model.statistics()
    assert stats.sequences_cancelled == 1  # the summary left the batch
    assert stats.active == 0
    assert server.responses.statistics().jobs_active == 0


async def test_compacting_the_same_history_again_reports_cached_tokens(
    server: ServerHandle,
) -> None:
    """The summary's own prompt goes through the prompt cache: the second compaction of one
    history reuses the first one's prefill, and its usage says so (issue 12)."""
    body = {"model": MODEL, "input": HISTORY, "keep_tokens": 1, "max_output_tokens": 16}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            first = await http.post("/v1/responses/compact", json=body)
            second = await http.post("/v1/responses/compact", json=body)
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    one, two = first.json()["usage"], second.json()["usage"]
    assert_strict_compaction(first.json())
    assert_strict_compaction(second.json())
    assert one["input_tokens"] == two["input_tokens"] > 0
    assert 0 < two["input_tokens_details"]["cached_tokens"] < two["input_tokens"]
    assert first.json()["output"][-1]["type"] == second.json()["output"][-1]["type"]


async def test_a_client_that_leaves_while_its_history_compacts_frees_the_summary(
    nursery: trio.Nursery,
) -> None:
    """A streamed create whose history compacts first: the client hangs up while the summary
    is prefilling; the summary leaves the batch then, and nothing else is admitted."""
    # One prompt token per prefill step: the summary's prefill takes long enough to leave in.
    server = await start_server(nursery, context_size=512, prefill_step_size=1)
    model = server.model
    body = {"model": MODEL, "input": LONG_INPUT, "stream": True, **managed(1)}

    async def create(http: httpx.AsyncClient) -> None:
        async with http.stream("POST", "/v1/responses", json=body) as reply:
            async for _ in reply.aiter_bytes():
                pass

    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
            async with trio.open_nursery() as client:
                client.start_soon(create, http)
                await wait_until(lambda: model.statistics().prompt_tokens_processed > 0)
                client.cancel_scope.cancel()  # the client leaves, the summary half prefilled
        await model.wait_idle()
        await wait_until(lambda: server.responses.statistics().tasks == 0)
    stats = model.statistics()
    assert stats.sequences_cancelled == 1  # the summary left the batch
    assert stats.sequences_finished == 0  # it did not run on, nor did the response's own
    assert stats.active == 0
