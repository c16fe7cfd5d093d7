"""``POST /v1/messages`` end to end: the official ``anthropic`` SDK against the real server.

Every body and every event is validated strictly with the SDK's pydantic types (see
``test_anthropic_protocol.py``); the bundled model's documented prompts give exact answers under
greedy decoding, so text, tool calls and thinking are asserted exactly. Hang-ups and stop
sequences are checked on the model's batch itself: the sequence leaves it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import anthropic
import httpx2 as httpx
import pytest
import trio
from openai import AsyncOpenAI

from mlx_responses.engine.bundled_model import BundledPrompt, load_bundled_prompts
from mlx_responses.http import messages as messages_routes
from mlx_responses.http.auth import load_api_keys
from mlx_responses.server import ServerHandle, serve
from tests.conformance import parse_sse

from .conftest import (
    MODEL,
    START_DEADLINE,
    assert_nothing_more_generated,
    output_text,
    server_settings,
    split_reasoning,
    wait_until,
)
from .faults import ThreadFaults
from .rawhttp import open_stream, read_until
from .test_anthropic_protocol import (
    assert_message_stream,
    assert_strict_error,
    assert_strict_message,
    same_message,
)

DEADLINE = 90
GREEDY = {"temperature": 0}
KEY = "sk-anthropic"


def prompt(name: str) -> BundledPrompt:
    return next(p for p in load_bundled_prompts() if p.name == name)


def anthropic_tools(p: BundledPrompt) -> list[dict[str, Any]]:
    """A documented prompt's chat-completions tools, as Anthropic client tools."""
    return [
        {
            "name": tool["function"]["name"],
            "description": tool["function"]["description"],
            "input_schema": tool["function"]["parameters"],
        }
        for tool in p.tools or []
    ]


def user_text(p: BundledPrompt) -> str:
    return str(p.messages[-1]["content"])


def ask(name: str, **fields: Any) -> dict[str, Any]:
    """A greedy Messages body for a one-message documented prompt."""
    p = prompt(name)
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 1000,
        "messages": [{"role": "user", "content": user_text(p)}],
        **GREEDY,
        **fields,
    }
    if p.tools:
        body["tools"] = anthropic_tools(p)
    return body


def sdk(server: ServerHandle, **options: Any) -> anthropic.AsyncAnthropic:
    options.setdefault("api_key", "sk-local")
    return anthropic.AsyncAnthropic(base_url=server.base_url, max_retries=0, timeout=60, **options)


async def post(http: httpx.AsyncClient, body: Any, path: str = "/v1/messages") -> httpx.Response:
    return await http.post(path, json=body)


async def post_stream(
    http: httpx.AsyncClient, body: dict[str, Any], path: str = "/v1/messages"
) -> list[tuple[str, dict[str, Any]]]:
    async with http.stream("POST", path, json={**body, "stream": True}) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        raw = b"".join([chunk async for chunk in reply.aiter_bytes()])
    return parse_sse(raw)


def blocks(message: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [block for block in message["content"] if block["type"] == kind]


def text_of(message: dict[str, Any]) -> str:
    return "".join(block["text"] for block in blocks(message, "text"))


@pytest.fixture
async def http(server: ServerHandle) -> Any:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        yield client


# --- answers ---------------------------------------------------------------------------------


async def test_a_plain_message_with_the_sdk(server: ServerHandle) -> None:
    p = prompt("hello")
    async with sdk(server) as client:
        with trio.fail_after(DEADLINE):
            raw = await client.messages.with_raw_response.create(
                model=MODEL,
                max_tokens=64,
                messages=[{"role": "user", "content": user_text(p)}],
                extra_body=GREEDY,
            )
            count = await client.messages.count_tokens(
                model=MODEL, messages=[{"role": "user", "content": user_text(p)}]
            )
    data = json.loads(raw.http_response.content)
    message = assert_strict_message(data)
    assert (await raw.parse()).id == message.id
    assert message.content[0].type == "text"
    assert message.content[0].text == p.expected
    assert (message.stop_reason, message.stop_sequence, message.model) == ("end_turn", None, MODEL)
    assert message.usage.output_tokens in (p.expected_tokens, p.expected_tokens + 1)  # +EOS?
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == (
        count.input_tokens
    )
    with trio.fail_after(DEADLINE):
        await server.model.wait_idle()


async def test_a_streamed_message_with_the_sdk_helper(server: ServerHandle) -> None:
    p = prompt("count")
    deltas: list[str] = []
    async with sdk(server) as client:
        with trio.fail_after(DEADLINE):
            async with client.messages.stream(
                model=MODEL,
                max_tokens=1000,
                messages=[{"role": "user", "content": user_text(p)}],
                extra_body=GREEDY,
            ) as stream:
                async for event in stream:
                    if event.type == "content_block_delta" and event.delta.type == "text_delta":
                        deltas.append(event.delta.text)
                final = await stream.get_final_message()
    assert len(deltas) > 1
    assert "".join(deltas) == final.content[0].text == p.expected  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"
    assert_strict_message(final.model_dump(mode="json", exclude_none=True))


async def test_raw_stream_is_strictly_anthropic_and_equals_the_message(
    http: httpx.AsyncClient,
) -> None:
    with trio.fail_after(DEADLINE):
        events = await post_stream(http, ask("count"))
        whole = (await post(http, ask("count"))).json()
    streamed, error = assert_message_stream(events)
    assert error is None
    assert streamed is not None
    assert [name for name, _ in events[:2]] == ["message_start", "ping"]
    # message_start goes out once the prompt cache was consulted: its split is the stream's
    # final one; the totals agree with the second request's (which may read the first's prefix).
    start, final = events[0][1]["message"]["usage"], whole["usage"]
    assert start["input_tokens"] == streamed["usage"]["input_tokens"]
    assert start["cache_read_input_tokens"] == streamed["usage"]["cache_read_input_tokens"]
    assert start["input_tokens"] + start["cache_read_input_tokens"] == (
        final["input_tokens"] + final["cache_read_input_tokens"]
    )
    assert_strict_message(whole)
    assert same_message({**streamed, "id": whole["id"]}, whole)
    assert text_of(whole) == prompt("count").expected


async def test_thinking_blocks_carry_the_models_reasoning(http: httpx.AsyncClient) -> None:
    reasoning, answer = split_reasoning(prompt("think").expected)
    with trio.fail_after(DEADLINE):
        whole = (await post(http, ask("think"))).json()
        events = await post_stream(http, ask("think"))
        omitted = (
            await post(
                http,
                ask(
                    "think",
                    max_tokens=2048,
                    thinking={"type": "enabled", "budget_tokens": 1024, "display": "omitted"},
                ),
            )
        ).json()
    message = assert_strict_message(whole)
    assert [block.type for block in message.content] == ["thinking", "text"]
    (thinking,) = blocks(whole, "thinking")
    assert thinking["thinking"] == reasoning
    assert thinking["signature"]
    assert text_of(whole) == answer
    assert message.usage.output_tokens_details is not None
    assert 0 < message.usage.output_tokens_details.thinking_tokens < message.usage.output_tokens
    streamed, _ = assert_message_stream(events)
    assert streamed is not None
    assert same_message({**streamed, "id": whole["id"]}, whole)
    assert any(
        data["delta"]["type"] == "thinking_delta"
        for name, data in events
        if name == "content_block_delta"
    )
    assert_strict_message(omitted)
    assert blocks(omitted, "thinking")[0]["thinking"] == ""
    assert blocks(omitted, "thinking")[0]["signature"] == thinking["signature"]
    assert text_of(omitted) == answer


async def test_thinking_disabled_reaches_the_chat_template(server: ServerHandle) -> None:
    messages: Any = [{"role": "user", "content": user_text(prompt("think"))}]
    async with sdk(server) as client:
        with trio.fail_after(DEADLINE):
            default = await client.messages.count_tokens(model=MODEL, messages=messages)
            disabled = await client.messages.count_tokens(
                model=MODEL, messages=messages, thinking={"type": "disabled"}
            )
    # The template closes an empty think block when enable_thinking is false.
    assert disabled.input_tokens > default.input_tokens


async def test_a_tool_round_trip_with_the_sdk(server: ServerHandle) -> None:
    call, result = prompt("tool_call"), prompt("tool_result")
    tools: Any = anthropic_tools(call)
    question: Any = {"role": "user", "content": user_text(call)}
    async with sdk(server) as client:
        with trio.fail_after(DEADLINE):
            first = await client.messages.create(
                model=MODEL, max_tokens=200, tools=tools, messages=[question], extra_body=GREEDY
            )
            (use,) = first.content
            assert use.type == "tool_use"
            output = result.messages[-1]["content"]
            history: Any = [
                question,
                {"role": "assistant", "content": first.content},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use.id, "content": output}],
                },
            ]
            async with client.messages.stream(
                model=MODEL, max_tokens=200, tools=tools, messages=history, extra_body=GREEDY
            ) as stream:
                second = await stream.get_final_message()
            count = await client.messages.count_tokens(model=MODEL, tools=tools, messages=history)
    assert_strict_message(first.model_dump(mode="json", exclude_none=True))
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    assert first.stop_reason == "tool_use"
    assert second.content[0].type == "text"
    assert second.content[0].text == result.expected
    assert second.stop_reason == "end_turn"
    assert second.usage.input_tokens + (second.usage.cache_read_input_tokens or 0) == (
        count.input_tokens
    )


async def test_a_streamed_tool_call_sends_its_input_as_json_deltas(
    http: httpx.AsyncClient,
) -> None:
    with trio.fail_after(DEADLINE):
        events = await post_stream(http, ask("tool_call", tool_choice={"type": "any"}))
    message, _ = assert_message_stream(events)
    assert message is not None
    (use,) = blocks(message, "tool_use")
    partial = "".join(
        data["delta"]["partial_json"]
        for name, data in events
        if name == "content_block_delta" and data["delta"]["type"] == "input_json_delta"
    )
    assert json.loads(partial) == use["input"] == {"city": "Paris"}
    assert message["stop_reason"] == "tool_use"


async def test_count_tokens_equals_the_usage_of_the_same_request(http: httpx.AsyncClient) -> None:
    for name in ("hello", "think", "tool_call"):
        body = ask(name, system="You are terse.")
        counted = {k: v for k, v in body.items() if k not in ("max_tokens", "temperature")}
        with trio.fail_after(DEADLINE):
            count = await post(http, counted, "/v1/messages/count_tokens")
            answer = (await post(http, body)).json()
        assert count.status_code == 200
        assert count.json().keys() == {"input_tokens"}
        usage = answer["usage"]
        total = usage["input_tokens"] + usage["cache_read_input_tokens"]
        assert count.json()["input_tokens"] == total, name


async def test_responses_and_messages_give_the_same_text(
    http: httpx.AsyncClient, client: AsyncOpenAI
) -> None:
    names = [p.name for p in load_bundled_prompts() if len(p.messages) == 1 and not p.tools]
    assert len(names) >= 5
    for name in names:
        p = prompt(name)
        with trio.fail_after(DEADLINE):
            response = await client.responses.create(
                model=MODEL, input=user_text(p), temperature=0, max_output_tokens=1000
            )
            message = (await post(http, ask(name))).json()
        reasoning = [
            part.text
            for item in response.output
            if item.type == "reasoning"
            for part in item.content or []
        ]
        assert text_of(message) == output_text(response.model_dump()) != "", name
        assert response.usage is not None
        assert message["usage"]["output_tokens"] == response.usage.output_tokens, name
        assert [b["thinking"] for b in blocks(message, "thinking")] == reasoning, name


async def test_the_route_without_v1_and_anthropic_headers(http: httpx.AsyncClient) -> None:
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "x", "x-api-key": "any"}
    with trio.fail_after(DEADLINE):
        reply = await http.post("/messages", json=ask("hello"), headers=headers)
        count = await http.post(
            "/messages/count_tokens",
            json={"model": MODEL, "messages": ask("hello")["messages"]},
            headers=headers,
        )
    assert reply.status_code == 200
    assert text_of(reply.json()) == prompt("hello").expected
    assert count.status_code == 200


# --- ends: max_tokens, stop sequences, hang-ups, failures ---------------------------------


async def test_max_tokens_ends_with_stop_reason_max_tokens(http: httpx.AsyncClient) -> None:
    with trio.fail_after(DEADLINE):
        whole = (await post(http, ask("count", max_tokens=7))).json()
        events = await post_stream(http, ask("count", max_tokens=7))
    assert_strict_message(whole)
    assert whole["stop_reason"] == "max_tokens"
    assert whole["usage"]["output_tokens"] == 7
    streamed, _ = assert_message_stream(events)
    assert streamed is not None
    assert same_message({**streamed, "id": whole["id"]}, whole)


async def test_max_tokens_zero_counts_and_generates_nothing(
    server: ServerHandle, http: httpx.AsyncClient
) -> None:
    with trio.fail_after(DEADLINE):
        whole = (await post(http, ask("hello", max_tokens=0))).json()
        events = await post_stream(http, ask("hello", max_tokens=0))
        count = await post(
            http,
            {"model": MODEL, "messages": ask("hello")["messages"]},
            "/v1/messages/count_tokens",
        )
    assert_strict_message(whole)
    assert (whole["content"], whole["stop_reason"]) == ([], "max_tokens")
    assert whole["usage"]["input_tokens"] == count.json()["input_tokens"]
    assert whole["usage"]["output_tokens"] == 0
    assert assert_message_stream(events)[0] is not None
    assert server.model.statistics().tokens_generated == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_a_stop_sequence_ends_the_message_and_frees_the_batch(
    server: ServerHandle, http: httpx.AsyncClient, stream: bool
) -> None:
    body = ask("count", stop_sequences=["5 6", "zzz"], max_tokens=1000)
    with trio.fail_after(DEADLINE):
        if stream:
            message, _ = assert_message_stream(await post_stream(http, body))
        else:
            message = (await post(http, body)).json()
            assert_strict_message(message)
        await server.model.wait_idle()
    assert message is not None
    assert text_of(message) == "1 2 3 4 "
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "5 6")
    stats = server.model.statistics()
    # Left the batch at the stop sequence instead of counting to 110, as a stop, not a cancel.
    assert (stats.sequences_finished, stats.sequences_cancelled) == (1, 0)
    assert 0 < message["usage"]["output_tokens"] < prompt("count").expected_tokens


async def test_a_hang_up_mid_stream_removes_the_sequence_from_the_batch(
    server: ServerHandle,
) -> None:
    model = server.model
    with trio.fail_after(DEADLINE):
        async with await open_stream(
            server.base_url, "/v1/messages", ask("count", stream=True)
        ) as s:
            await read_until(s, b"event: content_block_delta", count=3)
            assert model.statistics().active == 1
        await model.wait_idle()
    stats = model.statistics()
    assert (stats.sequences_cancelled, stats.sequences_finished) == (1, 0)
    await assert_nothing_more_generated(server, stats.tokens_generated)


async def test_a_hang_up_before_a_whole_answer_removes_the_sequence(server: ServerHandle) -> None:
    model = server.model
    with trio.fail_after(DEADLINE):
        async with await open_stream(server.base_url, "/v1/messages", ask("count")):
            await wait_until(lambda: model.statistics().tokens_generated > 0)
        await model.wait_idle()
    stats = model.statistics()
    assert (stats.sequences_cancelled, stats.sequences_finished) == (1, 0)


async def test_pings_keep_an_idle_stream_alive(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(messages_routes, "PING_INTERVAL_SECONDS", 0.0005)
    with trio.fail_after(DEADLINE):
        events = await post_stream(http, ask("count"))
    message, _ = assert_message_stream(events)
    assert message is not None
    assert text_of(message) == prompt("count").expected
    assert [name for name, _ in events].count("ping") > 1


async def test_a_model_failure_mid_stream_is_one_error_event(
    server: ServerHandle, faults: ThreadFaults
) -> None:
    with trio.fail_after(DEADLINE):
        async with await open_stream(
            server.base_url, "/v1/messages", ask("count", stream=True)
        ) as s:
            seen = await read_until(s, b"event: content_block_delta", count=2)
            faults.crash()
            while b"event: error" not in seen and b"event: message_stop" not in seen:
                chunk = await s.receive_some(65536)
                assert chunk, "closed before a terminal event"
                seen += chunk
            # The body ends after the terminal; read the chunked terminator.
            while not seen.endswith(b"0\r\n\r\n"):
                seen += await s.receive_some(65536)
        await wait_until(lambda: server.model.statistics().active == 0)
    body = seen.split(b"\r\n\r\n", 1)[1]
    chunks = b""
    while body and not body.startswith(b"0\r\n"):
        size, _, rest = body.partition(b"\r\n")
        length = int(size, 16)
        chunks, body = chunks + rest[:length], rest[length + 2 :]
    message, error = assert_message_stream(parse_sse(chunks))
    assert message is None
    assert error is not None
    assert error["error"]["type"] == "api_error"


# --- errors in Anthropic's envelope ----------------------------------------------------------


def assert_anthropic_error(reply: httpx.Response, status: int, kind: str) -> str:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    error = assert_strict_error(reply.json())
    assert error.error.type == kind
    return error.error.message


async def test_refusals_are_anthropic_errors_with_anthropic_statuses(
    server: ServerHandle, http: httpx.AsyncClient
) -> None:
    with trio.fail_after(DEADLINE):
        message = assert_anthropic_error(
            await post(http, {**ask("hello"), "max_tokens": "9"}), 400, "invalid_request_error"
        )
        assert message.startswith("max_tokens:")
        assert_anthropic_error(
            await http.post("/v1/messages", content=b"{nope"), 400, "invalid_request_error"
        )
        streamed = await post(http, {**ask("hello"), "model": "claude-x", "stream": True})
        message = assert_anthropic_error(streamed, 404, "not_found_error")
        assert "claude-x" in message
        assert_anthropic_error(
            await post(
                http,
                {"model": "claude-x", "messages": [{"role": "user", "content": "x"}]},
                "/v1/messages/count_tokens",
            ),
            404,
            "not_found_error",
        )
        assert_anthropic_error(await http.get("/v1/messages/nope"), 404, "not_found_error")
        assert_anthropic_error(await http.get("/v1/messages"), 405, "invalid_request_error")
    assert server.model.statistics().sequences_finished == 0


async def test_the_sdk_raises_its_own_error_classes(server: ServerHandle) -> None:
    async with sdk(server) as client:
        with trio.fail_after(DEADLINE):
            with pytest.raises(anthropic.NotFoundError) as missing:
                await client.messages.create(
                    model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "x"}]
                )
            with pytest.raises(anthropic.BadRequestError) as bad:
                await client.messages.create(
                    model=MODEL, max_tokens=5, messages=[{"role": "assistant", "content": "x"}]
                )
    assert missing.value.status_code == 404
    assert "prefill" in bad.value.message


async def test_keys_body_limit_and_overload(nursery: trio.Nursery) -> None:
    """401 (``x-api-key``, as on Anthropic), 413 and 529 on a keyed server that admits nothing."""
    settings = dataclasses.replace(
        server_settings(max_sequences=0), api_keys=load_api_keys([KEY]), max_request_bytes=4000
    )
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, settings)
    keyed = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    counted = {"model": MODEL, "messages": ask("hello")["messages"]}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            for headers in ({}, {"x-api-key": "sk-wrong"}):
                for path, body in (
                    ("/v1/messages", ask("hello")),
                    ("/messages/count_tokens", counted),
                ):
                    reply = await http.post(path, json=body, headers=headers)
                    assert_anthropic_error(reply, 401, "authentication_error")
            big = {**ask("hello"), "system": "x" * 5000}
            reply = await http.post("/v1/messages", json=big, headers=keyed)
            assert_anthropic_error(reply, 413, "invalid_request_error")
            count = await http.post("/v1/messages/count_tokens", json=counted, headers=keyed)
            assert count.status_code == 200
            for stream in (False, True):
                reply = await http.post(
                    "/v1/messages", json=ask("hello", stream=stream), headers=keyed
                )
                assert_anthropic_error(reply, 529, "overloaded_error")
    async with sdk(server, api_key=KEY) as client, sdk(server, api_key="sk-wrong") as stranger:
        with trio.fail_after(DEADLINE):
            with pytest.raises(anthropic.OverloadedError):
                await client.messages.create(**_HELLO)
            with pytest.raises(anthropic.AuthenticationError):
                await stranger.messages.create(**_HELLO)
            assert (
                await client.messages.count_tokens(model=MODEL, messages=_HELLO["messages"])
            ).input_tokens > 0
    assert server.model.statistics().tokens_generated == 0


_HELLO: Any = {
    "model": MODEL,
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "Reply with: hello"}],
}
